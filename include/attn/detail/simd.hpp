// SPDX-License-Identifier: MIT
// attn/detail/simd.hpp: the few SIMD operations the kernels need, for AVX-512, AVX2+FMA
// and a portable scalar fallback, chosen at compile time from the target flags
// (-march=native picks the widest the machine has).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "attn/config.hpp"

// After attn/config.hpp, which reads this header first on GCC (see its note on GCC 12).
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

ATTN_NAMESPACE_BEGIN
namespace detail {
namespace simd {

/// The name of the instruction set the kernels were compiled for.
inline constexpr const char* kInstructionSet =
#if defined(__AVX512F__)
    "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
    "avx2";
#else
    "scalar";
#endif

/// Vec<Scalar>: one register of Scalar lanes. Members: kWidth, zero(), set1(), load(),
/// load_partial(p, n) (lanes >= n read as 0, no memory touched there; n <= 0 touches none),
/// store(), store_partial() (likewise), fmadd(a, b, c) = a * b + c, add, sub, mul, max,
/// reduce_add, reduce_max, exp (accurate to a few ulp; exp(-inf) = 0, underflow gives 0).
template <class Scalar>
struct Vec;

// ---- polynomial exp, shared by the vector types (Cephes coefficients) ----
//
// exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2].

#if defined(__AVX512F__)

template <>
struct Vec<float> {
  using Reg = __m512;
  static constexpr int kWidth = 16;
  static Reg zero() noexcept { return _mm512_setzero_ps(); }
  static Reg set1(float v) noexcept { return _mm512_set1_ps(v); }
  static Reg load(const float* p) noexcept { return _mm512_loadu_ps(p); }
  static __mmask16 mask(Index n) noexcept {
    return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1u);
  }
  static Reg load_partial(const float* p, Index n) noexcept {
    return _mm512_maskz_loadu_ps(mask(n), p);
  }
  static void store(float* p, Reg v) noexcept { _mm512_storeu_ps(p, v); }
  static void store_partial(float* p, Reg v, Index n) noexcept {
    _mm512_mask_storeu_ps(p, mask(n), v);
  }
  static Reg fmadd(Reg a, Reg b, Reg c) noexcept { return _mm512_fmadd_ps(a, b, c); }
  static Reg add(Reg a, Reg b) noexcept { return _mm512_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) noexcept { return _mm512_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) noexcept { return _mm512_mul_ps(a, b); }
  static Reg max(Reg a, Reg b) noexcept { return _mm512_max_ps(a, b); }
  static float reduce_add(Reg v) noexcept { return _mm512_reduce_add_ps(v); }
  static float reduce_max(Reg v) noexcept { return _mm512_reduce_max_ps(v); }
  static Reg exp(Reg x) noexcept {
    const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33654f), _CMP_LT_OQ);
    x = _mm512_min_ps(x, _mm512_set1_ps(88.37626f));
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.33654f));
    const Reg n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    Reg r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    Reg p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~under), p, n);
  }
};

