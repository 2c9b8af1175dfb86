// SPDX-License-Identifier: MIT
// attn/types/float8.hpp: attn::float8_e4m3 and attn::float8_e5m2, the two 8-bit floating-point
// formats of the OCP 8-bit Floating Point Specification (OFP8), as storage types.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "attn/config.hpp"
#include "attn/types/float_format.hpp"

ATTN_NAMESPACE_BEGIN

namespace detail {

/// The bits of an 8-bit format for a float or a double, rounded once (round to nearest even;
/// a NaN gives sign | 0x7F).
template <class Format, class Value>
ATTN_TYPES_CONSTEXPR std::uint8_t float8_bits(Value value, bool saturate) noexcept {
  return static_cast<std::uint8_t>(encode_value<Format>(value, 0x7Fu, saturate));
}

}  // namespace detail

/// float8_e4m3: OCP FP8 E4M3 (PyTorch's torch.float8_e4m3fn, ml_dtypes' float8_e4m3fn,
/// safetensors' F8_E4M3): 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits. No
/// infinities: the all-ones exponent holds finite values up to 448 = 1.75 * 2^8, and only
/// 0x7F and 0xFF are NaN. Smallest normal 2^-6, smallest subnormal 2^-9. A storage type (for
/// K/V caches): arithmetic happens in float.
///
/// Conversion from float rounds to nearest, ties to even, in one of two ways:
/// - float8_e4m3(x) and from_float(x) (as PyTorch 2.x and ml_dtypes): a magnitude that rounds
///   beyond 448, from 464 (the tie between 448 and the NaN pattern goes to 448, the even
///   one) upwards, and +-infinity become NaN (sign | 0x7F);
/// - from_float_saturate(x) (the OCP specification's saturating mode, CUDA's
///   __NV_SATFINITE, the usual choice for KV caches): such magnitudes and the infinities
///   become +-448.
/// In both, a NaN becomes sign | 0x7F. From double (explicit) rounds once, without saturation.
/// To float (implicit) is exact; a NaN gives sign | 0x7FF00000, a quiet float NaN.
class float8_e4m3 {
 public:
  /// Uninitialised bits, like a float; `float8_e4m3{}` is +0.
  float8_e4m3() = default;

  ATTN_TYPES_CONSTEXPR explicit float8_e4m3(float value) noexcept
      : bits_(detail::float8_bits<detail::Float8E4M3Format>(value, false)) {}
  ATTN_TYPES_CONSTEXPR explicit float8_e4m3(double value) noexcept
      : bits_(detail::float8_bits<detail::Float8E4M3Format>(value, false)) {}
  template <class Integer, std::enable_if_t<std::is_integral_v<Integer>, int> = 0>
  ATTN_TYPES_CONSTEXPR explicit float8_e4m3(Integer value) noexcept
      : float8_e4m3(detail::integer_for_rounding(value)) {}

  /// float8_e4m3(value): overflow and infinities give NaN.
  static ATTN_TYPES_CONSTEXPR float8_e4m3 from_float(float value) noexcept {
    return float8_e4m3(value);
  }
  /// Overflow and infinities give +-448; a NaN stays NaN.
  static ATTN_TYPES_CONSTEXPR float8_e4m3 from_float_saturate(float value) noexcept {
    return from_bits(detail::float8_bits<detail::Float8E4M3Format>(value, true));
  }

  static constexpr float8_e4m3 from_bits(std::uint8_t bits) noexcept { return {bits, BitsTag{}}; }
  constexpr std::uint8_t bits() const noexcept { return bits_; }

  /// The value as a float, exactly.
  ATTN_TYPES_CONSTEXPR operator float() const noexcept {  // NOLINT(google-explicit-constructor)
    return detail::bit_cast<float>(
        detail::Float8Table<detail::Float8E4M3Format>::kFloatBits[bits_]);
  }

 private:
  struct BitsTag {};
  constexpr float8_e4m3(std::uint8_t bits, BitsTag) noexcept : bits_(bits) {}

  std::uint8_t bits_;
};

/// float8_e5m2: OCP FP8 E5M2 (PyTorch's torch.float8_e5m2, ml_dtypes' float8_e5m2, safetensors'
/// F8_E5M2): 1 sign bit, 5 exponent bits (bias 15), 2 mantissa bits, IEEE 754 conventions:
/// +-infinity (0x7C, 0xFC), NaNs (0x7D-0x7F, 0xFD-0xFF), largest finite 57344 = 1.75 * 2^15,
/// smallest normal 2^-14, smallest subnormal 2^-16. A storage type: arithmetic happens in float.
///
/// Conversion from float rounds to nearest, ties to even, in one of two ways:
/// - float8_e5m2(x) and from_float(x) (IEEE, as PyTorch 2.x and ml_dtypes): magnitudes from
///   61440 (57344 plus half a unit, a tie that goes to the even, infinite side) are
///   +-infinity;
/// - from_float_saturate(x) (OCP's saturating mode, CUDA's __NV_SATFINITE): those and the
///   infinities become +-57344.
/// In both, a NaN becomes sign | 0x7F (PyTorch 2.x; ml_dtypes writes sign | 0x7E). From double
/// (explicit) rounds once, without saturation. To float (implicit) is exact; a NaN keeps its
/// sign and becomes quiet, its payload in the top mantissa bits.
class float8_e5m2 {
 public:
  /// Uninitialised bits, like a float; `float8_e5m2{}` is +0.
  float8_e5m2() = default;

