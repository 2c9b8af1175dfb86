// SPDX-License-Identifier: MIT
// attn/types/float16.hpp: attn::float16, IEEE 754 binary16 ("half": 5 exponent bits, 10 mantissa
// bits) as a storage type, converting as PyTorch's torch.float16 does.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "attn/config.hpp"
#include "attn/types/float_format.hpp"

ATTN_NAMESPACE_BEGIN

namespace detail {

/// float16's bits for a float (see float16): the same rounding as encode_bits, written out for
/// this one format (the scalar conversion every kernel set's row tail uses). A NaN becomes
/// sign | 0x7E00.
ATTN_TYPES_CONSTEXPR std::uint16_t float16_bits(float value) noexcept {
  const auto u = bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7FFFFFFFu;
  std::uint32_t r = 0;
  if (a >= 0x477FF000u) {  // from 65520 (65504 plus half a unit, a tie to the even infinity)
    r = a > 0x7F800000u ? 0x7E00u : 0x7C00u;
  } else if (a >= 0x38800000u) {  // normal, from 2^-14: rebias, round 13 bits to nearest even
    r = (a - 0x38000000u + 0x0FFFu + ((a >> 13) & 1u)) >> 13;
  } else if (a >= 0x33000000u) {  // subnormal, from 2^-25 (which ties to 0): round |x| * 2^24
    const std::uint32_t shift = 126u - (a >> 23);  // 14 .. 24
    const std::uint32_t m = (a & 0x007FFFFFu) | 0x00800000u;
    r = (m + (1u << (shift - 1)) - 1u + ((m >> shift) & 1u)) >> shift;
  }
  return static_cast<std::uint16_t>(sign | r);
}

/// float16's bits for a double, rounded once (see float16).
ATTN_TYPES_CONSTEXPR std::uint16_t float16_bits(double value) noexcept {
  return static_cast<std::uint16_t>(
      encode_value<Float16Format>(value, 0x7E00u, /*saturate=*/false));
}

}  // namespace detail

/// float16: IEEE 754 binary16, 1 sign bit, 5 exponent bits, 10 mantissa bits; largest finite
/// value 65504, smallest normal 2^-14, smallest subnormal 2^-24. A storage type: tensors,
/// weights and caches hold it to halve their bytes; arithmetic happens in float.
///
/// - From float (explicit): rounded to nearest, ties to even, subnormals included; magnitudes
///   from 65520 (65504 plus half a unit, which rounds to even, upwards) are +-infinity. A NaN
///   becomes sign | 0x7E00 (quiet, payload dropped), as PyTorch 1.13 does on every CPU.
/// - From double or an integer (explicit): rounded once from the exact value. PyTorch rounds a
///   double to float first; float16(static_cast<float>(d)) gives its bits.
/// - To float (implicit): exact; a NaN stays a NaN with its sign, quiet, its payload in the top
///   mantissa bits (as PyTorch and F16C's vcvtph2ps give).
///
/// No arithmetic operators, for the reasons given at attn::bfloat16: arithmetic converts to
/// float and every rounding back is written out as float16(...).
class float16 {
 public:
  /// Uninitialised bits, like a float; `float16{}` is +0.
  float16() = default;

  ATTN_TYPES_CONSTEXPR explicit float16(float value) noexcept
      : bits_(detail::float16_bits(value)) {}
  ATTN_TYPES_CONSTEXPR explicit float16(double value) noexcept
      : bits_(detail::float16_bits(value)) {}
  template <class Integer, std::enable_if_t<std::is_integral_v<Integer>, int> = 0>
  ATTN_TYPES_CONSTEXPR explicit float16(Integer value) noexcept
      : float16(detail::integer_for_rounding(value)) {}

  /// The float16 with these bits (sign, exponent, mantissa from the top).
  static constexpr float16 from_bits(std::uint16_t bits) noexcept { return {bits, BitsTag{}}; }
  constexpr std::uint16_t bits() const noexcept { return bits_; }

  /// The value as a float, exactly.
  ATTN_TYPES_CONSTEXPR operator float() const noexcept {  // NOLINT(google-explicit-constructor)
    return detail::bit_cast<float>(detail::decode_to_float_bits<detail::Float16Format>(bits_));
  }

 private:
  struct BitsTag {};
  constexpr float16(std::uint16_t bits, BitsTag) noexcept : bits_(bits) {}

  std::uint16_t bits_;
};

ATTN_NAMESPACE_END

namespace std {

/// std::numeric_limits for attn::float16 (same names and meanings as for float).
template <>
struct numeric_limits<attn::float16> : attn::detail::StorageFloatLimits {
 private:
  using T = attn::float16;

 public:
  static constexpr bool has_infinity = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr bool is_iec559 = true;
  static constexpr int digits = 11;
  static constexpr int digits10 = 3;
  static constexpr int max_digits10 = 5;
  static constexpr int min_exponent = -13;
  static constexpr int min_exponent10 = -4;
  static constexpr int max_exponent = 16;
  static constexpr int max_exponent10 = 4;

  static constexpr T min() noexcept { return T::from_bits(0x0400); }          // 2^-14
  static constexpr T lowest() noexcept { return T::from_bits(0xFBFF); }       // -65504
  static constexpr T max() noexcept { return T::from_bits(0x7BFF); }          // 65504
  static constexpr T epsilon() noexcept { return T::from_bits(0x1400); }      // 2^-10
  static constexpr T round_error() noexcept { return T::from_bits(0x3800); }  // 0.5
  static constexpr T infinity() noexcept { return T::from_bits(0x7C00); }
  static constexpr T quiet_NaN() noexcept { return T::from_bits(0x7E00); }
  static constexpr T signaling_NaN() noexcept { return T::from_bits(0x7D00); }
  static constexpr T denorm_min() noexcept { return T::from_bits(0x0001); }  // 2^-24
};

}  // namespace std
