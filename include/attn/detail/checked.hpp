// SPDX-License-Identifier: MIT
// attn/detail/checked.hpp: overflow-checked sums and products for extents, element counts,
// positions and byte counts (std only): the one place size arithmetic is checked. Every size,
// offset or position attn computes from a caller's shape, option or index goes through these
// before it is used (or is bounded by one that did: say which in a comment).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "attn/config.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// out = a * b; returns false (out unspecified) when the product does not fit T. With GCC
/// and clang any signs; elsewhere the operands must be non-negative (extents, counts, sizes).
template <class T>
constexpr bool checked_mul(T a, T b, T& out) noexcept {
  static_assert(std::is_integral_v<T>, "attn::detail::checked_mul: integers only");
#if defined(__GNUC__) || defined(__clang__)
  return !__builtin_mul_overflow(a, b, &out);
#else
  if (a < 0 || b < 0 || (b != 0 && a > std::numeric_limits<T>::max() / b)) return false;
  out = a * b;
  return true;
#endif
}

/// out = a + b; returns false (out unspecified) when the sum does not fit T.
template <class T>
constexpr bool checked_add(T a, T b, T& out) noexcept {
  static_assert(std::is_integral_v<T>, "attn::detail::checked_add: integers only");
#if defined(__GNUC__) || defined(__clang__)
  return !__builtin_add_overflow(a, b, &out);
#else
  if (b > 0 ? a > std::numeric_limits<T>::max() - b : a < std::numeric_limits<T>::min() - b) {
    return false;
  }
  out = a + b;
  return true;
#endif
}

/// out = the product of every factor (all T); false when some partial product overflows.
template <class T, class... Rest>
constexpr bool checked_product(T& out, T first, Rest... rest) noexcept {
  out = first;
  return (checked_mul(out, static_cast<T>(rest), out) && ...);
}

/// out = the sum of every term (all T); false when some partial sum overflows.
template <class T, class... Rest>
constexpr bool checked_sum(T& out, T first, Rest... rest) noexcept {
  out = first;
  return (checked_add(out, static_cast<T>(rest), out) && ...);
}

/// The element count of non-negative `extents` (any range of integers), or false when the
/// product of its non-zero extents does not fit T. Zero extents are skipped for the overflow
/// test: a shape (0, 2^40, 2^40) holds no element, but its row-major strides would still
/// overflow, so it is rejected like (2^40, 2^40).
template <class T, class Range>
constexpr bool checked_extent_product(const Range& extents, T& count) noexcept {
  T nonzero = 1;
  bool any_zero = false;
  for (const auto extent : extents) {
    const T e = static_cast<T>(extent);
    if (e == 0) {
      any_zero = true;
    } else if (!checked_mul(nonzero, e, nonzero)) {
      return false;
    }
  }
  count = any_zero ? T(0) : nonzero;
  return true;
}

/// Largest byte count attn allocates or writes in one piece: PTRDIFF_MAX (no object may be
/// larger, and pointer differences inside it must fit std::ptrdiff_t).
inline constexpr std::size_t kMaxObjectBytes =
    static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max());

/// bytes = count * element_size when it is at most kMaxObjectBytes; false otherwise.
constexpr bool checked_bytes(std::size_t count, std::size_t element_size,
                             std::size_t& bytes) noexcept {
  return checked_mul(count, element_size, bytes) && bytes <= kMaxObjectBytes;
}

}  // namespace detail
ATTN_NAMESPACE_END
