// SPDX-License-Identifier: MIT
// attn/tensor/eigen.hpp: the bridge between views and Eigen, both ways: as_matrix() /
// as_vector() map a view as an Eigen::Map, as_view() views any Eigen dense object; to_eigen() /
// from_eigen() copy bfloat16 and float16 to and from Eigen's own types of the same formats.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "attn/config.hpp"
#include "attn/detail/eigen_core.hpp"
#include "attn/error.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/types/element.hpp"

ATTN_NAMESPACE_BEGIN

static_assert(std::is_same_v<Index, Eigen::Index>, "attn::Index must equal Eigen::Index");

/// Row-major dynamic matrix: attn never uses Eigen's column-major default for data that
/// came from a view.
template <class Scalar>
using RowMatrix =
    Eigen::Matrix<std::remove_const_t<Scalar>, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Row-major dynamic vector (a 1 x n row).
template <class Scalar>
using RowVector = Eigen::Matrix<std::remove_const_t<Scalar>, 1, Eigen::Dynamic, Eigen::RowMajor>;

/// The Map type as_matrix() returns: const-correct, unaligned, with a run-time outer stride.
template <class Scalar>
using MatrixMap = Eigen::Map<
    std::conditional_t<std::is_const_v<Scalar>, const RowMatrix<Scalar>, RowMatrix<Scalar>>,
    Eigen::Unaligned, Eigen::OuterStride<>>;

/// The Map type as_vector() returns.
template <class Scalar>
using VectorMap = Eigen::Map<
    std::conditional_t<std::is_const_v<Scalar>, const RowVector<Scalar>, RowVector<Scalar>>>;

/// A 2-D view with unit inner stride as an Eigen matrix (the outer stride is kept).
/// A dynamic inner stride is refused rather than accepted, because it kills
/// vectorisation; take contiguous() of such a view first.
/// @throws ShapeError if stride(1) != 1 (for more than one column).
template <class Scalar>
MatrixMap<Scalar> as_matrix(TensorView<Scalar, 2> v) {
  static_assert(std::is_floating_point_v<std::remove_const_t<Scalar>>,
                "attn::as_matrix: Scalar must be float or double");
  detail::require(v.stride(1) == 1 || v.extent(1) <= 1, "as_matrix", [&] {
    return "view of shape " + detail::to_string(v.shape()) + " has inner stride " +
           std::to_string(v.stride(1)) + ", expected 1";
  });
  const Index outer = v.extent(0) <= 1 ? std::max<Index>(v.extent(1), 1) : v.stride(0);
  return MatrixMap<Scalar>(v.data(), v.extent(0), v.extent(1), Eigen::OuterStride<>(outer));
}

template <class Scalar>
MatrixMap<Scalar> as_matrix(Tensor<Scalar, 2>& t) {
  return as_matrix(t.view());
}
template <class Scalar>
MatrixMap<const Scalar> as_matrix(const Tensor<Scalar, 2>& t) {
  return as_matrix(t.view());
}

/// A 1-D view with unit stride as an Eigen row vector.
/// @throws ShapeError if stride(0) != 1.
template <class Scalar>
VectorMap<Scalar> as_vector(TensorView<Scalar, 1> v) {
  static_assert(std::is_floating_point_v<std::remove_const_t<Scalar>>,
                "attn::as_vector: Scalar must be float or double");
  detail::require(v.stride(0) == 1 || v.extent(0) <= 1, "as_vector", [&] {
    return "view of shape " + detail::to_string(v.shape()) + " has stride " +
           std::to_string(v.stride(0)) + ", expected 1";
  });
  return VectorMap<Scalar>(v.data(), v.extent(0));
}

template <class Scalar>
VectorMap<Scalar> as_vector(Tensor<Scalar, 1>& t) {
  return as_vector(t.view());
}
template <class Scalar>
VectorMap<const Scalar> as_vector(const Tensor<Scalar, 1>& t) {
  return as_vector(t.view());
}

// ---- Eigen -> view ----

namespace detail {

template <class Expression>
using EigenPlain = std::remove_cv_t<std::remove_reference_t<Expression>>;

/// True for Eigen dense expressions whose coefficients sit in memory at fixed strides
/// (Matrix, Array, Map, Ref, Block of those): the ones a view can see without a copy.
template <class Expression>
constexpr bool has_direct_access() {
  using E = EigenPlain<Expression>;
  if constexpr (std::is_base_of_v<Eigen::DenseBase<E>, E>) {
    return (Eigen::internal::traits<E>::Flags & Eigen::DirectAccessBit) != 0;
  } else {
    return false;
  }
}

}  // namespace detail