template <>
struct Vec<double> {
  using Reg = __m512d;
  static constexpr int kWidth = 8;
  static Reg zero() noexcept { return _mm512_setzero_pd(); }
  static Reg set1(double v) noexcept { return _mm512_set1_pd(v); }
  static Reg load(const double* p) noexcept { return _mm512_loadu_pd(p); }
  static __mmask8 mask(Index n) noexcept {
    return n >= 8 ? __mmask8(0xff) : n <= 0 ? __mmask8(0) : __mmask8((1u << n) - 1u);
  }
  static Reg load_partial(const double* p, Index n) noexcept {
    return _mm512_maskz_loadu_pd(mask(n), p);
  }
  static void store(double* p, Reg v) noexcept { _mm512_storeu_pd(p, v); }
  static void store_partial(double* p, Reg v, Index n) noexcept {
    _mm512_mask_storeu_pd(p, mask(n), v);
  }
  static Reg fmadd(Reg a, Reg b, Reg c) noexcept { return _mm512_fmadd_pd(a, b, c); }
  static Reg add(Reg a, Reg b) noexcept { return _mm512_add_pd(a, b); }
  static Reg sub(Reg a, Reg b) noexcept { return _mm512_sub_pd(a, b); }
  static Reg mul(Reg a, Reg b) noexcept { return _mm512_mul_pd(a, b); }
  static Reg max(Reg a, Reg b) noexcept { return _mm512_max_pd(a, b); }
  static double reduce_add(Reg v) noexcept { return _mm512_reduce_add_pd(v); }
  static double reduce_max(Reg v) noexcept { return _mm512_reduce_max_pd(v); }
  static Reg exp(Reg x) noexcept {
    const __mmask8 under = _mm512_cmp_pd_mask(x, _mm512_set1_pd(-708.3964185322641), _CMP_LT_OQ);
    x = _mm512_min_pd(x, _mm512_set1_pd(709.436139303102));
    x = _mm512_max_pd(x, _mm512_set1_pd(-708.3964185322641));
    const Reg n = _mm512_roundscale_pd(_mm512_mul_pd(x, _mm512_set1_pd(1.4426950408889634)),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    Reg r = _mm512_fnmadd_pd(n, _mm512_set1_pd(6.93145751953125e-1), x);
    r = _mm512_fnmadd_pd(n, _mm512_set1_pd(1.42860682030941723212e-6), r);
    // Taylor polynomial of degree 13 on |r| <= 0.347: error below 1e-17 relative.
    Reg p = _mm512_set1_pd(1.0 / 6227020800.0);
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 479001600.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 39916800.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 3628800.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 362880.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 40320.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 5040.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 720.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 120.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 24.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 6.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(0.5));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
    return _mm512_maskz_scalef_pd(static_cast<__mmask8>(~under), p, n);
  }
};

#elif defined(__AVX2__) && defined(__FMA__)

namespace avx2 {
// Lane masks for partial loads/stores: element i of row n is -1 when i < n.
alignas(32) inline constexpr std::int32_t kMask32[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                                         0,  0,  0,  0,  0,  0,  0,  0};
alignas(32) inline constexpr std::int64_t kMask64[8] = {-1, -1, -1, -1, 0, 0, 0, 0};
}  // namespace avx2

template <>
struct Vec<float> {
  using Reg = __m256;
  static constexpr int kWidth = 8;
  static Reg zero() noexcept { return _mm256_setzero_ps(); }
  static Reg set1(float v) noexcept { return _mm256_set1_ps(v); }
  static Reg load(const float* p) noexcept { return _mm256_loadu_ps(p); }
  static __m256i mask(Index n) noexcept {
    const Index k = n >= 8 ? 8 : n <= 0 ? 0 : n;
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(avx2::kMask32 + 8 - k));
  }
  static Reg load_partial(const float* p, Index n) noexcept {
    return _mm256_maskload_ps(p, mask(n));
  }
  static void store(float* p, Reg v) noexcept { _mm256_storeu_ps(p, v); }
  static void store_partial(float* p, Reg v, Index n) noexcept {
    _mm256_maskstore_ps(p, mask(n), v);
  }
  static Reg fmadd(Reg a, Reg b, Reg c) noexcept { return _mm256_fmadd_ps(a, b, c); }
  static Reg add(Reg a, Reg b) noexcept { return _mm256_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) noexcept { return _mm256_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) noexcept { return _mm256_mul_ps(a, b); }
  static Reg max(Reg a, Reg b) noexcept { return _mm256_max_ps(a, b); }
  static float reduce_add(Reg v) noexcept {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float reduce_max(Reg v) noexcept {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static Reg exp(Reg x) noexcept {
    const Reg under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33654f), _CMP_LT_OQ);
    x = _mm256_min_ps(x, _mm256_set1_ps(88.37626f));
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.33654f));
    const Reg n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    Reg r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    Reg p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    // 2^n by building the exponent field; n in [-126, 128], the top case handled by
    // multiplying twice by 2^(n/2).
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i half = _mm256_srai_epi32(ni, 1);
    const __m256i rest = _mm256_sub_epi32(ni, half);
    const Reg s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
    const Reg s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, _mm256_set1_epi32(127)), 23));
    return _mm256_andnot_ps(under, _mm256_mul_ps(_mm256_mul_ps(p, s1), s2));
  }
};

