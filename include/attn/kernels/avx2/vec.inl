// SPDX-License-Identifier: MIT
// attn/kernels/avx2/vec.inl: the AVX2 + FMA primitives (8 floats or 4 doubles per ymm).
// Included by attn/kernels/avx2.hpp inside namespace attn::kernels::avx2 and its target
// region; see attn/kernels/generic/all.inl for the members every set provides.

/// 6 rows x 2 ymm: 12 accumulators + 2 B registers + 1 broadcast of 16 registers.
inline constexpr int kMicroRows = 6;
inline constexpr int kMicroVecs = 2;

/// Lane masks for partial loads/stores: the row starting at element 8 - n (16 - n) has n
/// leading -1s.
alignas(32) inline constexpr std::int32_t kMask32[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                                         0,  0,  0,  0,  0,  0,  0,  0};
alignas(32) inline constexpr std::int64_t kMask64[8] = {-1, -1, -1, -1, 0, 0, 0, 0};

template <class Scalar>
struct Vec;

template <>
struct Vec<float> {
  using Scalar = float;
  using Reg = __m256;
  using Mask = __m256;
  static constexpr int kWidth = 8;
  static Reg zero() noexcept { return _mm256_setzero_ps(); }
  static Reg set1(float v) noexcept { return _mm256_set1_ps(v); }
  static Reg load(const float* p) noexcept { return _mm256_loadu_ps(p); }
  static __m256i lanes(Index n) noexcept {
    const Index k = n >= 8 ? 8 : n <= 0 ? 0 : n;
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kMask32 + 8 - k));
  }
  static Reg load_partial(const float* p, Index n) noexcept {
    return _mm256_maskload_ps(p, lanes(n));
  }
  static void store(float* p, Reg v) noexcept { _mm256_storeu_ps(p, v); }
  static void store_partial(float* p, Reg v, Index n) noexcept {
    _mm256_maskstore_ps(p, lanes(n), v);
  }
  static Reg fmadd(Reg a, Reg b, Reg c) noexcept { return _mm256_fmadd_ps(a, b, c); }
  static Reg fnmadd(Reg a, Reg b, Reg c) noexcept { return _mm256_fnmadd_ps(a, b, c); }
  static Reg add(Reg a, Reg b) noexcept { return _mm256_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) noexcept { return _mm256_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) noexcept { return _mm256_mul_ps(a, b); }
  static Reg div(Reg a, Reg b) noexcept { return _mm256_div_ps(a, b); }
  static Reg max(Reg a, Reg b) noexcept { return _mm256_max_ps(a, b); }
  static Reg min(Reg a, Reg b) noexcept { return _mm256_min_ps(a, b); }
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
  static Reg round(Reg x) noexcept {
    return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  /// p * 2^n for integral n in [-252, 254]: two exact multiplications by 2^(n/2) and
  /// 2^(n - n/2), each a normal float built in the exponent field.
  static Reg ldexp(Reg p, Reg n) noexcept {
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i half = _mm256_srai_epi32(ni, 1);
    const __m256i rest = _mm256_sub_epi32(ni, half);
    const __m256i bias = _mm256_set1_epi32(127);
    const Reg s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
    const Reg s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  }
  static Mask less(Reg a, Reg b) noexcept { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  /// Whether every lane of `m` is set.
  static bool all(Mask m) noexcept { return _mm256_movemask_ps(m) == 0xFF; }
  static Mask greater(Reg a, Reg b) noexcept { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
  static Reg select(Mask m, Reg a, Reg b) noexcept { return _mm256_blendv_ps(b, a, m); }
};

template <>
struct Vec<double> {
  using Scalar = double;
  using Reg = __m256d;
  using Mask = __m256d;
  static constexpr int kWidth = 4;
  static Reg zero() noexcept { return _mm256_setzero_pd(); }
  static Reg set1(double v) noexcept { return _mm256_set1_pd(v); }
  static Reg load(const double* p) noexcept { return _mm256_loadu_pd(p); }
  static __m256i lanes(Index n) noexcept {
    const Index k = n >= 4 ? 4 : n <= 0 ? 0 : n;
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kMask64 + 4 - k));
  }
  static Reg load_partial(const double* p, Index n) noexcept {
    return _mm256_maskload_pd(p, lanes(n));
  }
  static void store(double* p, Reg v) noexcept { _mm256_storeu_pd(p, v); }
  static void store_partial(double* p, Reg v, Index n) noexcept {
    _mm256_maskstore_pd(p, lanes(n), v);
  }
  static Reg fmadd(Reg a, Reg b, Reg c) noexcept { return _mm256_fmadd_pd(a, b, c); }
  static Reg fnmadd(Reg a, Reg b, Reg c) noexcept { return _mm256_fnmadd_pd(a, b, c); }
  static Reg add(Reg a, Reg b) noexcept { return _mm256_add_pd(a, b); }
  static Reg sub(Reg a, Reg b) noexcept { return _mm256_sub_pd(a, b); }
  static Reg mul(Reg a, Reg b) noexcept { return _mm256_mul_pd(a, b); }
  static Reg div(Reg a, Reg b) noexcept { return _mm256_div_pd(a, b); }
  static Reg max(Reg a, Reg b) noexcept { return _mm256_max_pd(a, b); }
  static Reg min(Reg a, Reg b) noexcept { return _mm256_min_pd(a, b); }
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
  static Reg round(Reg x) noexcept {
    return _mm256_round_pd(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  /// p * 2^n for integral n in [-2044, 2046] (see Vec<float>::ldexp).
  static Reg ldexp(Reg p, Reg n) noexcept {
    const __m128i ni = _mm256_cvtpd_epi32(n);
    const __m128i half = _mm_srai_epi32(ni, 1);
    const __m128i rest = _mm_sub_epi32(ni, half);
    const __m256i bias = _mm256_set1_epi64x(1023);
    const Reg s1 = _mm256_castsi256_pd(
        _mm256_slli_epi64(_mm256_add_epi64(_mm256_cvtepi32_epi64(half), bias), 52));
    const Reg s2 = _mm256_castsi256_pd(
        _mm256_slli_epi64(_mm256_add_epi64(_mm256_cvtepi32_epi64(rest), bias), 52));
    return _mm256_mul_pd(_mm256_mul_pd(p, s1), s2);
  }
  static Mask less(Reg a, Reg b) noexcept { return _mm256_cmp_pd(a, b, _CMP_LT_OQ); }
  /// Whether every lane of `m` is set.
  static bool all(Mask m) noexcept { return _mm256_movemask_pd(m) == 0xF; }
  static Mask greater(Reg a, Reg b) noexcept { return _mm256_cmp_pd(a, b, _CMP_GT_OQ); }
  static Reg select(Mask m, Reg a, Reg b) noexcept { return _mm256_blendv_pd(b, a, m); }
};

// ---- square block transposes used by packing: dst[c * ldd + r] = src[r * lds + c] ----

template <class Scalar>
constexpr Index transpose_width() noexcept {
  return sizeof(Scalar) == 4 ? 8 : 4;
}
/// No wider form than transpose_block() with AVX2.
template <class Scalar>
constexpr Index transpose_width_wide() noexcept {
  return transpose_width<Scalar>();
}

#include "attn/kernels/avx2/transpose.inl"

template <class Scalar>
inline void transpose_block_wide(const Scalar* src, Index lds, Scalar* dst, Index ldd) noexcept {
  transpose_block(src, lds, dst, ldd);
}
