// SPDX-License-Identifier: MIT
// tests/tensor/types_exhaustive_test.cpp: the storage types' conversions against a brute-force
// reference written here from the formats' definitions: every bit pattern decoded; every float
// (all 2^32) rounded to bfloat16 and float16; a dense set of floats (every midpoint, one ulp
// either side, subnormals, overflow boundaries) rounded to both float8 formats, with and
// without saturation; doubles and integers near every tie. The library's scalar conversions
// and its bulk conversion on every kernel set this CPU runs must give the reference's bits.
//
// The reference: decode each value of a format from sign, exponent and mantissa (std::ldexp,
// exact in double), take the midpoints of consecutive values as the rounding thresholds (ties
// go to the even encoding), and walk the floats in increasing order. The sanitizer build walks
// every 127th float instead of all of them (the unoptimised reference would take minutes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "support/test_support.hpp"

namespace types_exhaustive_test {

namespace {

using attn::Index;
using attn::Isa;

#if defined(__SANITIZE_ADDRESS__)
#define ATTN_TEST_SUBSAMPLE 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ATTN_TEST_SUBSAMPLE 1
#endif
#endif
#ifndef ATTN_TEST_SUBSAMPLE
#define ATTN_TEST_SUBSAMPLE 0
#endif

/// Vectorise a loop (OpenMP's simd; GCC's -O2 cost model leaves these scalar).
#if defined(_OPENMP)
#define ATTN_TEST_SIMD _Pragma("omp simd")
#define ATTN_TEST_SIMD_SUM(x) _Pragma(ATTN_TEST_STR(omp simd reduction(+ : x)))
#define ATTN_TEST_STR(...) #__VA_ARGS__
#else
#define ATTN_TEST_SIMD
#define ATTN_TEST_SIMD_SUM(x)
#endif

/// Floats walked: all of them, or every 127th (a prime: every exponent and low-bit pattern
/// still occurs) in the sanitizer build.
constexpr std::uint64_t kFloatStride = ATTN_TEST_SUBSAMPLE ? 127 : 1;

/// The sweeps choose every kernel set themselves (set_isa), so a run under ATTN_ISA (the test
/// command runs the suite once per narrower set) would repeat them bit for bit: they skip it.
#define ATTN_TEST_SKIP_UNDER_ATTN_ISA()                                        \
  do {                                                                         \
    const char* forced = std::getenv("ATTN_ISA");                              \
    if (forced != nullptr && *forced != '\0') {                                \
      GTEST_SKIP() << "sweeps every kernel set itself; ATTN_ISA=" << forced    \
                   << " would repeat it (the run without ATTN_ISA covers it)"; \
    }                                                                          \
  } while (false)

float float_from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
std::uint64_t bits_of(double d) {
  std::uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
}
bool is_nan_bits(std::uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }

// ---- the reference, from the formats' definitions ----

/// A binary format: `ieee` formats hold +-infinity and NaNs in the all-ones exponent; the
/// other (OCP E4M3) holds finite values there and NaN only in the all-ones pattern.
struct Format {
  const char* name;
  int exponent_bits, mantissa_bits;
  bool ieee;

