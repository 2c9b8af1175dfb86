// SPDX-License-Identifier: MIT
// tests/compile/tensor_traits.cpp: compile-only checks (building this file is the test) for
// const-correctness, convertibility and triviality of views and tensors.
#include <cstddef>
#include <type_traits>
#include <utility>

#include "attn/attn.hpp"
#include "attn/detail/eigen_core.hpp"  // Eigen after attn/config.hpp (GCC 12 AVX-512 warnings)

namespace attn::compile_test {
namespace {

template <class Scalar, std::size_t Rank>
using View = TensorView<Scalar, Rank>;

// ---- Index ----

static_assert(std::is_same_v<Index, Eigen::Index>, "attn::Index is Eigen::Index");
static_assert(std::is_signed_v<Index>, "attn::Index is signed");
static_assert(std::is_same_v<Shape<3>, std::array<Index, 3>>, "Shape<3> is std::array<Index, 3>");

// ---- const-correctness of views ----

template <class Scalar>
constexpr bool check_const_conversions() {
  using Mutable = View<Scalar, 3>;
  using ReadOnly = View<const Scalar, 3>;
  // Mutable -> read-only is implicit.
  static_assert(std::is_convertible_v<Mutable, ReadOnly>);
  static_assert(std::is_nothrow_constructible_v<ReadOnly, Mutable>);
  static_assert(std::is_assignable_v<ReadOnly&, Mutable>);
  // Never the reverse, not even explicitly.
  static_assert(!std::is_convertible_v<ReadOnly, Mutable>);
  static_assert(!std::is_constructible_v<Mutable, ReadOnly>);
  static_assert(!std::is_assignable_v<Mutable&, ReadOnly>);
  // No conversions across ranks or element types.
  static_assert(!std::is_convertible_v<View<Scalar, 2>, View<Scalar, 3>>);
  static_assert(!std::is_constructible_v<View<Scalar, 2>, View<Scalar, 3>>);
  static_assert(!std::is_convertible_v<View<float, 2>, View<const double, 2>>);
  static_assert(!std::is_constructible_v<View<double, 2>, View<float, 2>>);

  // A read-only view hands out const elements and const data.
  static_assert(std::is_same_v<decltype(std::declval<ReadOnly>()(0, 0, 0)), const Scalar&>);
  static_assert(std::is_same_v<decltype(std::declval<ReadOnly>().at(0, 0, 0)), const Scalar&>);
  static_assert(std::is_same_v<decltype(std::declval<ReadOnly>().data()), const Scalar*>);
  static_assert(!std::is_assignable_v<decltype(std::declval<ReadOnly>()(0, 0, 0)), Scalar>);
  // A const mutable view is still mutable (shallow const, like std::span).
  static_assert(std::is_same_v<decltype(std::declval<const Mutable&>()(0, 0, 0)), Scalar&>);
  static_assert(std::is_same_v<decltype(std::declval<const Mutable&>().data()), Scalar*>);

  // View ops keep constness.
  static_assert(std::is_same_v<decltype(slice(std::declval<ReadOnly>(), 0, 0, 1)), ReadOnly>);
  static_assert(
      std::is_same_v<decltype(select(std::declval<ReadOnly>(), 0, 0)), View<const Scalar, 2>>);
  static_assert(std::is_same_v<decltype(transpose(std::declval<ReadOnly>(), 0, 1)), ReadOnly>);
  static_assert(
      std::is_same_v<decltype(unsqueeze(std::declval<ReadOnly>(), 0)), View<const Scalar, 4>>);
  static_assert(std::is_same_v<decltype(reshape(std::declval<ReadOnly>(), Shape<2>{-1, 1})),
                               View<const Scalar, 2>>);
  static_assert(
      std::is_same_v<decltype(split_heads(std::declval<ReadOnly>(), 1)), View<const Scalar, 4>>);
  static_assert(
      std::is_same_v<decltype(merge_heads(std::declval<View<const Scalar, 4>>())), ReadOnly>);
  static_assert(std::is_same_v<decltype(contiguous(std::declval<ReadOnly>())), Tensor<Scalar, 3>>);
  return true;
}
static_assert(check_const_conversions<float>());
static_assert(check_const_conversions<double>());

// ---- views are cheap values ----

template <class Scalar, std::size_t Rank>
constexpr bool check_view_is_a_value() {
  using V = View<Scalar, Rank>;
  static_assert(std::is_trivially_copyable_v<V>);
  static_assert(std::is_trivially_destructible_v<V>);
  static_assert(std::is_nothrow_default_constructible_v<V>);
  static_assert(std::is_nothrow_copy_constructible_v<V>);
  static_assert(sizeof(V) == sizeof(Scalar*) + 2 * Rank * sizeof(Index));
  static_assert(V::rank() == Rank);
  return true;
}
static_assert(check_view_is_a_value<float, 1>());
static_assert(check_view_is_a_value<const float, 3>());
static_assert(check_view_is_a_value<double, 4>());
static_assert(check_view_is_a_value<const bool, 4>());

// ---- Tensor -> view conversions ----

template <class Scalar>
constexpr bool check_tensor_conversions() {
  using T = Tensor<Scalar, 2>;
  static_assert(std::is_convertible_v<T&, View<Scalar, 2>>);
  static_assert(std::is_convertible_v<T&, View<const Scalar, 2>>);
  static_assert(std::is_convertible_v<const T&, View<const Scalar, 2>>);
  // A const tensor never yields a mutable view.
  static_assert(!std::is_convertible_v<const T&, View<Scalar, 2>>);
  static_assert(std::is_same_v<decltype(std::declval<const T&>().view()), View<const Scalar, 2>>);
  static_assert(std::is_same_v<decltype(std::declval<T&>().view()), View<Scalar, 2>>);
  static_assert(std::is_same_v<decltype(std::declval<const T&>().data()), const Scalar*>);
  static_assert(std::is_same_v<decltype(std::declval<const T&>()(0, 0)), const Scalar&>);
  static_assert(!std::is_convertible_v<T&, View<Scalar, 3>>);
  // Building a tensor from a view is explicit (it copies).
  static_assert(std::is_constructible_v<T, View<const Scalar, 2>>);
  static_assert(!std::is_convertible_v<View<const Scalar, 2>, T>);
  // Tensors copy deeply and move cheaply.
  static_assert(std::is_copy_constructible_v<T> && std::is_copy_assignable_v<T>);
  static_assert(std::is_nothrow_move_constructible_v<T> && std::is_nothrow_move_assignable_v<T>);
  static_assert(T::rank() == 2);
  return true;
}
static_assert(check_tensor_conversions<float>());
static_assert(check_tensor_conversions<double>());

// ---- the Eigen bridge is const-correct and row-major ----

template <class Scalar>
constexpr bool check_eigen_bridge() {
  using ConstMap = decltype(as_matrix(std::declval<View<const Scalar, 2>>()));
  using MutableMap = decltype(as_matrix(std::declval<View<Scalar, 2>>()));
  static_assert(
      std::is_same_v<ConstMap,
                     Eigen::Map<const RowMatrix<Scalar>, Eigen::Unaligned, Eigen::OuterStride<>>>);
  static_assert(
      std::is_same_v<MutableMap,
                     Eigen::Map<RowMatrix<Scalar>, Eigen::Unaligned, Eigen::OuterStride<>>>);
  static_assert(!std::is_assignable_v<decltype(std::declval<ConstMap&>()(0, 0)), Scalar>);
  static_assert(std::is_assignable_v<decltype(std::declval<MutableMap&>()(0, 0)), Scalar>);
  static_assert(RowMatrix<Scalar>::IsRowMajor);
  static_assert(
      std::is_same_v<decltype(as_matrix(std::declval<const Tensor<Scalar, 2>&>())), ConstMap>);
  static_assert(
      !std::is_assignable_v<decltype(as_vector(std::declval<View<const Scalar, 1>>())(0)), Scalar>);
  return true;
}
static_assert(check_eigen_bridge<float>());
static_assert(check_eigen_bridge<double>());

// ---- modules hand out read-only parameters from const objects ----

static_assert(
    std::is_same_v<decltype(std::declval<const Linear<float>&>().weight()), View<const float, 2>>);
static_assert(std::is_same_v<decltype(std::declval<Linear<float>&>().weight()), View<float, 2>>);
static_assert(
    std::is_same_v<decltype(std::declval<const Linear<double>&>().bias()), View<const double, 1>>);
static_assert(
    std::is_same_v<decltype(softmax(std::declval<View<const float, 2>>())), Tensor<float, 2>>);

// ---- masks keep views, so temporaries are refused ----

template <class Mask, class Arg, class = void>
struct CanAllow : std::false_type {};
template <class Mask, class Arg>
struct CanAllow<Mask, Arg,
                std::void_t<decltype(std::declval<Mask&>().allowed(std::declval<Arg>()))>>
    : std::true_type {};
template <class Mask, class Arg, class = void>
struct CanAdd : std::false_type {};
template <class Mask, class Arg>
struct CanAdd<Mask, Arg, std::void_t<decltype(std::declval<Mask&>().additive(std::declval<Arg>()))>>
    : std::true_type {};

static_assert(CanAllow<AttentionMask<float>, const Tensor<bool, 2>&>::value);
static_assert(CanAllow<AttentionMask<float>, View<const bool, 3>>::value);
static_assert(!CanAllow<AttentionMask<float>, Tensor<bool, 2>>::value,
              "a temporary mask tensor would dangle");
static_assert(CanAdd<AttentionMask<double>, const Tensor<double, 4>&>::value);
static_assert(!CanAdd<AttentionMask<double>, Tensor<double, 4>>::value,
              "a temporary mask tensor would dangle");

}  // namespace
}  // namespace attn::compile_test
