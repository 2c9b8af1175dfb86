// SPDX-License-Identifier: MIT
// attn/types/float_format.hpp: the bit-level rounding and decoding behind the storage types
// (bfloat16, float16, float8_e4m3, float8_e5m2): one integer-only, correctly rounded encoder
// for every binary format, and exact decoders.
//
// Everything here works on bit patterns with integer arithmetic, so a conversion gives the same
// bits whatever the floating-point environment (rounding mode, flush-to-zero, denormals-are-
// zero) and whatever the compiler flags; the kernel sets' vector conversions are tested against
// these functions bit for bit.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "attn/config.hpp"

/// 1 when the compiler has __builtin_bit_cast (GCC 11+, clang 9+): the storage types'
/// conversions are then constexpr.
#if defined(__has_builtin)
#if __has_builtin(__builtin_bit_cast)
#define ATTN_HAS_BUILTIN_BIT_CAST 1
#endif
#endif
#ifndef ATTN_HAS_BUILTIN_BIT_CAST
#define ATTN_HAS_BUILTIN_BIT_CAST 0
#endif

/// `constexpr` where the conversions can be (see ATTN_HAS_BUILTIN_BIT_CAST), else nothing.
#if ATTN_HAS_BUILTIN_BIT_CAST
#define ATTN_TYPES_CONSTEXPR constexpr
#else
#define ATTN_TYPES_CONSTEXPR
#endif