  int bits() const { return 1 + exponent_bits + mantissa_bits; }
  int bias() const { return (1 << (exponent_bits - 1)) - 1; }
  std::uint32_t sign_bit() const { return 1u << (bits() - 1); }
  std::uint32_t max_finite() const {
    const std::uint32_t top = (1u << exponent_bits) - 1;
    return ieee ? ((top << mantissa_bits) - 1) : (top << mantissa_bits) + (1u << mantissa_bits) - 2;
  }
  bool is_nan(std::uint32_t b) const {
    const std::uint32_t magnitude = b & ~sign_bit();
    return ieee ? magnitude > max_finite() + 1 : magnitude == max_finite() + 1;
  }
  /// The value of magnitude bits b read as a finite number (b = max_finite() + 1 gives the
  /// value the next encoding would have with one more exponent value: the overflow threshold).
  double magnitude_value(std::uint32_t b) const {
    const std::uint32_t e = b >> mantissa_bits, m = b & ((1u << mantissa_bits) - 1);
    if (e == 0) return std::ldexp(static_cast<double>(m), 1 - bias() - mantissa_bits);
    return std::ldexp(static_cast<double>(m + (1u << mantissa_bits)),
                      static_cast<int>(e) - bias() - mantissa_bits);
  }
  /// The value of any bit pattern (NaN for the NaNs, +-infinity for IEEE infinities).
  double value(std::uint32_t b) const {
    if (is_nan(b)) return std::numeric_limits<double>::quiet_NaN();
    const std::uint32_t magnitude = b & ~sign_bit();
    const double v = ieee && magnitude == max_finite() + 1 ? std::numeric_limits<double>::infinity()
                                                           : magnitude_value(magnitude);
    return (b & sign_bit()) != 0 ? -v : v;
  }
};

constexpr Format kBFloat16{"bfloat16", 8, 7, true};
constexpr Format kFloat16{"float16", 5, 10, true};
constexpr Format kE4M3{"float8_e4m3", 4, 3, false};
constexpr Format kE5M2{"float8_e5m2", 5, 2, true};

/// thresholds[k]: the smallest positive float (bits) that rounds to magnitude k + 1 or more.
/// The midpoint of values k and k + 1 is a float (it has at most 12 significant bits); at the
/// midpoint the even encoding wins. The last threshold is the overflow boundary.
std::vector<std::uint32_t> rounding_thresholds(const Format& f) {
  std::vector<std::uint32_t> thresholds;
  for (std::uint32_t k = 0; k <= f.max_finite(); ++k) {
    const double mid = (f.magnitude_value(k) + f.magnitude_value(k + 1)) / 2;
    const auto mid_float = static_cast<float>(mid);
    EXPECT_EQ(static_cast<double>(mid_float), mid) << f.name << " midpoint " << k;
    const std::uint32_t b = bits_of(mid_float);
    thresholds.push_back((k + 1) % 2 == 0 ? b : b + 1);
  }
  return thresholds;
}

/// The NaN each type writes: bfloat16 0x7FC0 (PyTorch's c10::BFloat16), float16 sign | 0x7E00,
/// both float8 types sign | 0x7F.
std::uint32_t nan_result(const Format& f, bool negative) {
  if (f.bits() == 16 && f.exponent_bits == 8) return 0x7FC0;
  const std::uint32_t sign = negative ? f.sign_bit() : 0;
  return sign | (f.bits() == 16 ? 0x7E00u : 0x7Fu);
}

/// The reference encoding of the positive float (bits) `u`, given the walk's position.
struct Walk {
  const std::vector<std::uint32_t>* thresholds;
  std::size_t k = 0;
  explicit Walk(const std::vector<std::uint32_t>& t, std::uint32_t start)
      : thresholds(&t),
        k(static_cast<std::size_t>(std::upper_bound(t.begin(), t.end(), start) - t.begin())) {}
  std::uint32_t operator()(std::uint32_t u) {
    while (k < thresholds->size() && u >= (*thresholds)[k]) ++k;
    return static_cast<std::uint32_t>(k);
  }
};

template <class T>
std::uint32_t raw_bits(T x) {
  return x.bits();
}

// ---- decoding: every pattern ----

template <class T>
void check_every_pattern_decodes(const Format& f) {
  for (std::uint32_t b = 0; b < (1u << f.bits()); ++b) {
    T x = T::from_bits(static_cast<decltype(std::declval<T>().bits())>(b));
    const float got = x;
    const double want = f.value(b);
    if (std::isnan(want)) {
      // A NaN stays a NaN with its sign, made quiet; bfloat16 keeps every bit (bits << 16),
      // the others put the payload in the top mantissa bits (PyTorch's and F16C's rule).
      const std::uint32_t u = bits_of(got);
      ASSERT_TRUE(is_nan_bits(u)) << f.name << " pattern " << b;
      ASSERT_EQ(u >> 31, b >> (f.bits() - 1)) << f.name << " pattern " << b;
      const std::uint32_t payload = b & ((1u << f.mantissa_bits) - 1);
      const std::uint32_t expected =
          f.bits() == 16 && f.exponent_bits == 8
              ? b << 16
              : (u & 0x80000000u) | 0x7FC00000u | (payload << (23 - f.mantissa_bits));
      ASSERT_EQ(u, expected) << f.name << " pattern " << b;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << f.name << " pattern " << b;
      ASSERT_EQ(std::signbit(got), std::signbit(want)) << f.name << " pattern " << b;
    }
    // Round trip: every non-NaN value converts back to its own bits.
    if (!std::isnan(want)) {
      ASSERT_EQ(raw_bits(T(got)), b) << f.name << " pattern " << b;
    }
  }
}

TEST(TypesExhaustive, EveryBFloat16PatternDecodesExactly) {
  check_every_pattern_decodes<attn::bfloat16>(kBFloat16);
}
TEST(TypesExhaustive, EveryFloat16PatternDecodesExactly) {
  check_every_pattern_decodes<attn::float16>(kFloat16);
}
TEST(TypesExhaustive, EveryFloat8E4M3PatternDecodesExactly) {
  check_every_pattern_decodes<attn::float8_e4m3>(kE4M3);
}
TEST(TypesExhaustive, EveryFloat8E5M2PatternDecodesExactly) {
  check_every_pattern_decodes<attn::float8_e5m2>(kE5M2);
}

/// Bulk decoding on every set: all 2^16 (or 2^8) patterns through attn::convert.
template <class T>
void check_bulk_decode(const Format& f) {
  const std::size_t count = std::size_t{1} << f.bits();
  std::vector<T> patterns(count);
  for (std::size_t b = 0; b < count; ++b) {
    patterns[b] = T::from_bits(static_cast<decltype(std::declval<T>().bits())>(b));
  }
  std::vector<float> got(count);
  for (const Isa isa : attn::test::runnable_sets()) {
    attn::set_isa(isa);
    attn::convert(attn::TensorView<const T, 1>(patterns.data(), {Index(count)}),
                  attn::TensorView<float, 1>(got.data(), {Index(count)}));
    for (std::size_t b = 0; b < count; ++b) {
      ASSERT_EQ(bits_of(got[b]), bits_of(static_cast<float>(patterns[b])))
          << f.name << " pattern " << b << " on " << attn::isa_name(isa);
    }
  }
  attn::set_isa(attn::best_isa());
}

TEST(TypesExhaustive, BulkDecodingGivesTheScalarBitsOnEverySet) {
  check_bulk_decode<attn::bfloat16>(kBFloat16);
  check_bulk_decode<attn::float16>(kFloat16);
  check_bulk_decode<attn::float8_e4m3>(kE4M3);
  check_bulk_decode<attn::float8_e5m2>(kE5M2);
}

// ---- encoding every float: bfloat16 and float16 ----

/// Mismatches of a range of floats (the first one described).
struct Mismatches {
  std::uint64_t count = 0;
  std::string first;
};

/// Buffers of one thread, allocated once: fresh pages cost more to touch than the conversions
/// that use them.
template <class T>
using BitsOf = decltype(std::declval<T>().bits());

template <class T>
struct ChunkBuffers {
  std::vector<float> src;
  std::vector<T> dst;
  std::vector<BitsOf<T>> want;  // the expected bits of the positive floats, in T's width
};

/// Index of the first of u0, u0 + stride, ... that is >= t (t > u0).
Index first_at_or_after(std::uint64_t t, std::uint64_t u0, std::uint64_t stride) {
  return static_cast<Index>((t - u0 + stride - 1) / stride);
}

template <class T>
using Encoder = void (*)(const float*, T*, Index);

template <class T>
struct NamedEncoder {
  const char* name;
  Encoder<T> encode;
};

/// Converts the floats u0, u0 + stride, ... (n of them, all below 2^31) and their negatives
/// with each encoder (bulk or scalar) and compares with the reference. The reference is
/// constant between two thresholds, so it is filled in runs; the NaNs are the run above
/// 0x7F800000.
template <class T>
void check_chunk(const Format& f, const std::vector<std::uint32_t>& thresholds, std::uint64_t u0,
                 std::uint64_t stride, Index n, const std::vector<NamedEncoder<T>>& encoders,
                 bool saturate, ChunkBuffers<T>& buffers, Mismatches& out) {
  auto& src = buffers.src;
  auto& dst = buffers.dst;
  auto& want = buffers.want;
  src.resize(static_cast<std::size_t>(n));
  dst.resize(static_cast<std::size_t>(n));
  want.resize(static_cast<std::size_t>(n));
  const std::uint64_t last = u0 + static_cast<std::uint64_t>(n - 1) * stride;
  const Index nan_begin = last <= 0x7F800000u ? n
                          : u0 > 0x7F800000u  ? 0
                                              : first_at_or_after(0x7F800001u, u0, stride);
  auto k = static_cast<std::size_t>(std::upper_bound(thresholds.begin(), thresholds.end(), u0) -
                                    thresholds.begin());
  Index j = 0;
  while (j < nan_begin) {
    const Index run_end = k < thresholds.size() && thresholds[k] <= last
                              ? std::min(nan_begin, first_at_or_after(thresholds[k], u0, stride))
                              : nan_begin;
    const auto value =
        static_cast<BitsOf<T>>(saturate ? std::min<std::size_t>(k, f.max_finite()) : k);
    BitsOf<T>* w = want.data();
    ATTN_TEST_SIMD
    for (Index i = j; i < run_end; ++i) w[i] = value;
    j = run_end;
    ++k;
  }
  for (const std::uint32_t sign : {0u, 0x80000000u}) {
    float* in = src.data();
    const auto base = static_cast<std::uint32_t>(u0) | sign;
    const auto step = static_cast<std::uint32_t>(stride);
    if (step == 1) {
      ATTN_TEST_SIMD
      for (Index i = 0; i < n; ++i) in[i] = float_from_bits(base + static_cast<std::uint32_t>(i));
    } else {
      ATTN_TEST_SIMD
      for (Index i = 0; i < n; ++i) {
        in[i] = float_from_bits(base + static_cast<std::uint32_t>(i) * step);
      }
    }
    for (const auto& encoder : encoders) {
      encoder.encode(src.data(), dst.data(), n);
      const char* what = encoder.name;
      const auto sign_bit = static_cast<BitsOf<T>>(sign != 0 ? f.sign_bit() : 0u);
      const auto nan = static_cast<BitsOf<T>>(nan_result(f, sign != 0));
      const auto expected = [&](Index i) -> std::uint32_t {
        return i < nan_begin ? want[std::size_t(i)] | sign_bit : nan;
      };
      const T* got = dst.data();
      const BitsOf<T>* w = want.data();
      std::uint32_t bad = 0;  // n < 2^32
      ATTN_TEST_SIMD_SUM(bad)
      for (Index i = 0; i < nan_begin; ++i) {
        bad += got[i].bits() != static_cast<BitsOf<T>>(w[i] | sign_bit);
      }
      ATTN_TEST_SIMD_SUM(bad)
      for (Index i = nan_begin; i < n; ++i) bad += got[i].bits() != nan;
      if (bad != 0 && out.count == 0) {
        for (Index i = 0; i < n; ++i) {
          if (raw_bits(dst[std::size_t(i)]) == expected(i)) continue;
          char text[160];
          std::snprintf(text, sizeof text, "%s %s: float 0x%08x gives 0x%x, expected 0x%x", f.name,
                        what, static_cast<unsigned>(bits_of(src[std::size_t(i)])),
                        static_cast<unsigned>(raw_bits(dst[std::size_t(i)])),
                        static_cast<unsigned>(expected(i)));
          out.first = text;
          break;
        }
      }
      out.count += bad;
    }
  }
}

/// Every positive float pattern (or every stride-th), with its negative, in chunks shared out
/// over the threads.
template <class T>
void check_every_float(const Format& f, std::uint64_t stride,
                       const std::vector<NamedEncoder<T>>& encoders, bool saturate = false) {
  const auto thresholds = rounding_thresholds(f);
  constexpr Index kChunk = Index{1} << 15;
  const std::uint64_t count = ((std::uint64_t{1} << 31) + stride - 1) / stride;  // u < 2^31
  const auto chunks = static_cast<std::int64_t>((count + kChunk - 1) / kChunk);
  std::uint64_t total = 0;
  std::string first;
#if defined(_OPENMP)
#pragma omp parallel reduction(+ : total)
#endif
  {
    ChunkBuffers<T> buffers;
    Mismatches m;
#if defined(_OPENMP)
#pragma omp for schedule(dynamic, 64)
#endif
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::uint64_t start = static_cast<std::uint64_t>(c) * kChunk;
      const Index n = static_cast<Index>(std::min<std::uint64_t>(kChunk, count - start));
      check_chunk<T>(f, thresholds, start * stride, stride, n, encoders, saturate, buffers, m);
    }
    total += m.count;
    if (m.count != 0) {
#if defined(_OPENMP)
#pragma omp critical
#endif
      if (first.empty()) first = m.first;
    }
  }
  EXPECT_EQ(total, 0u) << first;
}

/// attn::convert of a row on the current set.
template <class T>
void bulk(const float* src, T* dst, Index n) {
  attn::convert(attn::TensorView<const float, 1>(src, {n}), attn::TensorView<T, 1>(dst, {n}));
}

/// attn::convert_saturate of a row on the current set.
template <class T>
void bulk_saturate(const float* src, T* dst, Index n) {
  attn::convert_saturate(attn::TensorView<const float, 1>(src, {n}),
                         attn::TensorView<T, 1>(dst, {n}));
}

/// The type's constructor on each element (constructed in place: GCC vectorises the
/// bfloat16 loop then, and the check takes a fraction of the time).
template <class T>
void scalar(const float* src, T* dst, Index n) {
  ATTN_TEST_SIMD
  for (Index i = 0; i < n; ++i) ::new (static_cast<void*>(dst + i)) T(src[i]);
}

/// The scalar conversion (the type's constructor, which every set's row tail uses) and the
/// best set's bulk conversion, on every float.
TEST(TypesExhaustive, EveryFloatRoundsToNearestEvenBFloat16) {
  ATTN_TEST_SKIP_UNDER_ATTN_ISA();
  attn::set_isa(attn::best_isa());
  check_every_float<attn::bfloat16>(
      kBFloat16, kFloatStride,
      {{"bfloat16(float)", scalar<attn::bfloat16>}, {"convert", bulk<attn::bfloat16>}});
}

TEST(TypesExhaustive, EveryFloatRoundsToNearestEvenFloat16) {
  ATTN_TEST_SKIP_UNDER_ATTN_ISA();
  attn::set_isa(attn::best_isa());
  check_every_float<attn::float16>(
      kFloat16, kFloatStride,
      {{"float16(float)", scalar<attn::float16>}, {"convert", bulk<attn::float16>}});
}

/// Every set on a subset of the floats: the narrower sets' float16 and bfloat16 rows on every
/// 61st (the best set's are checked on every float above), every set's float8 rows, with and
/// without saturation, on every 251st (the dense set below has every midpoint); 127 times
/// fewer in the sanitizer build.
TEST(TypesExhaustive, EverySetRoundsLikeTheReferenceOnASubsetOfFloats) {
  ATTN_TEST_SKIP_UNDER_ATTN_ISA();
  for (const Isa isa : attn::test::runnable_sets()) {
    SCOPED_TRACE(attn::isa_name(isa));
    attn::set_isa(isa);
    if (isa != attn::best_isa()) {
      check_every_float<attn::bfloat16>(kBFloat16, kFloatStride * 61,
                                        {{"convert", bulk<attn::bfloat16>}});
      check_every_float<attn::float16>(kFloat16, kFloatStride * 61,
                                       {{"convert", bulk<attn::float16>}});
    }
    check_every_float<attn::float8_e4m3>(kE4M3, kFloatStride * 251,
                                         {{"convert", bulk<attn::float8_e4m3>}});
    check_every_float<attn::float8_e4m3>(
        kE4M3, kFloatStride * 251, {{"convert_saturate", bulk_saturate<attn::float8_e4m3>}}, true);
    check_every_float<attn::float8_e5m2>(kE5M2, kFloatStride * 251,
                                         {{"convert", bulk<attn::float8_e5m2>}});
    check_every_float<attn::float8_e5m2>(
        kE5M2, kFloatStride * 251, {{"convert_saturate", bulk_saturate<attn::float8_e5m2>}}, true);
  }
  attn::set_isa(attn::best_isa());
}

// ---- float8: a dense set of floats ----

/// Top patterns of the dense set walked: all, or every 13th in the sanitizer build.
constexpr std::uint32_t kDenseStep = ATTN_TEST_SUBSAMPLE ? 13 : 1;

/// Floats in increasing order: every pattern of the top 20 bits (sign excluded: 19 more
/// exponent and mantissa bits than float8 has) with low 12 bits 0, 1, 0x7FF, 0x800, 0x801 and
/// 0xFFF. Every float8 midpoint has zero low bits, so each midpoint, one float ulp below it
/// (0xFFF under the previous top pattern) and one above are all here, as are every float8
/// value, the subnormals, the overflow boundaries (448, 464, 480; 57344, 61440, 65536) and
/// the infinities and NaNs.
std::vector<std::uint32_t> dense_floats() {
  std::vector<std::uint32_t> u;
  for (std::uint32_t top = 0; top < (1u << 19); top += kDenseStep) {
    for (const std::uint32_t low : {0x000u, 0x001u, 0x7FFu, 0x800u, 0x801u, 0xFFFu}) {
      u.push_back((top << 12) | low);
    }
  }
  return u;
}

template <class T>
void check_float8(const Format& f) {
  const auto thresholds = rounding_thresholds(f);
  const auto floats = dense_floats();
  const auto n = static_cast<Index>(floats.size());
  std::vector<float> src(floats.size());
  for (const std::uint32_t sign : {0u, 0x80000000u}) {
    for (std::size_t i = 0; i < floats.size(); ++i) src[i] = float_from_bits(floats[i] | sign);
    // the expected bits, without and with saturation
    std::vector<std::uint32_t> plain(floats.size()), saturated(floats.size());
    Walk walk(thresholds, 0);
    for (std::size_t i = 0; i < floats.size(); ++i) {
      const std::uint32_t u = floats[i];
      if (is_nan_bits(u)) {
        plain[i] = saturated[i] = nan_result(f, sign != 0);
        continue;
      }
      const std::uint32_t k = walk(u), s = sign != 0 ? f.sign_bit() : 0u;
      // Overflow: the walk's last step is the infinity (IEEE) or the NaN (E4M3).
      plain[i] = k | s;
      saturated[i] = std::min(k, f.max_finite()) | s;
    }
    for (std::size_t i = 0; i < floats.size(); ++i) {
      ASSERT_EQ(T(src[i]).bits(), plain[i]) << f.name << " float 0x" << std::hex << bits_of(src[i]);
      ASSERT_EQ(T::from_float(src[i]).bits(), plain[i]) << f.name << std::hex << bits_of(src[i]);
      ASSERT_EQ(T::from_float_saturate(src[i]).bits(), saturated[i])
          << f.name << " saturating, float 0x" << std::hex << bits_of(src[i]);
    }
    std::vector<T> got(floats.size()), got_saturated(floats.size());
    for (const Isa isa : attn::test::runnable_sets()) {
      attn::set_isa(isa);
      const attn::TensorView<const float, 1> in(src.data(), {n});
      attn::convert(in, attn::TensorView<T, 1>(got.data(), {n}));
      attn::convert_saturate(in, attn::TensorView<T, 1>(got_saturated.data(), {n}));
      for (std::size_t i = 0; i < floats.size(); ++i) {
        ASSERT_EQ(got[i].bits(), plain[i]) << attn::isa_name(isa) << " float " << i;
        ASSERT_EQ(got_saturated[i].bits(), saturated[i]) << attn::isa_name(isa) << " float " << i;
      }
    }
    attn::set_isa(attn::best_isa());
  }
}

TEST(TypesExhaustive, DenseFloatsRoundToNearestEvenFloat8E4M3) {
  ATTN_TEST_SKIP_UNDER_ATTN_ISA();
  check_float8<attn::float8_e4m3>(kE4M3);
}
TEST(TypesExhaustive, DenseFloatsRoundToNearestEvenFloat8E5M2) {
  ATTN_TEST_SKIP_UNDER_ATTN_ISA();
  check_float8<attn::float8_e5m2>(kE5M2);
}

// ---- doubles and integers: rounded once ----

/// The reference for a double: the nearest value by exact comparison of distances (both are
/// exact in double: the neighbours are within a factor 2 of x, or x is below 2^-14).
std::uint32_t reference_from_double(const Format& f, double x, bool saturate) {
  if (std::isnan(x)) return nan_result(f, std::signbit(x));
  const std::uint32_t sign = std::signbit(x) ? f.sign_bit() : 0u;
  const double a = std::fabs(x);
  std::uint32_t k;
  if (a >= f.magnitude_value(f.max_finite() + 1)) {
    k = f.max_finite() + 1;
  } else {
    std::uint32_t lo = 0, hi = f.max_finite() + 1;  // value(lo) <= a < value(hi)
    while (hi - lo > 1) {
      const std::uint32_t mid = (lo + hi) / 2;
      (f.magnitude_value(mid) <= a ? lo : hi) = mid;
    }
    const double below = a - f.magnitude_value(lo), above = f.magnitude_value(hi) - a;
    k = below < above ? lo : above < below ? hi : (lo % 2 == 0 ? lo : hi);
  }
  if (k > f.max_finite()) k = saturate ? f.max_finite() : f.max_finite() + 1;
  return k | sign;
}

/// Doubles: every midpoint of the format, and a relative 2^-40 (below float's resolution:
/// rounding through float would erase it) and 2^-20 either side; random doubles.
template <class T>
void check_doubles(const Format& f) {
  std::vector<double> xs;
  for (std::uint32_t k = 0; k <= f.max_finite(); ++k) {
    const double mid = (f.magnitude_value(k) + f.magnitude_value(k + 1)) / 2;
    for (const double r : {0.0, 0x1p-40, -0x1p-40, 0x1p-20, -0x1p-20}) {
      xs.push_back(mid * (1 + r));
      xs.push_back(-mid * (1 + r));
    }
  }
  std::mt19937_64 gen(5);
  std::uniform_real_distribution<double> exponent(-160.0, 140.0);
  for (int i = 0; i < 20000; ++i) xs.push_back(std::exp2(exponent(gen)) * (i % 2 ? -1 : 1));
  for (const double x :
       {0.0, -0.0, std::numeric_limits<double>::infinity(),
        -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN(),
        -std::nan(""), 1e308, std::numeric_limits<double>::denorm_min()}) {
    xs.push_back(x);
  }
  for (const double x : xs) {
    ASSERT_EQ(T(x).bits(), reference_from_double(f, x, false))
        << f.name << " double 0x" << std::hex << bits_of(x);
  }
}

TEST(TypesExhaustive, DoublesRoundOnceToNearestEven) {
  check_doubles<attn::bfloat16>(kBFloat16);
  check_doubles<attn::float16>(kFloat16);
  check_doubles<attn::float8_e4m3>(kE4M3);
  check_doubles<attn::float8_e5m2>(kE5M2);
}

TEST(TypesExhaustive, DoubleRoundingThroughFloatDiffersFromRoundingOnce) {
  // 1 + 2^-8 + 2^-40: above the tie between bfloat16's 1 and 1 + 2^-7; as a float it is the
  // tie itself, which goes to the even 1.
  const double x = 1.0 + 0x1p-8 + 0x1p-40;
  EXPECT_EQ(attn::bfloat16(x).bits(), 0x3F81);
  EXPECT_EQ(attn::bfloat16(static_cast<float>(x)).bits(), 0x3F80);  // PyTorch's bits
  const double y = 1.0 + 0x1p-11 + 0x1p-40;
  EXPECT_EQ(attn::float16(y).bits(), 0x3C01);
  EXPECT_EQ(attn::float16(static_cast<float>(y)).bits(), 0x3C00);
}

/// An integer's magnitude rounded to `precision` significant bits, nearest even, in integer
/// arithmetic, as a double (exact: at most 11 significant bits).
double integer_rounded(std::uint64_t magnitude, int precision) {
  int width = 0;
  while (width < 64 && (magnitude >> width) != 0) ++width;
  if (width <= precision) return static_cast<double>(magnitude);
  const int dropped = width - precision;
  std::uint64_t kept = magnitude >> dropped;
  const std::uint64_t rest = magnitude & ((std::uint64_t{1} << dropped) - 1);
  const std::uint64_t half = std::uint64_t{1} << (dropped - 1);
  if (rest > half || (rest == half && (kept & 1) != 0)) ++kept;
  return std::ldexp(static_cast<double>(kept), dropped);
}

/// Integers round once too, also above 2^53 where a double would round first. The reference
/// rounds the integer to the format's precision in integer arithmetic (exact for normal
/// results, which every integer but 0 gives), then applies the double reference to that exact
/// value (which only adds the overflow rule).
TEST(TypesExhaustive, IntegersRoundOnce) {
  std::mt19937_64 gen(9);
  for (int i = 0; i < 200000; ++i) {
    const auto v = static_cast<std::int64_t>(gen() >> (i % 64));
    for (const std::int64_t x : {v, -v}) {
      const std::uint64_t magnitude =
          x < 0 ? std::uint64_t{0} - static_cast<std::uint64_t>(x) : static_cast<std::uint64_t>(x);
      const double sign = x < 0 ? -1.0 : 1.0;
      ASSERT_EQ(attn::bfloat16(x).bits(),
                reference_from_double(kBFloat16, sign * integer_rounded(magnitude, 8), false))
          << x;
      ASSERT_EQ(attn::float16(x).bits(),
                reference_from_double(kFloat16, sign * integer_rounded(magnitude, 11), false))
          << x;
      ASSERT_EQ(attn::float8_e4m3(x).bits(),
                reference_from_double(kE4M3, sign * integer_rounded(magnitude, 4), false))
          << x;
      ASSERT_EQ(attn::float8_e5m2(x).bits(),
                reference_from_double(kE5M2, sign * integer_rounded(magnitude, 3), false))
          << x;
    }
  }
  EXPECT_EQ(attn::bfloat16(std::int64_t{0x0101000000000001}).bits(), 0x5B81);  // tie + sticky
  EXPECT_EQ(attn::bfloat16(std::int64_t{0x0101000000000000}).bits(), 0x5B80);  // tie: even
  EXPECT_EQ(attn::bfloat16(std::numeric_limits<std::uint64_t>::max()).bits(), 0x5F80);  // 2^64
  EXPECT_EQ(attn::bfloat16(std::numeric_limits<std::int64_t>::min()).bits(), 0xDF00);
  EXPECT_EQ(attn::float16(65520).bits(), 0x7C00);
  EXPECT_EQ(attn::float16(true).bits(), 0x3C00);
  EXPECT_EQ(attn::float8_e5m2(-3).bits(), 0xC2);
}

}  // namespace

}  // namespace types_exhaustive_test

#undef ATTN_TEST_SUBSAMPLE
#undef ATTN_TEST_SIMD
#undef ATTN_TEST_SIMD_SUM
#undef ATTN_TEST_STR
#undef ATTN_TEST_SKIP_UNDER_ATTN_ISA
