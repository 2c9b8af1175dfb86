// SPDX-License-Identifier: MIT
// attn/types/element.hpp: the element types attn computes with (float, double) and stores
// (bfloat16, float16, float8_e4m3, float8_e5m2): traits, names, and the one conversion rule
// between any two of them.
#pragma once

#include <cstddef>
#include <limits>
#include <type_traits>

#include "attn/config.hpp"
#include "attn/types/bfloat16.hpp"
#include "attn/types/float16.hpp"
#include "attn/types/float8.hpp"

ATTN_NAMESPACE_BEGIN

/// What attn knows about an element type: its name, its size, its format, and the types
/// arithmetic on it uses. Defined for float, double, bfloat16, float16, float8_e4m3 and
/// float8_e5m2 (cv-qualifiers are not stripped: use std::remove_cv_t first).
///  - compute_type: what values are converted to before any arithmetic (float for every
///    storage type; float and double compute as themselves);
///  - accumulate_type: what sums and products accumulate in (the same: float for the
///    storage types, as PyTorch's CPU kernels and FlashAttention do).
template <class T>
struct element_traits;

template <>
struct element_traits<float> {
  static constexpr const char* name = "float";
  static constexpr std::size_t size = 4;
  static constexpr int exponent_bits = 8, mantissa_bits = 23;
  using compute_type = float;
  using accumulate_type = float;
};
template <>
struct element_traits<double> {
  static constexpr const char* name = "double";
  static constexpr std::size_t size = 8;
  static constexpr int exponent_bits = 11, mantissa_bits = 52;
  using compute_type = double;
  using accumulate_type = double;
};
template <>
struct element_traits<bfloat16> {
  static constexpr const char* name = "bfloat16";
  static constexpr std::size_t size = 2;
  static constexpr int exponent_bits = 8, mantissa_bits = 7;
  using compute_type = float;
  using accumulate_type = float;
};
template <>
struct element_traits<float16> {
  static constexpr const char* name = "float16";
  static constexpr std::size_t size = 2;
  static constexpr int exponent_bits = 5, mantissa_bits = 10;
  using compute_type = float;
  using accumulate_type = float;
};
template <>
struct element_traits<float8_e4m3> {
  static constexpr const char* name = "float8_e4m3";
  static constexpr std::size_t size = 1;
  static constexpr int exponent_bits = 4, mantissa_bits = 3;
  using compute_type = float;
  using accumulate_type = float;
};
template <>
struct element_traits<float8_e5m2> {
  static constexpr const char* name = "float8_e5m2";
  static constexpr std::size_t size = 1;
  static constexpr int exponent_bits = 5, mantissa_bits = 2;
  using compute_type = float;
  using accumulate_type = float;
};

/// True for the storage types: bfloat16, float16, float8_e4m3, float8_e5m2 (cv-qualified too).
template <class T>
inline constexpr bool is_storage_type_v =
    std::is_same_v<std::remove_cv_t<T>, bfloat16> || std::is_same_v<std::remove_cv_t<T>, float16> ||
    std::is_same_v<std::remove_cv_t<T>, float8_e4m3> ||
    std::is_same_v<std::remove_cv_t<T>, float8_e5m2>;

/// True for every element type: float, double and the storage types (cv-qualified too).
template <class T>
inline constexpr bool is_element_type_v =
    std::is_same_v<std::remove_cv_t<T>, float> || std::is_same_v<std::remove_cv_t<T>, double> ||
    is_storage_type_v<T>;

/// float for the storage types; float and double for themselves.
template <class T>
using compute_type_t = typename element_traits<std::remove_cv_t<T>>::compute_type;

/// float for the storage types; float and double for themselves.
template <class T>
using accumulate_type_t = typename element_traits<std::remove_cv_t<T>>::accumulate_type;

/// "float", "double", "bfloat16", "float16", "float8_e4m3" or "float8_e5m2".
template <class T>
constexpr const char* element_name() noexcept {
  return element_traits<std::remove_cv_t<T>>::name;
}

/// Bytes per element (sizeof).
template <class T>
inline constexpr std::size_t element_size_v = element_traits<std::remove_cv_t<T>>::size;

namespace detail {

/// `value` as a To, by the one rule of every conversion between element types: widening to
/// float or double is exact; anything narrower rounds once, to nearest even, from the exact
/// value (a storage type goes through float, which holds it exactly; a double is rounded
/// directly). float <-> double is static_cast. Overflow follows To's constructor: infinity, or
/// NaN for float8_e4m3.
template <class To, class From>
ATTN_TYPES_CONSTEXPR To convert_element(From value) noexcept {
  static_assert(is_element_type_v<From> && is_element_type_v<To>,
                "attn::convert: element types are float, double, bfloat16, float16, "
                "float8_e4m3 and float8_e5m2");
  if constexpr (std::is_same_v<From, To>) {
    return value;
  } else if constexpr (std::is_same_v<To, float> || std::is_same_v<To, double>) {
    if constexpr (is_storage_type_v<From>) {
      return static_cast<To>(static_cast<float>(value));
    } else {
      return static_cast<To>(value);
    }
  } else if constexpr (is_storage_type_v<From>) {
    return To(static_cast<float>(value));
  } else {
    return To(value);
  }
}

/// `value` as a float8 type To with saturation: like convert_element, except that magnitudes
/// beyond To's largest finite value and the infinities become +-max (a NaN stays NaN).
template <class To, class From>
ATTN_TYPES_CONSTEXPR To saturate_element(From value) noexcept {
  static_assert(std::is_same_v<To, float8_e4m3> || std::is_same_v<To, float8_e5m2>,
                "attn::convert_saturate: saturating conversions are to float8_e4m3 and "
                "float8_e5m2");
  static_assert(is_element_type_v<From>, "attn::convert_saturate: From must be an element type");
  if constexpr (std::is_same_v<From, To>) {
    return value;
  } else if constexpr (std::is_same_v<From, double>) {
    // Clamping first rounds the same way: a magnitude above max rounds to max or beyond.
    const double top = static_cast<float>(std::numeric_limits<To>::max());
    return To(value > top ? top : value < -top ? -top : value);  // NaN passes through
  } else {
    return To::from_float_saturate(static_cast<float>(value));
  }
}

}  // namespace detail
ATTN_NAMESPACE_END