ATTN_NAMESPACE_BEGIN
namespace detail {

/// std::bit_cast for C++17: the object representation of `from` as a To.
template <class To, class From>
ATTN_TYPES_CONSTEXPR To bit_cast(const From& from) noexcept {
  static_assert(sizeof(To) == sizeof(From), "attn::detail::bit_cast: sizes differ");
  static_assert(std::is_trivially_copyable_v<To> && std::is_trivially_copyable_v<From>,
                "attn::detail::bit_cast: types must be trivially copyable");
#if ATTN_HAS_BUILTIN_BIT_CAST
  return __builtin_bit_cast(To, from);
#else
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
#endif
}

/// A binary floating-point format: one sign bit (the top bit), `Exponent` exponent bits with
/// bias 2^(Exponent - 1) - 1, and `Mantissa` stored mantissa bits; subnormals when the exponent
/// field is 0. `Ieee`: the all-ones exponent field holds the infinities (mantissa 0) and the
/// NaNs, as in IEEE 754. Otherwise (OCP FP8 E4M3, "FN": finite and NaN) there is no infinity,
/// the all-ones exponent holds finite values, and only the all-ones pattern of each sign is NaN.
template <int Exponent, int Mantissa, bool Ieee>
struct FloatFormat {
  static constexpr int kExponentBits = Exponent;
  static constexpr int kMantissaBits = Mantissa;
  static constexpr int kBits = 1 + Exponent + Mantissa;
  static constexpr int kBias = (1 << (Exponent - 1)) - 1;
  static constexpr bool kIeee = Ieee;
  static constexpr std::uint64_t kSignMask = std::uint64_t{1} << (kBits - 1);
  static constexpr std::uint64_t kExponentMask = ((std::uint64_t{1} << Exponent) - 1) << Mantissa;
  static constexpr std::uint64_t kMantissaMask = (std::uint64_t{1} << Mantissa) - 1;
  /// The largest finite magnitude's bits.
  static constexpr std::uint64_t kMaxFinite =
      Ieee ? kExponentMask - (std::uint64_t{1} << Mantissa) + kMantissaMask
           : kExponentMask + kMantissaMask - 1;
  /// What a magnitude too large for the format becomes without saturation: the infinity, or
  /// (no infinity) the NaN.
  static constexpr std::uint64_t kOverflow = Ieee ? kExponentMask : kExponentMask + kMantissaMask;
};

using Float32Format = FloatFormat<8, 23, true>;
using Float64Format = FloatFormat<11, 52, true>;
using BFloat16Format = FloatFormat<8, 7, true>;
using Float16Format = FloatFormat<5, 10, true>;
using Float8E4M3Format = FloatFormat<4, 3, false>;
using Float8E5M2Format = FloatFormat<5, 2, true>;

/// The magnitude `a` (a finite value of format Source, sign bit clear) rounded to nearest, ties
/// to even, in format Target, as Target's magnitude bits computed as if Target's exponent range
/// had no top: a result above Target::kMaxFinite means the value overflows Target. Subnormal
/// inputs and results are exact cases of the same arithmetic.
template <class Source, class Target, class Bits>
constexpr Bits round_magnitude(Bits a) noexcept {
  static_assert(Source::kMantissaBits >= Target::kMantissaBits + 2,
                "attn::detail::round_magnitude: rounds to a narrower format only");
  constexpr int sm = Source::kMantissaBits, tm = Target::kMantissaBits;
  // The value is m * 2^(e - bias - sm), m with its implicit bit (e >= 1 for both kinds).
  int e = static_cast<int>(a >> sm);
  Bits m = a & ((Bits{1} << sm) - 1);
  if (e == 0) {
    e = 1;  // subnormal: no implicit bit, the smallest normal exponent
  } else {
    m |= Bits{1} << sm;
  }
  const int t = e - Source::kBias + Target::kBias;  // Target's biased exponent if it is normal
  // Target's unit in the last place, as a power of two of m's unit: below its smallest normal
  // exponent (t < 1) the result is subnormal and the unit stays at 2^(1 - bias - tm). Shifts
  // past sm + 2 all give 0 (the value is below half the smallest subnormal), so they stop there
  // and stay inside Bits.
  int shift = sm - tm + (t < 1 ? 1 - t : 0);
  if (shift > sm + 2) shift = sm + 2;
  // Round to nearest even: add half a unit less one, plus the kept part's lowest bit.
  const Bits q = (m + ((Bits{1} << (shift - 1)) - 1) + ((m >> shift) & 1)) >> shift;
  // q keeps the implicit bit at position tm for a normal result: adding (t - 1) << tm puts the
  // exponent in place, and a carry out of the mantissa (1.11..1 rounding up) moves it up.
  return (static_cast<Bits>(t < 1 ? 0 : t - 1) << tm) + q;
}

/// The bits of Target nearest to the Source value with bits `bits` (ties to even), with the sign
/// kept. A NaN gives `nan` (the caller's canonical pattern). Infinities and magnitudes beyond
/// Target's range give Target::kMaxFinite with `saturate`, else Target::kOverflow (the infinity,
/// or the NaN of a format without infinities).
template <class Source, class Target, class Bits>
constexpr std::uint32_t encode_bits(Bits bits, std::uint32_t nan, bool saturate) noexcept {
  static_assert(std::is_unsigned_v<Bits> && sizeof(Bits) * 8 == Source::kBits,
                "attn::detail::encode_bits: Bits must hold exactly one Source value");
  constexpr auto kSign = static_cast<Bits>(Source::kSignMask);
  constexpr auto kInfinity = static_cast<Bits>(Source::kExponentMask);
  const Bits a = static_cast<Bits>(bits & ~kSign);
  if (a > kInfinity) return nan;
  Bits r = a == kInfinity ? static_cast<Bits>(Target::kMaxFinite + 1)
                          : round_magnitude<Source, Target>(a);
  if (r > Target::kMaxFinite) {
    r = static_cast<Bits>(saturate ? Target::kMaxFinite : Target::kOverflow);
  }
  const auto sign = (bits & kSign) != 0 ? static_cast<std::uint32_t>(Target::kSignMask) : 0u;
  return sign | static_cast<std::uint32_t>(r);
}

/// The bits of Target nearest to a float or double `value` (encode_bits, rounded once); a NaN
/// gives its own sign | `quiet` (Target's quiet NaN, sign bit clear).
template <class Target, class Value>
ATTN_TYPES_CONSTEXPR std::uint32_t encode_value(Value value, std::uint32_t quiet,
                                                bool saturate) noexcept {
  static_assert(std::is_same_v<Value, float> || std::is_same_v<Value, double>,
                "attn::detail::encode_value: float or double");
  constexpr bool kDouble = std::is_same_v<Value, double>;
  using Source = std::conditional_t<kDouble, Float64Format, Float32Format>;
  const auto u = bit_cast<std::conditional_t<kDouble, std::uint64_t, std::uint32_t>>(value);
  const std::uint32_t sign =
      (u & Source::kSignMask) != 0 ? static_cast<std::uint32_t>(Target::kSignMask) : 0u;
  return encode_bits<Source, Target>(u, sign | quiet, saturate);
}

/// The bits of the float equal to the Format value with bits `bits` (exact: every value of the
/// 8- and 16-bit formats is a float), in integer arithmetic. A NaN becomes a quiet float NaN
/// with the same sign and its payload in the top mantissa bits (what PyTorch and x86's F16C
/// conversion give for float16).
template <class Format>
constexpr std::uint32_t decode_to_float_bits(std::uint32_t bits) noexcept {
  static_assert(Format::kBits <= 16 && Format::kExponentBits <= 8,
                "attn::detail::decode_to_float_bits: formats narrower than float");
  constexpr int kM = Format::kMantissaBits;
  const std::uint32_t sign = (bits & Format::kSignMask) != 0 ? 0x80000000u : 0u;
  const std::uint32_t exponent = (bits >> kM) & ((1u << Format::kExponentBits) - 1);
  std::uint32_t mantissa = bits & static_cast<std::uint32_t>(Format::kMantissaMask);
  const std::uint32_t magnitude = bits & ~static_cast<std::uint32_t>(Format::kSignMask);
  const bool special = Format::kIeee ? exponent == (1u << Format::kExponentBits) - 1
                                     : magnitude == Format::kOverflow;
  if (special) {  // infinity (mantissa 0, IEEE formats only) or NaN
    const std::uint32_t payload =
        mantissa == 0 && Format::kIeee ? 0u : 0x00400000u | (mantissa << (23 - kM));
    return sign | 0x7F800000u | payload;
  }
  if (exponent != 0)
    return sign | ((exponent - Format::kBias + 127) << 23) | (mantissa << (23 - kM));
  if (mantissa == 0) return sign;
  // subnormal: mantissa * 2^(1 - bias - kM); normalise it (a normal float: kM <= 10)
  int e = 1 - Format::kBias + 127;
  while ((mantissa & (1u << kM)) == 0) {
    mantissa <<= 1;
    --e;
  }
  return sign | (static_cast<std::uint32_t>(e) << 23) |
         ((mantissa & ((1u << kM) - 1)) << (23 - kM));
}

/// decode_to_float_bits() of every value of an 8-bit format, computed at compile time.
template <class Format>
struct Float8Table {
  static_assert(Format::kBits == 8, "attn::detail::Float8Table: 8-bit formats");
  static constexpr std::array<std::uint32_t, 256> make() noexcept {
    std::array<std::uint32_t, 256> table{};
    for (std::uint32_t b = 0; b < 256; ++b) table[b] = decode_to_float_bits<Format>(b);
    return table;
  }
  static constexpr std::array<std::uint32_t, 256> kFloatBits = make();
};

/// An integer as a double whose correct rounding to any format with at most 51 mantissa bits
/// is that of the integer itself: exact up to 2^53, else rounded to odd (the dropped bits
/// folded into the last kept bit), which keeps the second rounding correct (Boldo and
/// Melquiond, "When double rounding is odd", 2005).
template <class Integer>
constexpr double integer_for_rounding(Integer value) noexcept {
  static_assert(std::is_integral_v<Integer> && sizeof(Integer) <= 8,
                "attn::detail::integer_for_rounding: integers of up to 64 bits");
  if constexpr (std::is_same_v<Integer, bool>) {
    return value ? 1.0 : 0.0;
  } else {
    using Unsigned = std::make_unsigned_t<Integer>;
    const bool negative = value < 0;
    auto magnitude = static_cast<std::uint64_t>(
        negative ? Unsigned(0) - static_cast<Unsigned>(value) : static_cast<Unsigned>(value));
    double scale = 1.0;
    while ((magnitude >> 53) != 0) {  // at most 11 steps: fold the lowest bit into a sticky bit
      magnitude = (magnitude >> 1) | (magnitude & 1);
      scale *= 2.0;
    }
    const double result = static_cast<double>(magnitude) * scale;  // exact
    return negative ? -result : result;
  }
}

/// The std::numeric_limits members every storage type shares (a signed binary floating-point
/// format with subnormals and a quiet NaN, rounded to nearest, without traps): each type's
/// specialisation derives from this and adds its own.
struct StorageFloatLimits {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_quiet_NaN = true;
  static constexpr std::float_denorm_style has_denorm = std::denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr std::float_round_style round_style = std::round_to_nearest;
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int radix = 2;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;
};

}  // namespace detail
ATTN_NAMESPACE_END
