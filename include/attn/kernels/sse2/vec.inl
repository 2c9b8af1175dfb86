// SPDX-License-Identifier: MIT
// attn/kernels/sse2/vec.inl: the SSE2 primitives (4 floats or 2 doubles per xmm), the
// baseline every x86-64 CPU has. No FMA: fmadd is a multiply then an add (two roundings).
// Included by attn/kernels/sse2.hpp inside namespace attn::kernels::sse2 and its target
// region; see attn/kernels/generic/all.inl for the members every set provides.

/// 6 rows x 2 xmm: 12 accumulators + 2 B registers + 1 broadcast of 16 registers (the same
/// shape as AVX2's; 8 columns divide the attention kernel's 64-query tiles).
inline constexpr int kMicroRows = 6;
inline constexpr int kMicroVecs = 2;

template <class Scalar>
struct Vec;

/// Partial loads and stores without masked instructions (SSE2 has none that are fast):
/// through a small buffer, touching only the first n elements of memory.
template <class V, class Scalar = typename V::Scalar>
inline typename V::Reg sse2_load_partial(const Scalar* p, Index n) noexcept {
  alignas(16) Scalar lanes[V::kWidth] = {};
  for (Index i = 0; i < n && i < V::kWidth; ++i) lanes[i] = p[i];
  return V::load(lanes);
}
template <class V, class Scalar = typename V::Scalar>
inline void sse2_store_partial(Scalar* p, typename V::Reg v, Index n) noexcept {
  alignas(16) Scalar lanes[V::kWidth];
  V::store(lanes, v);
  for (Index i = 0; i < n && i < V::kWidth; ++i) p[i] = lanes[i];
}

template <>
struct Vec<float> {
  using Scalar = float;
  using Reg = __m128;
  using Mask = __m128;
  static constexpr int kWidth = 4;
  static Reg zero() noexcept { return _mm_setzero_ps(); }
  static Reg set1(float v) noexcept { return _mm_set1_ps(v); }
  static Reg load(const float* p) noexcept { return _mm_loadu_ps(p); }
  static Reg load_partial(const float* p, Index n) noexcept { return sse2_load_partial<Vec>(p, n); }
  static void store(float* p, Reg v) noexcept { _mm_storeu_ps(p, v); }
  static void store_partial(float* p, Reg v, Index n) noexcept { sse2_store_partial<Vec>(p, v, n); }
  static Reg fmadd(Reg a, Reg b, Reg c) noexcept { return _mm_add_ps(_mm_mul_ps(a, b), c); }
  static Reg fnmadd(Reg a, Reg b, Reg c) noexcept { return _mm_sub_ps(c, _mm_mul_ps(a, b)); }
  static Reg add(Reg a, Reg b) noexcept { return _mm_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) noexcept { return _mm_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) noexcept { return _mm_mul_ps(a, b); }
  static Reg div(Reg a, Reg b) noexcept { return _mm_div_ps(a, b); }
  static Reg max(Reg a, Reg b) noexcept { return _mm_max_ps(a, b); }
  static Reg min(Reg a, Reg b) noexcept { return _mm_min_ps(a, b); }
  static float reduce_add(Reg v) noexcept {
    const __m128 s = _mm_add_ps(v, _mm_movehl_ps(v, v));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, _MM_SHUFFLE(1, 1, 1, 1))));
  }
  static float reduce_max(Reg v) noexcept {
    const __m128 s = _mm_max_ps(v, _mm_movehl_ps(v, v));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_shuffle_ps(s, s, _MM_SHUFFLE(1, 1, 1, 1))));
  }
  /// Round to nearest even (the default MXCSR mode) through int32: exact for |x| < 2^31,
  /// which covers exp's reduced arguments; NaN gives a finite value (exp keeps NaN in p).
  static Reg round(Reg x) noexcept { return _mm_cvtepi32_ps(_mm_cvtps_epi32(x)); }
  /// p * 2^n for integral n in [-252, 254] (see the AVX2 set's ldexp).
  static Reg ldexp(Reg p, Reg n) noexcept {
    const __m128i ni = _mm_cvtps_epi32(n);
    const __m128i half = _mm_srai_epi32(ni, 1);
    const __m128i rest = _mm_sub_epi32(ni, half);
    const __m128i bias = _mm_set1_epi32(127);
    const Reg s1 = _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(half, bias), 23));
    const Reg s2 = _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(rest, bias), 23));
    return _mm_mul_ps(_mm_mul_ps(p, s1), s2);
  }
  static Mask less(Reg a, Reg b) noexcept { return _mm_cmplt_ps(a, b); }
  /// Whether every lane of `m` is set.
  static bool all(Mask m) noexcept { return _mm_movemask_ps(m) == 0xF; }
  static Mask greater(Reg a, Reg b) noexcept { return _mm_cmpgt_ps(a, b); }
  static Reg select(Mask m, Reg a, Reg b) noexcept {
    return _mm_or_ps(_mm_and_ps(m, a), _mm_andnot_ps(m, b));
  }
};