template <>
struct Vec<double> {
  using Reg = __m256d;
  static constexpr int kWidth = 4;
  static Reg zero() noexcept { return _mm256_setzero_pd(); }
  static Reg set1(double v) noexcept { return _mm256_set1_pd(v); }
  static Reg load(const double* p) noexcept { return _mm256_loadu_pd(p); }
  static __m256i mask(Index n) noexcept {
    const Index k = n >= 4 ? 4 : n <= 0 ? 0 : n;
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(avx2::kMask64 + 4 - k));
  }
  static Reg load_partial(const double* p, Index n) noexcept {
    return _mm256_maskload_pd(p, mask(n));
  }
  static void store(double* p, Reg v) noexcept { _mm256_storeu_pd(p, v); }
  static void store_partial(double* p, Reg v, Index n) noexcept {
    _mm256_maskstore_pd(p, mask(n), v);
  }
  static Reg fmadd(Reg a, Reg b, Reg c) noexcept { return _mm256_fmadd_pd(a, b, c); }
  static Reg add(Reg a, Reg b) noexcept { return _mm256_add_pd(a, b); }
  static Reg sub(Reg a, Reg b) noexcept { return _mm256_sub_pd(a, b); }
  static Reg mul(Reg a, Reg b) noexcept { return _mm256_mul_pd(a, b); }
  static Reg max(Reg a, Reg b) noexcept { return _mm256_max_pd(a, b); }
  static double reduce_add(Reg v) noexcept {
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    s = _mm_add_sd(s, _mm_unpackhi_pd(s, s));
    return _mm_cvtsd_f64(s);
  }
  static double reduce_max(Reg v) noexcept {
    __m128d s = _mm_max_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    s = _mm_max_sd(s, _mm_unpackhi_pd(s, s));
    return _mm_cvtsd_f64(s);
  }
  static Reg exp(Reg x) noexcept {
    alignas(32) double lanes[4];
    _mm256_store_pd(lanes, x);
    for (double& v : lanes) v = std::exp(v);
    return _mm256_load_pd(lanes);
  }
};

#else

/// Portable fallback: one lane, plain C++ (the compiler may still auto-vectorise loops).
template <class Scalar>
struct Vec {
  using Reg = Scalar;
  static constexpr int kWidth = 1;
  static Reg zero() noexcept { return Scalar(0); }
  static Reg set1(Scalar v) noexcept { return v; }
  static Reg load(const Scalar* p) noexcept { return *p; }
  static Reg load_partial(const Scalar* p, Index n) noexcept { return n > 0 ? *p : Scalar(0); }
  static void store(Scalar* p, Reg v) noexcept { *p = v; }
  static void store_partial(Scalar* p, Reg v, Index n) noexcept {
    if (n > 0) *p = v;
  }
  static Reg fmadd(Reg a, Reg b, Reg c) noexcept { return a * b + c; }
  static Reg add(Reg a, Reg b) noexcept { return a + b; }
  static Reg sub(Reg a, Reg b) noexcept { return a - b; }
  static Reg mul(Reg a, Reg b) noexcept { return a * b; }
  static Reg max(Reg a, Reg b) noexcept { return a > b ? a : b; }
  static Scalar reduce_add(Reg v) noexcept { return v; }
  static Scalar reduce_max(Reg v) noexcept { return v; }
  static Reg exp(Reg x) noexcept { return std::exp(x); }
};

#endif

// ---- square block transposes used by packing: dst[c * ldd + r] = src[r * lds + c] ----

/// Side of the square block transpose_block() handles (1 = no fast path).
template <class Scalar>
constexpr Index transpose_width() noexcept {
#if defined(__AVX2__)
  return sizeof(Scalar) == 4 ? 8 : 4;
#else
  return 1;
#endif
}

/// Side of the wide block transpose_block_wide() handles: 16 floats with AVX-512, else the
/// same as transpose_width() (callers use transpose_block_wide() only when
/// transpose_width_wide() > transpose_width()).
template <class Scalar>
constexpr Index transpose_width_wide() noexcept {
#if defined(__AVX512F__)
  return sizeof(Scalar) == 4 ? 16 : transpose_width<Scalar>();
#else
  return transpose_width<Scalar>();
#endif
}

