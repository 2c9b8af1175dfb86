// SPDX-License-Identifier: MIT
// attn/types/bfloat16.hpp: attn::bfloat16, the 16-bit brain floating-point storage type (float's
// 8 exponent bits, 7 mantissa bits), converting as PyTorch's torch.bfloat16 does.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "attn/config.hpp"
#include "attn/types/float_format.hpp"

ATTN_NAMESPACE_BEGIN

namespace detail {

/// bfloat16's bits for a float: round to nearest, ties to even, by adding 0x7FFF plus the
/// lowest kept bit and dropping the low half (a carry rounds up into the exponent, and past
/// the largest finite value into infinity). Any NaN gives 0x7FC0: PyTorch's c10::BFloat16
/// rule, whatever the NaN's sign and payload.
ATTN_TYPES_CONSTEXPR std::uint16_t bfloat16_bits(float value) noexcept {
  const auto u = bit_cast<std::uint32_t>(value);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0u;
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace detail

/// bfloat16 ("brain float"): 1 sign bit, 8 exponent bits (float's range, with subnormals,
/// infinities and NaNs), 7 mantissa bits: a float with its low 16 bits dropped. A storage type:
/// tensors, weights and caches hold it to halve their bytes; arithmetic happens in float.
///
/// - From float (explicit): rounded to nearest, ties to even; values at or beyond the largest
///   finite bfloat16 plus half a unit (about 3.3961e38) become +-infinity; subnormals round
///   like any other value. Any NaN becomes 0x7FC0 (positive, quiet, no payload), as
///   c10::BFloat16 does in PyTorch 1.13 (its scalar conversions, and tensor.to() on CPUs
///   without AVX2; its AVX2/AVX-512 tensor.to() writes 0xFFFF instead: another quiet NaN).
/// - From double (explicit): rounded once, to nearest even, from the double's exact value.
///   PyTorch rounds to float first (two roundings); bfloat16(static_cast<float>(d)) gives its
///   bits, which differ from the correctly rounded ones when d lies within half a float ulp of
///   a tie between two bfloat16 values.
/// - From an integer (explicit): rounded once, like the double.
/// - To float (implicit): exact; a NaN keeps its sign and payload (the float is bits() << 16).
///
/// There are no arithmetic operators: `a + b` converts both to float and gives a float, and
/// comparisons compare the floats (IEEE: NaN is unordered, -0 == +0). So every rounding back to
/// bfloat16 is written out, bfloat16(a + b), and no expression rounds to 7 bits in between by
/// surprise.
class bfloat16 {
 public:
  /// Uninitialised bits, like a float; `bfloat16{}` is +0.
  bfloat16() = default;

  ATTN_TYPES_CONSTEXPR explicit bfloat16(float value) noexcept
      : bits_(detail::bfloat16_bits(value)) {}

  ATTN_TYPES_CONSTEXPR explicit bfloat16(double value) noexcept
      : bits_(static_cast<std::uint16_t>(
            detail::encode_bits<detail::Float64Format, detail::BFloat16Format>(
                detail::bit_cast<std::uint64_t>(value), 0x7FC0u, false))) {}

  template <class Integer, std::enable_if_t<std::is_integral_v<Integer>, int> = 0>
  ATTN_TYPES_CONSTEXPR explicit bfloat16(Integer value) noexcept
      : bfloat16(detail::integer_for_rounding(value)) {}

  /// The bfloat16 with these bits (sign, exponent, mantissa from the top).
  static constexpr bfloat16 from_bits(std::uint16_t bits) noexcept { return {bits, BitsTag{}}; }
  constexpr std::uint16_t bits() const noexcept { return bits_; }

  /// The value as a float, exactly.
  ATTN_TYPES_CONSTEXPR operator float() const noexcept {  // NOLINT(google-explicit-constructor)
    return detail::bit_cast<float>(static_cast<std::uint32_t>(bits_) << 16);
  }

 private:
  struct BitsTag {};
  constexpr bfloat16(std::uint16_t bits, BitsTag) noexcept : bits_(bits) {}

  std::uint16_t bits_;
};

ATTN_NAMESPACE_END

namespace std {

/// std::numeric_limits for attn::bfloat16 (same names and meanings as for float).
template <>
struct numeric_limits<attn::bfloat16> : attn::detail::StorageFloatLimits {
 private:
  using T = attn::bfloat16;

 public:
  static constexpr bool has_infinity = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr bool is_iec559 = false;  // not an IEEE 754 interchange format
  static constexpr int digits = 8;
  static constexpr int digits10 = 2;
  static constexpr int max_digits10 = 4;
  static constexpr int min_exponent = -125;
  static constexpr int min_exponent10 = -37;
  static constexpr int max_exponent = 128;
  static constexpr int max_exponent10 = 38;

  static constexpr T min() noexcept { return T::from_bits(0x0080); }          // 2^-126
  static constexpr T lowest() noexcept { return T::from_bits(0xFF7F); }       // -(2 - 2^-7) 2^127
  static constexpr T max() noexcept { return T::from_bits(0x7F7F); }          // (2 - 2^-7) 2^127
  static constexpr T epsilon() noexcept { return T::from_bits(0x3C00); }      // 2^-7
  static constexpr T round_error() noexcept { return T::from_bits(0x3F00); }  // 0.5
  static constexpr T infinity() noexcept { return T::from_bits(0x7F80); }
  static constexpr T quiet_NaN() noexcept { return T::from_bits(0x7FC0); }
  static constexpr T signaling_NaN() noexcept { return T::from_bits(0x7FA0); }
  static constexpr T denorm_min() noexcept { return T::from_bits(0x0001); }  // 2^-133
};

}  // namespace std