/// A view of an Eigen dense object with direct access: Matrix and Array (row- or
/// column-major), Map, Ref and Block of them. A compile-time vector (VectorXf, a row() or
/// col() block, ...) gives a 1-D view (n); anything else a 2-D view (rows, cols) with
/// Eigen's strides, so a column-major MatrixXf is a (rows, cols) view with strides
/// (1, rows). No copy: the view sees the object's memory and must not outlive it.
///
/// Const-correct: a const object, a Map<const ...> or a block of a const matrix gives a
/// read-only view (TensorView<const float, 2>), and that never converts to a mutable one.
/// The modules' unbatched forms take these views directly: mha.forward(as_view(x)).
///
/// @throws ShapeError on negative strides (which TensorView does not support).
template <class Expression>
auto as_view(Expression&& m) {
  using E = detail::EigenPlain<Expression>;
  static_assert(detail::has_direct_access<E>(),
                "attn::as_view: the Eigen expression has no direct memory access (evaluate "
                "it into a Matrix, or take a Map, Ref or Block)");
  static_assert(
      std::is_lvalue_reference_v<Expression> || !std::is_base_of_v<Eigen::PlainObjectBase<E>, E>,
      "attn::as_view: a temporary Matrix or Array would dangle; view a named object");
  using Element = std::remove_pointer_t<decltype(m.data())>;
  if constexpr (E::IsVectorAtCompileTime) {
    return TensorView<Element, 1>(m.data(), {m.size()}, {m.innerStride()});
  } else {
    const Index inner = m.innerStride(), outer = m.outerStride();
    return TensorView<Element, 2>(m.data(), {m.rows(), m.cols()},
                                  E::IsRowMajor ? Shape<2>{outer, inner} : Shape<2>{inner, outer});
  }
}

// ---- bfloat16 and float16 <-> Eigen::bfloat16 and Eigen::half ----
//
// Eigen 3.4's Eigen::bfloat16 and Eigen::half have the formats and the bit layout of
// attn::bfloat16 and attn::float16 (asserted below), but they are other types: reading an
// attn::bfloat16 array through an Eigen::bfloat16 pointer breaks C++'s aliasing rules (C++17
// has no std::start_lifetime_as), so attn copies between them instead of mapping. The copies
// move bits and never round. For arithmetic, convert to float, which Eigen vectorises:
//     Eigen::MatrixXf m(rows, cols);
//     attn::convert(bf16_view, attn::as_view(m));   // exact
//     attn::convert(attn::as_view(m), bf16_view);   // rounds to nearest even

namespace detail {

template <class T>
struct EigenStorage {};
template <>
struct EigenStorage<bfloat16> {
  using type = Eigen::bfloat16;
};
template <>
struct EigenStorage<float16> {
  using type = Eigen::half;
};

template <class Eigen16>
constexpr bool same_layout_as_uint16() {
  return sizeof(Eigen16) == sizeof(std::uint16_t) && std::is_trivially_copyable_v<Eigen16> &&
         std::is_standard_layout_v<Eigen16>;
}
static_assert(same_layout_as_uint16<Eigen::bfloat16>() && same_layout_as_uint16<Eigen::half>(),
              "attn: Eigen::bfloat16 and Eigen::half must be 2-byte trivially copyable types");

}  // namespace detail

/// Eigen's type of the same format as bfloat16 (Eigen::bfloat16) or float16 (Eigen::half).
template <class T>
using eigen_storage_t = typename detail::EigenStorage<std::remove_cv_t<T>>::type;

/// The Eigen::bfloat16 with x's bits.
inline Eigen::bfloat16 to_eigen(bfloat16 x) noexcept {
  return Eigen::numext::bit_cast<Eigen::bfloat16>(x.bits());
}
/// The Eigen::half with x's bits.
inline Eigen::half to_eigen(float16 x) noexcept {
  return Eigen::numext::bit_cast<Eigen::half>(x.bits());
}
/// The attn::bfloat16 with x's bits.
inline bfloat16 from_eigen(Eigen::bfloat16 x) noexcept {
  return bfloat16::from_bits(Eigen::numext::bit_cast<std::uint16_t>(x));
}
/// The attn::float16 with x's bits.
inline float16 from_eigen(Eigen::half x) noexcept {
  return float16::from_bits(Eigen::numext::bit_cast<std::uint16_t>(x));
}

/// A copy of a 2-D view of bfloat16 or float16 as a row-major Eigen matrix of Eigen::bfloat16
/// or Eigen::half, bit for bit (any strides).
template <class Storage>
RowMatrix<eigen_storage_t<Storage>> to_eigen(TensorView<Storage, 2> v) {
  RowMatrix<eigen_storage_t<Storage>> m(v.extent(0), v.extent(1));
  for (Index i = 0; i < v.extent(0); ++i) {
    for (Index j = 0; j < v.extent(1); ++j) m(i, j) = to_eigen(v(i, j));
  }
  return m;
}

/// Copies an Eigen matrix (any dense expression) of Eigen::bfloat16 or Eigen::half into a 2-D
/// view of attn::bfloat16 or attn::float16 of the same shape, bit for bit (any strides).
/// @throws ShapeError if the shapes differ.
template <class Derived, class Storage>
void from_eigen(const Eigen::DenseBase<Derived>& m, TensorView<Storage, 2> out) {
  static_assert(std::is_same_v<typename Derived::Scalar, eigen_storage_t<Storage>>,
                "attn::from_eigen: Eigen::bfloat16 goes to attn::bfloat16, Eigen::half to "
                "attn::float16");
  detail::require(m.rows() == out.extent(0) && m.cols() == out.extent(1), "from_eigen", [&] {
    return "matrix has shape " + detail::to_string(Shape<2>{m.rows(), m.cols()}) +
           ", out has shape " + detail::to_string(out.shape());
  });
  for (Index i = 0; i < out.extent(0); ++i) {
    for (Index j = 0; j < out.extent(1); ++j) out(i, j) = from_eigen(m.derived().coeff(i, j));
  }
}

ATTN_NAMESPACE_END