#if defined(__AVX2__)
inline void transpose_block(const float* src, Index lds, float* dst, Index ldd) noexcept {
  // 8x8 in registers: unpack pairs, then 4-lane shuffles, then 128-bit lane permutes.
  __m256 r0 = _mm256_loadu_ps(src + 0 * lds), r1 = _mm256_loadu_ps(src + 1 * lds);
  __m256 r2 = _mm256_loadu_ps(src + 2 * lds), r3 = _mm256_loadu_ps(src + 3 * lds);
  __m256 r4 = _mm256_loadu_ps(src + 4 * lds), r5 = _mm256_loadu_ps(src + 5 * lds);
  __m256 r6 = _mm256_loadu_ps(src + 6 * lds), r7 = _mm256_loadu_ps(src + 7 * lds);
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
  const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  _mm256_storeu_ps(dst + 0 * ldd, _mm256_permute2f128_ps(s0, s4, 0x20));
  _mm256_storeu_ps(dst + 1 * ldd, _mm256_permute2f128_ps(s1, s5, 0x20));
  _mm256_storeu_ps(dst + 2 * ldd, _mm256_permute2f128_ps(s2, s6, 0x20));
  _mm256_storeu_ps(dst + 3 * ldd, _mm256_permute2f128_ps(s3, s7, 0x20));
  _mm256_storeu_ps(dst + 4 * ldd, _mm256_permute2f128_ps(s0, s4, 0x31));
  _mm256_storeu_ps(dst + 5 * ldd, _mm256_permute2f128_ps(s1, s5, 0x31));
  _mm256_storeu_ps(dst + 6 * ldd, _mm256_permute2f128_ps(s2, s6, 0x31));
  _mm256_storeu_ps(dst + 7 * ldd, _mm256_permute2f128_ps(s3, s7, 0x31));
}

inline void transpose_block(const double* src, Index lds, double* dst, Index ldd) noexcept {
  const __m256d r0 = _mm256_loadu_pd(src + 0 * lds), r1 = _mm256_loadu_pd(src + 1 * lds);
  const __m256d r2 = _mm256_loadu_pd(src + 2 * lds), r3 = _mm256_loadu_pd(src + 3 * lds);
  const __m256d t0 = _mm256_unpacklo_pd(r0, r1), t1 = _mm256_unpackhi_pd(r0, r1);
  const __m256d t2 = _mm256_unpacklo_pd(r2, r3), t3 = _mm256_unpackhi_pd(r2, r3);
  _mm256_storeu_pd(dst + 0 * ldd, _mm256_permute2f128_pd(t0, t2, 0x20));
  _mm256_storeu_pd(dst + 1 * ldd, _mm256_permute2f128_pd(t1, t3, 0x20));
  _mm256_storeu_pd(dst + 2 * ldd, _mm256_permute2f128_pd(t0, t2, 0x31));
  _mm256_storeu_pd(dst + 3 * ldd, _mm256_permute2f128_pd(t1, t3, 0x31));
}
#else
template <class Scalar>
inline void transpose_block(const Scalar* src, Index, Scalar* dst, Index) noexcept {
  *dst = *src;
}
#endif

#if defined(__AVX512F__)
/// 16x16 floats in zmm registers: unpack pairs, 4-lane shuffles, then two rounds of 128-bit
/// lane shuffles. 64 shuffles per 256 elements against the 8x8 form's 96 (bench: packing a
/// 1536 x 512 weight 0.56 -> 0.37 cycles per element).
inline void transpose_block_wide(const float* src, Index lds, float* dst, Index ldd) noexcept {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  // r[4g + c], lane block q: rows 4g..4g+3 of source columns 4q + c.
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
  }
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + i * ldd, r[i]);
}
#else
/// Declared for name lookup only: without AVX-512 no caller reaches it (see
/// transpose_width_wide()).
template <class Scalar>
inline void transpose_block_wide(const Scalar* src, Index lds, Scalar* dst,
                                 Index ldd) noexcept {
  transpose_block(src, lds, dst, ldd);
}
#endif

}  // namespace simd
}  // namespace detail
ATTN_NAMESPACE_END