  ATTN_TYPES_CONSTEXPR explicit float8_e5m2(float value) noexcept
      : bits_(detail::float8_bits<detail::Float8E5M2Format>(value, false)) {}
  ATTN_TYPES_CONSTEXPR explicit float8_e5m2(double value) noexcept
      : bits_(detail::float8_bits<detail::Float8E5M2Format>(value, false)) {}
  template <class Integer, std::enable_if_t<std::is_integral_v<Integer>, int> = 0>
  ATTN_TYPES_CONSTEXPR explicit float8_e5m2(Integer value) noexcept
      : float8_e5m2(detail::integer_for_rounding(value)) {}

  /// float8_e5m2(value): overflow gives +-infinity.
  static ATTN_TYPES_CONSTEXPR float8_e5m2 from_float(float value) noexcept {
    return float8_e5m2(value);
  }
  /// Overflow and infinities give +-57344; a NaN stays NaN.
  static ATTN_TYPES_CONSTEXPR float8_e5m2 from_float_saturate(float value) noexcept {
    return from_bits(detail::float8_bits<detail::Float8E5M2Format>(value, true));
  }

  static constexpr float8_e5m2 from_bits(std::uint8_t bits) noexcept { return {bits, BitsTag{}}; }
  constexpr std::uint8_t bits() const noexcept { return bits_; }

  /// The value as a float, exactly.
  ATTN_TYPES_CONSTEXPR operator float() const noexcept {  // NOLINT(google-explicit-constructor)
    return detail::bit_cast<float>(
        detail::Float8Table<detail::Float8E5M2Format>::kFloatBits[bits_]);
  }

 private:
  struct BitsTag {};
  constexpr float8_e5m2(std::uint8_t bits, BitsTag) noexcept : bits_(bits) {}

  std::uint8_t bits_;
};

ATTN_NAMESPACE_END

namespace std {

/// std::numeric_limits for attn::float8_e4m3. It has no infinity: infinity() returns the NaN
/// (as ml_dtypes does), so code that asks for one anyway poisons its result instead of getting
/// a finite value.
template <>
struct numeric_limits<attn::float8_e4m3> : attn::detail::StorageFloatLimits {
 private:
  using T = attn::float8_e4m3;

 public:
  static constexpr bool has_infinity = false;
  static constexpr bool has_signaling_NaN = false;
  static constexpr bool is_iec559 = false;
  static constexpr int digits = 4;
  static constexpr int digits10 = 0;
  static constexpr int max_digits10 = 3;
  static constexpr int min_exponent = -5;
  static constexpr int min_exponent10 = -1;
  static constexpr int max_exponent = 9;
  static constexpr int max_exponent10 = 2;

  static constexpr T min() noexcept { return T::from_bits(0x08); }          // 2^-6
  static constexpr T lowest() noexcept { return T::from_bits(0xFE); }       // -448
  static constexpr T max() noexcept { return T::from_bits(0x7E); }          // 448
  static constexpr T epsilon() noexcept { return T::from_bits(0x20); }      // 2^-3
  static constexpr T round_error() noexcept { return T::from_bits(0x30); }  // 0.5
  static constexpr T infinity() noexcept { return T::from_bits(0x7F); }     // NaN
  static constexpr T quiet_NaN() noexcept { return T::from_bits(0x7F); }
  static constexpr T signaling_NaN() noexcept { return T::from_bits(0x7F); }
  static constexpr T denorm_min() noexcept { return T::from_bits(0x01); }  // 2^-9
};

/// std::numeric_limits for attn::float8_e5m2.
template <>
struct numeric_limits<attn::float8_e5m2> : attn::detail::StorageFloatLimits {
 private:
  using T = attn::float8_e5m2;

 public:
  static constexpr bool has_infinity = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr bool is_iec559 = true;
  static constexpr int digits = 3;
  static constexpr int digits10 = 0;
  static constexpr int max_digits10 = 2;
  static constexpr int min_exponent = -13;
  static constexpr int min_exponent10 = -4;
  static constexpr int max_exponent = 16;
  static constexpr int max_exponent10 = 4;

  static constexpr T min() noexcept { return T::from_bits(0x04); }          // 2^-14
  static constexpr T lowest() noexcept { return T::from_bits(0xFB); }       // -57344
  static constexpr T max() noexcept { return T::from_bits(0x7B); }          // 57344
  static constexpr T epsilon() noexcept { return T::from_bits(0x34); }      // 2^-2
  static constexpr T round_error() noexcept { return T::from_bits(0x38); }  // 0.5
  static constexpr T infinity() noexcept { return T::from_bits(0x7C); }
  static constexpr T quiet_NaN() noexcept { return T::from_bits(0x7F); }
  static constexpr T signaling_NaN() noexcept { return T::from_bits(0x7D); }
  static constexpr T denorm_min() noexcept { return T::from_bits(0x01); }  // 2^-16
};

}  // namespace std
