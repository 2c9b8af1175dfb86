// SPDX-License-Identifier: MIT
// attn/detail/simd.hpp: the few SIMD operations the kernels need, for AVX-512, AVX2+FMA
// and a portable scalar fallback, chosen at compile time from the target flags
// (-march=native picks the widest the machine has).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include "attn/config.hpp"

namespace attn {
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
/// load_partial(p, n) (lanes >= n read as 0, no memory touched there), store(),
/// store_partial(), fmadd(a, b, c) = a * b + c, add, sub, mul, max, reduce_add, reduce_max,
/// exp (accurate to a few ulp; exp(-inf) = 0, underflow gives 0).
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
    return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1u);
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
    return n >= 8 ? __mmask8(0xff) : __mmask8((1u << n) - 1u);
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
    const Index k = n >= 8 ? 8 : n;
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
    const Index k = n >= 4 ? 4 : n;
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

}  // namespace simd
}  // namespace detail
}  // namespace attn
