// SPDX-License-Identifier: MIT
// attn/kernels/avx512/vec.inl: the AVX-512 primitives (16 floats or 8 doubles per zmm).
// Included by attn/kernels/avx512.hpp inside namespace attn::kernels::avx512 and its target
// region; see attn/kernels/generic/all.inl for the members every set provides.

/// 6 rows x 4 zmm: 24 accumulators + 4 B registers + 1 broadcast of 32 registers, 24 FMAs
/// per 10 loads.
inline constexpr int kMicroRows = 6;
inline constexpr int kMicroVecs = 4;

template <class Scalar>
struct Vec;

template <>
struct Vec<float> {
  using Scalar = float;
  using Reg = __m512;
  using Mask = __mmask16;
  static constexpr int kWidth = 16;
  static Reg zero() noexcept { return _mm512_setzero_ps(); }
  static Reg set1(float v) noexcept { return _mm512_set1_ps(v); }
  static Reg load(const float* p) noexcept { return _mm512_loadu_ps(p); }
  static Mask lanes(Index n) noexcept {
    return n >= 16 ? Mask(0xffff) : n <= 0 ? Mask(0) : Mask((1u << n) - 1u);
  }
  static Reg load_partial(const float* p, Index n) noexcept {
    return _mm512_maskz_loadu_ps(lanes(n), p);
  }
  static void store(float* p, Reg v) noexcept { _mm512_storeu_ps(p, v); }
  static void store_partial(float* p, Reg v, Index n) noexcept {
    _mm512_mask_storeu_ps(p, lanes(n), v);
  }
  static Reg fmadd(Reg a, Reg b, Reg c) noexcept { return _mm512_fmadd_ps(a, b, c); }
  static Reg fnmadd(Reg a, Reg b, Reg c) noexcept { return _mm512_fnmadd_ps(a, b, c); }
  static Reg add(Reg a, Reg b) noexcept { return _mm512_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) noexcept { return _mm512_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) noexcept { return _mm512_mul_ps(a, b); }
  static Reg div(Reg a, Reg b) noexcept { return _mm512_div_ps(a, b); }
  static Reg max(Reg a, Reg b) noexcept { return _mm512_max_ps(a, b); }
  static Reg min(Reg a, Reg b) noexcept { return _mm512_min_ps(a, b); }
  static float reduce_add(Reg v) noexcept { return _mm512_reduce_add_ps(v); }
  static float reduce_max(Reg v) noexcept { return _mm512_reduce_max_ps(v); }
  static Reg round(Reg x) noexcept {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static Reg ldexp(Reg p, Reg n) noexcept { return _mm512_scalef_ps(p, n); }
  static Mask less(Reg a, Reg b) noexcept { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  /// Whether every lane of `m` is set.
  static bool all(Mask m) noexcept { return m == 0xFFFF; }
  static Mask greater(Reg a, Reg b) noexcept { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  static Reg select(Mask m, Reg a, Reg b) noexcept { return _mm512_mask_blend_ps(m, b, a); }
};

template <>
struct Vec<double> {
  using Scalar = double;
  using Reg = __m512d;
  using Mask = __mmask8;
  static constexpr int kWidth = 8;
  static Reg zero() noexcept { return _mm512_setzero_pd(); }
  static Reg set1(double v) noexcept { return _mm512_set1_pd(v); }
  static Reg load(const double* p) noexcept { return _mm512_loadu_pd(p); }
  static Mask lanes(Index n) noexcept {
    return n >= 8 ? Mask(0xff) : n <= 0 ? Mask(0) : Mask((1u << n) - 1u);
  }
  static Reg load_partial(const double* p, Index n) noexcept {
    return _mm512_maskz_loadu_pd(lanes(n), p);
  }
  static void store(double* p, Reg v) noexcept { _mm512_storeu_pd(p, v); }
  static void store_partial(double* p, Reg v, Index n) noexcept {
    _mm512_mask_storeu_pd(p, lanes(n), v);
  }
  static Reg fmadd(Reg a, Reg b, Reg c) noexcept { return _mm512_fmadd_pd(a, b, c); }
  static Reg fnmadd(Reg a, Reg b, Reg c) noexcept { return _mm512_fnmadd_pd(a, b, c); }
  static Reg add(Reg a, Reg b) noexcept { return _mm512_add_pd(a, b); }
  static Reg sub(Reg a, Reg b) noexcept { return _mm512_sub_pd(a, b); }
  static Reg mul(Reg a, Reg b) noexcept { return _mm512_mul_pd(a, b); }
  static Reg div(Reg a, Reg b) noexcept { return _mm512_div_pd(a, b); }
  static Reg max(Reg a, Reg b) noexcept { return _mm512_max_pd(a, b); }
  static Reg min(Reg a, Reg b) noexcept { return _mm512_min_pd(a, b); }
  static double reduce_add(Reg v) noexcept { return _mm512_reduce_add_pd(v); }
  static double reduce_max(Reg v) noexcept { return _mm512_reduce_max_pd(v); }
  static Reg round(Reg x) noexcept {
    return _mm512_roundscale_pd(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static Reg ldexp(Reg p, Reg n) noexcept { return _mm512_scalef_pd(p, n); }
  static Mask less(Reg a, Reg b) noexcept { return _mm512_cmp_pd_mask(a, b, _CMP_LT_OQ); }
  /// Whether every lane of `m` is set.
  static bool all(Mask m) noexcept { return m == 0xFF; }
  static Mask greater(Reg a, Reg b) noexcept { return _mm512_cmp_pd_mask(a, b, _CMP_GT_OQ); }
  static Reg select(Mask m, Reg a, Reg b) noexcept { return _mm512_mask_blend_pd(m, b, a); }
};

// ---- square block transposes used by packing: dst[c * ldd + r] = src[r * lds + c] ----

/// Sides of the blocks transpose_block() and transpose_block_wide() handle.
template <class Scalar>
constexpr Index transpose_width() noexcept {
  return sizeof(Scalar) == 4 ? 8 : 4;
}
template <class Scalar>
constexpr Index transpose_width_wide() noexcept {
  return sizeof(Scalar) == 4 ? 16 : transpose_width<Scalar>();
}

#include "attn/kernels/avx2/transpose.inl"

/// 16x16 32-bit lanes in zmm registers, r[i] lane j <- r[j] lane i: unpack pairs, 4-lane
/// shuffles, then two rounds of 128-bit lane shuffles. 64 shuffles per 256 elements against the
/// 8x8 form's 96 (bench: packing a 1536 x 512 weight 0.56 -> 0.37 cycles per element).
inline void transpose16(__m512 (&r)[16]) noexcept {
  __m512 t[16];
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
}

/// 16x16 floats (transpose16()).
inline void transpose_block_wide(const float* src, Index lds, float* dst, Index ldd) noexcept {
  __m512 r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
  transpose16(r);
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + i * ldd, r[i]);
}
/// 32x32 16-bit elements (bfloat16, float16), dst[c * ldd + r] = src[r * lds + c], one zmm
/// register per 64-byte row. Five rounds, each swapping the off-diagonal h x h blocks of
/// every 2h x 2h block (h = 16, 8, 4, 2, 1 elements) between rows i and i + h: 128-bit lane
/// shuffles for h = 16 and 8, 64-bit unpacks for h = 4, shifts and blends for h = 2 and 1
/// (these two rounds keep off the shuffle port). 160 such steps per 1024 elements.
template <class T>
inline void transpose_block_16bit(const T* src, Index lds, T* dst, Index ldd) noexcept {
  static_assert(sizeof(T) == 2, "transpose_block_16bit: 16-bit elements");
  __m512i r[32];
  for (int i = 0; i < 32; ++i) r[i] = _mm512_loadu_si512(src + i * lds);
  // Each round pairs rows i (bit h of i clear) and i + h: a = r[i], b = r[i + h].
  for (int i = 0; i < 16; ++i) {
    const __m512i a = r[i], b = r[i + 16];
    r[i] = _mm512_shuffle_i64x2(a, b, 0x44);
    r[i + 16] = _mm512_shuffle_i64x2(a, b, 0xee);
  }
  const __m512i even = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
  const __m512i odd = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
  for (int i = 0; i < 32; i += (i & 7) == 7 ? 9 : 1) {
    const __m512i a = r[i], b = r[i + 8];
    r[i] = _mm512_permutex2var_epi64(a, even, b);
    r[i + 8] = _mm512_permutex2var_epi64(a, odd, b);
  }
  for (int i = 0; i < 32; i += (i & 3) == 3 ? 5 : 1) {
    const __m512i a = r[i], b = r[i + 4];
    r[i] = _mm512_unpacklo_epi64(a, b);
    r[i + 4] = _mm512_unpackhi_epi64(a, b);
  }
  for (int i = 0; i < 32; i += (i & 1) == 1 ? 3 : 1) {
    const __m512i a = r[i], b = r[i + 2];
    r[i] = _mm512_mask_blend_epi32(0xaaaa, a, _mm512_slli_epi64(b, 32));
    r[i + 2] = _mm512_mask_blend_epi32(0xaaaa, _mm512_srli_epi64(a, 32), b);
  }
  for (int i = 0; i < 32; i += 2) {
    const __m512i a = r[i], b = r[i + 1];
    r[i] = _mm512_mask_blend_epi16(0xaaaaaaaau, a, _mm512_slli_epi32(b, 16));
    r[i + 1] = _mm512_mask_blend_epi16(0xaaaaaaaau, _mm512_srli_epi32(a, 16), b);
  }
  for (int i = 0; i < 32; ++i) _mm512_storeu_si512(dst + i * ldd, r[i]);
}

/// Doubles have no wide form (transpose_width_wide() equals transpose_width()); declared for
/// name lookup in the generic packing code.
inline void transpose_block_wide(const double* src, Index lds, double* dst, Index ldd) noexcept {
  transpose_block(src, lds, dst, ldd);
}