template <>
struct Vec<double> {
  using Scalar = double;
  using Reg = __m128d;
  using Mask = __m128d;
  static constexpr int kWidth = 2;
  static Reg zero() noexcept { return _mm_setzero_pd(); }
  static Reg set1(double v) noexcept { return _mm_set1_pd(v); }
  static Reg load(const double* p) noexcept { return _mm_loadu_pd(p); }
  static Reg load_partial(const double* p, Index n) noexcept {
    return sse2_load_partial<Vec>(p, n);
  }
  static void store(double* p, Reg v) noexcept { _mm_storeu_pd(p, v); }
  static void store_partial(double* p, Reg v, Index n) noexcept {
    sse2_store_partial<Vec>(p, v, n);
  }
  static Reg fmadd(Reg a, Reg b, Reg c) noexcept { return _mm_add_pd(_mm_mul_pd(a, b), c); }
  static Reg fnmadd(Reg a, Reg b, Reg c) noexcept { return _mm_sub_pd(c, _mm_mul_pd(a, b)); }
  static Reg add(Reg a, Reg b) noexcept { return _mm_add_pd(a, b); }
  static Reg sub(Reg a, Reg b) noexcept { return _mm_sub_pd(a, b); }
  static Reg mul(Reg a, Reg b) noexcept { return _mm_mul_pd(a, b); }
  static Reg div(Reg a, Reg b) noexcept { return _mm_div_pd(a, b); }
  static Reg max(Reg a, Reg b) noexcept { return _mm_max_pd(a, b); }
  static Reg min(Reg a, Reg b) noexcept { return _mm_min_pd(a, b); }
  static double reduce_add(Reg v) noexcept {
    return _mm_cvtsd_f64(_mm_add_sd(v, _mm_unpackhi_pd(v, v)));
  }
  static double reduce_max(Reg v) noexcept {
    return _mm_cvtsd_f64(_mm_max_sd(v, _mm_unpackhi_pd(v, v)));
  }
  static Reg round(Reg x) noexcept { return _mm_cvtepi32_pd(_mm_cvtpd_epi32(x)); }
  /// p * 2^n for integral n in [-2044, 2046] (see the AVX2 set's ldexp).
  static Reg ldexp(Reg p, Reg n) noexcept {
    const __m128i ni = _mm_cvtpd_epi32(n);  // two int32 in the low half
    const __m128i half = _mm_srai_epi32(ni, 1);
    const __m128i rest = _mm_sub_epi32(ni, half);
    const __m128i bias = _mm_set1_epi64x(1023);
    const auto pow2 = [&](__m128i e) {  // sign-extend to int64, add the bias, shift in place
      const __m128i wide = _mm_unpacklo_epi32(e, _mm_srai_epi32(e, 31));
      return _mm_castsi128_pd(_mm_slli_epi64(_mm_add_epi64(wide, bias), 52));
    };
    return _mm_mul_pd(_mm_mul_pd(p, pow2(half)), pow2(rest));
  }
  static Mask less(Reg a, Reg b) noexcept { return _mm_cmplt_pd(a, b); }
  /// Whether every lane of `m` is set.
  static bool all(Mask m) noexcept { return _mm_movemask_pd(m) == 0x3; }
  static Mask greater(Reg a, Reg b) noexcept { return _mm_cmpgt_pd(a, b); }
  static Reg select(Mask m, Reg a, Reg b) noexcept {
    return _mm_or_pd(_mm_and_pd(m, a), _mm_andnot_pd(m, b));
  }
};

// ---- square block transposes used by packing: dst[c * ldd + r] = src[r * lds + c] ----

template <class Scalar>
constexpr Index transpose_width() noexcept {
  return sizeof(Scalar) == 4 ? 4 : 2;
}
template <class Scalar>
constexpr Index transpose_width_wide() noexcept {
  return transpose_width<Scalar>();
}

inline void transpose_block(const float* src, Index lds, float* dst, Index ldd) noexcept {
  const __m128 r0 = _mm_loadu_ps(src), r1 = _mm_loadu_ps(src + lds);
  const __m128 r2 = _mm_loadu_ps(src + 2 * lds), r3 = _mm_loadu_ps(src + 3 * lds);
  const __m128 t0 = _mm_unpacklo_ps(r0, r1), t1 = _mm_unpacklo_ps(r2, r3);
  const __m128 t2 = _mm_unpackhi_ps(r0, r1), t3 = _mm_unpackhi_ps(r2, r3);
  _mm_storeu_ps(dst, _mm_movelh_ps(t0, t1));
  _mm_storeu_ps(dst + ldd, _mm_movehl_ps(t1, t0));
  _mm_storeu_ps(dst + 2 * ldd, _mm_movelh_ps(t2, t3));
  _mm_storeu_ps(dst + 3 * ldd, _mm_movehl_ps(t3, t2));
}

inline void transpose_block(const double* src, Index lds, double* dst, Index ldd) noexcept {
  const __m128d r0 = _mm_loadu_pd(src), r1 = _mm_loadu_pd(src + lds);
  _mm_storeu_pd(dst, _mm_unpacklo_pd(r0, r1));
  _mm_storeu_pd(dst + ldd, _mm_unpackhi_pd(r0, r1));
}

template <class Scalar>
inline void transpose_block_wide(const Scalar* src, Index lds, Scalar* dst, Index ldd) noexcept {
  transpose_block(src, lds, dst, ldd);
}
