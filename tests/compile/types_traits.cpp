// SPDX-License-Identifier: MIT
// tests/compile/types_traits.cpp: compile-only checks (building this file is the test) of the
// storage types: layout, triviality, which conversions are implicit, the traits, the limits,
// and views and tensors over them.
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "attn/attn.hpp"

namespace attn::compile_test {
namespace {

// ---- layout: the bits and nothing else, copyable as bytes ----

template <class T, std::size_t Size>
constexpr bool check_layout() {
  static_assert(sizeof(T) == Size && alignof(T) == Size);
  static_assert(std::is_trivially_copyable_v<T>);
  static_assert(std::is_trivially_default_constructible_v<T>);  // uninitialised, like float
  static_assert(std::is_trivially_destructible_v<T>);
  static_assert(std::is_standard_layout_v<T>);
  static_assert(std::is_nothrow_constructible_v<T, float>);
  return true;
}
static_assert(check_layout<bfloat16, 2>());
static_assert(check_layout<float16, 2>());
static_assert(check_layout<float8_e4m3, 1>());
static_assert(check_layout<float8_e5m2, 1>());

// ---- conversions: into a storage type only explicitly, out to float implicitly ----

template <class T>
constexpr bool check_conversions() {
  static_assert(!std::is_convertible_v<float, T>, "rounding is written out: T(x)");
  static_assert(!std::is_convertible_v<double, T>);
  static_assert(!std::is_convertible_v<int, T>);
  static_assert(std::is_constructible_v<T, float> && std::is_constructible_v<T, double> &&
                std::is_constructible_v<T, int> && std::is_constructible_v<T, std::int64_t>);
  static_assert(std::is_convertible_v<T, float>, "widening to float is exact and implicit");
  static_assert(std::is_convertible_v<T, double>);
  // Arithmetic happens in float and stays float until rounded explicitly.
  static_assert(std::is_same_v<decltype(std::declval<T>() + std::declval<T>()), float>);
  static_assert(std::is_same_v<decltype(std::declval<T>() * 2.0f), float>);
  static_assert(std::is_same_v<decltype(std::declval<T>() < std::declval<T>()), bool>);
  static_assert(!std::is_assignable_v<T&, float>);
  // no conversion between two storage types without naming it
  static_assert(!std::is_convertible_v<bfloat16, float16> &&
                !std::is_convertible_v<float16, bfloat16>);
  return true;
}
static_assert(check_conversions<bfloat16>());
static_assert(check_conversions<float16>());
static_assert(check_conversions<float8_e4m3>());
static_assert(check_conversions<float8_e5m2>());

// ---- traits ----

static_assert(is_storage_type_v<bfloat16> && is_storage_type_v<const float16> &&
              is_storage_type_v<float8_e4m3> && is_storage_type_v<volatile float8_e5m2>);
static_assert(!is_storage_type_v<float> && !is_storage_type_v<double> &&
              !is_storage_type_v<std::uint16_t> && !is_storage_type_v<bool>);
static_assert(is_element_type_v<float> && is_element_type_v<const double> &&
              is_element_type_v<bfloat16> && !is_element_type_v<int> && !is_element_type_v<bool>);
static_assert(std::is_same_v<compute_type_t<bfloat16>, float> &&
              std::is_same_v<compute_type_t<const float8_e4m3>, float> &&
              std::is_same_v<compute_type_t<float>, float> &&
              std::is_same_v<compute_type_t<double>, double>);
static_assert(std::is_same_v<accumulate_type_t<float16>, float> &&
              std::is_same_v<accumulate_type_t<double>, double>);
static_assert(element_size_v<bfloat16> == 2 && element_size_v<float8_e5m2> == 1 &&
              element_size_v<double> == 8);
static_assert(element_traits<float16>::exponent_bits == 5 &&
              element_traits<float16>::mantissa_bits == 10 &&
              element_traits<float8_e4m3>::mantissa_bits == 3);

constexpr bool same_text(const char* a, const char* b) {
  for (; *a != '\0' && *a == *b; ++a, ++b) {
  }
  return *a == *b;
}
static_assert(same_text(element_name<float>(), "float") &&
              same_text(element_name<double>(), "double") &&
              same_text(element_name<bfloat16>(), "bfloat16") &&
              same_text(element_name<const float16>(), "float16") &&
              same_text(element_name<float8_e4m3>(), "float8_e4m3") &&
              same_text(element_name<float8_e5m2>(), "float8_e5m2"));

// ---- limits (bits) and constant-expression conversions ----

static_assert(std::numeric_limits<bfloat16>::is_specialized &&
              std::numeric_limits<bfloat16>::digits == 8 &&
              std::numeric_limits<bfloat16>::max().bits() == 0x7F7F &&
              std::numeric_limits<bfloat16>::quiet_NaN().bits() == 0x7FC0);
static_assert(std::numeric_limits<float16>::digits == 11 &&
              std::numeric_limits<float16>::max().bits() == 0x7BFF &&
              std::numeric_limits<float16>::is_iec559);
static_assert(!std::numeric_limits<float8_e4m3>::has_infinity &&
              std::numeric_limits<float8_e4m3>::max().bits() == 0x7E &&
              std::numeric_limits<float8_e4m3>::quiet_NaN().bits() == 0x7F);
static_assert(std::numeric_limits<float8_e5m2>::has_infinity &&
              std::numeric_limits<float8_e5m2>::max().bits() == 0x7B &&
              std::numeric_limits<float8_e5m2>::infinity().bits() == 0x7C);
static_assert(std::numeric_limits<const bfloat16>::digits == 8);

#if ATTN_HAS_BUILTIN_BIT_CAST
static_assert(bfloat16(1.0f).bits() == 0x3F80 && float16(1.0f).bits() == 0x3C00);
static_assert(float8_e4m3(448.0f).bits() == 0x7E && float8_e5m2(57344.0).bits() == 0x7B);
static_assert(static_cast<float>(bfloat16::from_bits(0x4049)) == 3.140625f);
static_assert(static_cast<float>(std::numeric_limits<float16>::denorm_min()) == 0x1p-24f);
static_assert(static_cast<float>(std::numeric_limits<float8_e4m3>::max()) == 448.0f);
static_assert(static_cast<float>(std::numeric_limits<float8_e5m2>::max()) == 57344.0f);
static_assert(float8_e4m3::from_float_saturate(1e9f).bits() == 0x7E);
#endif

// ---- views and tensors of the storage types ----

template <class T>
constexpr bool check_views() {
  using View = TensorView<T, 3>;
  using ReadOnly = TensorView<const T, 3>;
  static_assert(std::is_trivially_copyable_v<View>);
  static_assert(std::is_convertible_v<View, ReadOnly> && !std::is_convertible_v<ReadOnly, View>);
  static_assert(std::is_same_v<decltype(std::declval<ReadOnly>()(0, 0, 0)), const T&>);
  static_assert(
      std::is_same_v<decltype(split_heads(std::declval<ReadOnly>(), 2)), TensorView<const T, 4>>);
  static_assert(
      std::is_same_v<decltype(reshape(std::declval<View>(), Shape<2>{-1, 1})), TensorView<T, 2>>);
  static_assert(std::is_same_v<decltype(contiguous(std::declval<ReadOnly>())), Tensor<T, 3>>);
  static_assert(std::is_convertible_v<Tensor<T, 3>&, View>);
  static_assert(std::is_nothrow_move_constructible_v<Tensor<T, 3>>);
  static_assert(std::is_same_v<decltype(convert<T>(std::declval<TensorView<const float, 2>>())),
                               Tensor<T, 2>>);
  static_assert(!std::is_convertible_v<TensorView<float, 2>, TensorView<const T, 2>>);
  return true;
}
static_assert(check_views<bfloat16>());
static_assert(check_views<float16>());
static_assert(check_views<float8_e4m3>());
static_assert(check_views<float8_e5m2>());

static_assert(std::is_same_v<eigen_storage_t<bfloat16>, Eigen::bfloat16> &&
              std::is_same_v<eigen_storage_t<const float16>, Eigen::half>);
static_assert(std::is_same_v<decltype(to_eigen(std::declval<TensorView<const bfloat16, 2>>())),
                             RowMatrix<Eigen::bfloat16>>);

}  // namespace
}  // namespace attn::compile_test
