// SPDX-License-Identifier: MIT
// attn/kernels/avx512/convert.inl: float <-> bfloat16, float16, float8_e4m3 and float8_e5m2
// rows, 16 lanes per zmm, the tail under a lane mask. Included by attn/kernels/avx512.hpp; each
// gives the bits of the scalar conversions in attn/types/ (tested over every float and every 16-bit
// pattern).
//
// bfloat16 rounds with AVX-512F integer adds, not AVX512-BF16's vcvtneps2bf16: that
// instruction treats subnormal inputs as zero (0x007FFFFF gives 0x0000, not 0x0080) and keeps
// a NaN's payload, so it cannot give PyTorch's bits. float16 uses vcvtps2ph / vcvtph2ps
// (AVX-512F), which round to nearest even from the immediate (not MXCSR) and keep subnormals;
// NaN lanes are replaced by sign | 0x7FC00000 before the conversion, so a NaN comes out as
// sign | 0x7E00 and a signalling NaN raises no invalid-operation flag. float8 is rounded with
// the integer steps of detail::round_magnitude() (variable shifts), and decoded through
// float16: a float8_e5m2 is the top byte of the float16 of the same value, a float8_e4m3
// shifted into a float16 is its value times 2^-8 (exactly, subnormals included).

namespace convert_ops {

/// Lane mask of the first n (0 <= n <= 16) lanes.
inline __mmask16 first_lanes(Index n) noexcept {
  return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u);
}

/// Mask of the first n of 32 lanes (bytes or 16-bit words; none for n <= 0).
inline __mmask32 first_lanes32(Index n) noexcept {
  return n >= 32 ? ~__mmask32(0) : n <= 0 ? __mmask32(0) : __mmask32((1u << n) - 1u);
}

/// 16 floats (as integer lanes) -> 16 bfloat16 in the low halves of 32-bit lanes.
inline __m512i bfloat16_lanes(__m512i u) noexcept {
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                _mm512_set1_epi32(0x7F800000));
  return _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7FC0));
}

/// 16 floats with every NaN replaced by sign | 0x7FC00000 (see the file comment).
inline __m512 canonical_nans(__m512i u) noexcept {
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                _mm512_set1_epi32(0x7F800000));
  const __m512i quiet =
      _mm512_or_si512(_mm512_and_si512(u, _mm512_set1_epi32(static_cast<int>(0x80000000u))),
                      _mm512_set1_epi32(0x7FC00000));
  return _mm512_castsi512_ps(_mm512_mask_mov_epi32(u, nan, quiet));
}

/// 16 floats (as integer lanes) -> 16 values of the 8-bit Format in the low bytes of 32-bit
/// lanes: detail::encode_bits() on every lane (round to nearest even; overflow and infinities
/// to Format's overflow pattern, or to its largest finite value with Saturate; NaN to
/// sign | 0x7F).
template <class Format, bool Saturate>
inline __m512i float8_lanes(__m512i u) noexcept {
  constexpr int tm = Format::kMantissaBits;
  const __m512i one = _mm512_set1_epi32(1), zero = _mm512_setzero_si512();
  const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
  const __m512i e_raw = _mm512_srli_epi32(a, 23);
  // significand with its implicit bit (none for float subnormals, which take exponent 1)
  const __m512i m = _mm512_mask_or_epi32(
      _mm512_and_si512(a, _mm512_set1_epi32(0x007FFFFF)), _mm512_cmpneq_epi32_mask(e_raw, zero),
      _mm512_and_si512(a, _mm512_set1_epi32(0x007FFFFF)), _mm512_set1_epi32(0x00800000));
  const __m512i t = _mm512_add_epi32(_mm512_max_epu32(e_raw, one),
                                     _mm512_set1_epi32(Format::kBias - 127));  // target exponent
  const __m512i shift =
      _mm512_min_epi32(_mm512_add_epi32(_mm512_max_epi32(_mm512_sub_epi32(one, t), zero),
                                        _mm512_set1_epi32(23 - tm)),
                       _mm512_set1_epi32(25));
  const __m512i half_less_one =
      _mm512_sub_epi32(_mm512_sllv_epi32(one, _mm512_sub_epi32(shift, one)), one);
  const __m512i lsb = _mm512_and_si512(_mm512_srlv_epi32(m, shift), one);
  const __m512i q =
      _mm512_srlv_epi32(_mm512_add_epi32(_mm512_add_epi32(m, half_less_one), lsb), shift);
  __m512i r =
      _mm512_add_epi32(_mm512_slli_epi32(_mm512_max_epi32(_mm512_sub_epi32(t, one), zero), tm), q);
  const auto overflow = static_cast<int>(Saturate ? Format::kMaxFinite : Format::kOverflow);
  r = _mm512_mask_mov_epi32(r, _mm512_cmpgt_epu32_mask(r, _mm512_set1_epi32(Format::kMaxFinite)),
                            _mm512_set1_epi32(overflow));  // infinities land here too
  r = _mm512_mask_mov_epi32(r, _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F800000)),
                            _mm512_set1_epi32(0x7F));
  return _mm512_or_si512(r, _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80)));
}

template <class Format, bool Saturate, class T>
inline Index float8_row(const float* src, T* dst, Index n) noexcept {
  Index i = 0;
  for (; i + 16 <= n; i += 16) {  // full blocks unmasked: masked stores to memory are slow
    const __m512i r = float8_lanes<Format, Saturate>(_mm512_loadu_si512(src + i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm512_cvtepi32_epi8(r));
  }
  if (i < n) {
    const __mmask16 m = first_lanes(n - i);
    const __m512i r = float8_lanes<Format, Saturate>(_mm512_maskz_loadu_epi32(m, src + i));
    _mm_mask_storeu_epi8(dst + i, m, _mm512_cvtepi32_epi8(r));
  }
  return n;
}

/// 16 float8 values (bytes, zero-extended to 16-bit lanes) -> 16 floats, exactly.
template <class Format>
inline __m512 float8_floats(__m256i b) noexcept {
  if constexpr (Format::kExponentBits == 5) {  // e5m2: the top byte of a float16
    return _mm512_cvtph_ps(_mm256_slli_epi16(b, 8));
  } else {  // e4m3: magnitude << 7 is a float16 of value / 2^8; NaN (0x7F) fixed afterwards
    const __m256i magnitude = _mm256_and_si256(b, _mm256_set1_epi16(0x7F));
    const __m256i h =
        _mm256_or_si256(_mm256_slli_epi16(magnitude, 7),
                        _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8));
    const __m512 x = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
    const __mmask16 nan = _mm256_cmpeq_epi16_mask(magnitude, _mm256_set1_epi16(0x7F));
    const __m512i quiet = _mm512_or_si512(
        _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(static_cast<int>(0x80000000u))),
        _mm512_set1_epi32(0x7FF00000));
    return _mm512_mask_mov_ps(x, nan, _mm512_castsi512_ps(quiet));
  }
}

template <class Format, class T>
inline Index float8_to_float_row(const T* src, float* dst, Index n) noexcept {
  Index i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm512_storeu_ps(dst + i, float8_floats<Format>(_mm256_cvtepu8_epi16(b)));
  }
  if (i < n) {
    const __mmask16 m = first_lanes(n - i);
    const __m256i b = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, src + i));
    _mm512_mask_storeu_ps(dst + i, m, float8_floats<Format>(b));
  }
  return n;
}

}  // namespace convert_ops

inline Index convert_vector_part(const float* src, bfloat16* dst, Index n) noexcept {
  Index i = 0;
  for (; i + 32 <= n; i += 32) {  // two registers per step: two independent chains
    const __m512i a = convert_ops::bfloat16_lanes(_mm512_loadu_si512(src + i));
    const __m512i b = convert_ops::bfloat16_lanes(_mm512_loadu_si512(src + i + 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(a));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + 16), _mm512_cvtepi32_epi16(b));
  }
  for (; i < n; i += 16) {  // at most two blocks: one full, then the masked tail
    const __mmask16 m = convert_ops::first_lanes(n - i);
    const __m512i r = convert_ops::bfloat16_lanes(_mm512_maskz_loadu_epi32(m, src + i));
    _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtepi32_epi16(r));
  }
  return n;
}

/// 16 elements of a 16-bit row as floats (bfloat16: the high halves of float lanes; float16:
/// vcvtph2ps), exact; the lanes off `mask` read nothing and are +0.
inline __m512 widen16(const bfloat16* at) noexcept {
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at))), 16));
}
inline __m512 widen16(const bfloat16* at, __mmask16 mask) noexcept {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, at)), 16));
}
inline __m512 widen16(const float16* at) noexcept {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)));
}
inline __m512 widen16(const float16* at, __mmask16 mask) noexcept {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, at));
}

inline Index convert_vector_part(const bfloat16* src, float* dst, Index n) noexcept {
  Index i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, widen16(src + i));
  if (i < n) {
    const __mmask16 m = convert_ops::first_lanes(n - i);
    _mm512_mask_storeu_ps(dst + i, m, widen16(src + i, m));
  }
  return n;
}

inline Index convert_vector_part(const float* src, float16* dst, Index n) noexcept {
  Index i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = convert_ops::canonical_nans(_mm512_loadu_si512(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
  if (i < n) {
    const __mmask16 m = convert_ops::first_lanes(n - i);
    const __m512 x = convert_ops::canonical_nans(_mm512_maskz_loadu_epi32(m, src + i));
    _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
  return n;
}

inline Index convert_vector_part(const float16* src, float* dst, Index n) noexcept {
  Index i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, widen16(src + i));
  if (i < n) {
    const __mmask16 m = convert_ops::first_lanes(n - i);
    _mm512_mask_storeu_ps(dst + i, m, widen16(src + i, m));
  }
  return n;
}

inline Index convert_vector_part(const float* src, float8_e4m3* dst, Index n) noexcept {
  return convert_ops::float8_row<Float8E4M3Format, false>(src, dst, n);
}
inline Index convert_vector_part(const float* src, float8_e5m2* dst, Index n) noexcept {
  return convert_ops::float8_row<Float8E5M2Format, false>(src, dst, n);
}
inline Index convert_saturate_vector_part(const float* src, float8_e4m3* dst, Index n) noexcept {
  return convert_ops::float8_row<Float8E4M3Format, true>(src, dst, n);
}
inline Index convert_saturate_vector_part(const float* src, float8_e5m2* dst, Index n) noexcept {
  return convert_ops::float8_row<Float8E5M2Format, true>(src, dst, n);
}
inline Index convert_vector_part(const float8_e4m3* src, float* dst, Index n) noexcept {
  return convert_ops::float8_to_float_row<Float8E4M3Format>(src, dst, n);
}
inline Index convert_vector_part(const float8_e5m2* src, float* dst, Index n) noexcept {
  return convert_ops::float8_to_float_row<Float8E5M2Format>(src, dst, n);
}

// ---- the integer levels of a quantised KVCache's rows (generic/kv_load.inl) ----

/// n int8 values times `scale` as floats (all of them: the tail under a lane mask).
inline Index widen_int8_part(const std::int8_t* src, float* dst, Index n, float scale) noexcept {
  const __m512 s = _mm512_set1_ps(scale);
  Index i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), s));
  }
  if (i < n) {
    const __mmask16 m = convert_ops::first_lanes(n - i);
    const __m128i b = _mm_maskz_loadu_epi8(m, src + i);
    _mm512_mask_storeu_ps(dst + i, m,
                          _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), s));
  }
  return n;
}

/// One int4 block (16 bytes: elements i and i + 16 in byte i, as q + 8) as the floats q
/// times `scale`.
inline bool widen_int4_block(const unsigned char* src, float* dst, float scale) noexcept {
  const __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  const __m512i eight = _mm512_set1_epi32(8);
  const __m512 s = _mm512_set1_ps(scale);
  const __m512i lo = _mm512_sub_epi32(_mm512_and_si512(w, _mm512_set1_epi32(0x0F)), eight);
  const __m512i hi = _mm512_sub_epi32(_mm512_srli_epi32(w, 4), eight);
  _mm512_storeu_ps(dst, _mm512_mul_ps(_mm512_cvtepi32_ps(lo), s));
  _mm512_storeu_ps(dst + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(hi), s));
  return true;
}

// int8_key_scores_madd(): the int8 scores on a CPU without AVX512-VNNI (avx512/int8_dot.inl).
#include "attn/kernels/avx2/int8_madd.inl"

/// The register block of the P V passes below: acc rows r0 .. r0 + 3 (row stride dv; rows past
/// `rows` repeat the last, computed and not stored), elements e0 .. e0 + cols - 1 (cols <= 64,
/// under lane masks) += sum over keys j < n of weight(j, i) times key j's elements, which
/// widen(j, mask, x) puts in x[0..3] (16 each, lanes past cols 0): 16 accumulators in
/// registers, each key's 4 weights broadcast, one pass over the keys.
template <class Weight, class Widen>
inline void values_block(Index r0, Index rows, Index e0, Index cols, Index n, Index dv, float* acc,
                         Weight&& weight, Widen&& widen) noexcept {
  const Index nr = std::min<Index>(4, rows - r0);
  __mmask16 mask[4];
  __m512 a[4][4];
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) mask[c] = convert_ops::first_lanes(std::max<Index>(0, cols - 16 * c));
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const Index r = std::min(r0 + i, rows - 1);  // a repeat past `rows`: not stored
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c)
      a[i][c] = _mm512_maskz_loadu_ps(mask[c], acc + r * dv + e0 + 16 * c);
  }
  for (Index j = 0; j < n; ++j) {
    __m512 x[4];
    widen(j, mask, x);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const __m512 wi = _mm512_set1_ps(weight(j, i));
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) a[i][c] = _mm512_fmadd_ps(wi, x[c], a[i][c]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // (constant indices: a stays in registers)
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      if (i < nr) _mm512_mask_storeu_ps(acc + (r0 + i) * dv + e0 + 16 * c, mask[c], a[i][c]);
    }
  }
}

/// acc rows r0 .. r0 + 3 (of `rows`; row stride dv) += P V over n int8 value rows (row j at
/// v[j], its scale at vs[j][0]), P read transposed out of p^T (pt[j * ld + r]): each row's
/// scale folded into its weights (p * scale, one rounding), the bytes widened in registers,
/// products accumulated in float (no float copy of the rows). 64 elements per pass
/// (values_block(); rows past `rows` weigh 0). The float form of int8_values_part()
/// (avx512/int8_dot.inl), and its form for weights that are not finite.
inline void int8_values_fma(const unsigned char* const* v, const float* const* vs, Index n,
                            Index dv, const float* pt, Index ld, Index rows, Index r0,
                            float* acc) noexcept {
  alignas(64) float w[kKeyBlock * 4];
  const Index nr = std::min<Index>(4, rows - r0);
  for (Index j = 0; j < n; ++j) {
    const float scale = vs[j][0];
    for (Index i = 0; i < 4; ++i) w[j * 4 + i] = i < nr ? pt[j * ld + r0 + i] * scale : 0.0f;
  }
  for (Index e0 = 0; e0 < dv; e0 += 64) {
    values_block(
        r0, rows, e0, std::min<Index>(64, dv - e0), n, dv, acc,
        [&](Index j, int i) { return w[j * 4 + i]; },
        [&](Index j, const __mmask16* mask, __m512* x) {
          const auto* row = reinterpret_cast<const std::int8_t*>(v[j]) + e0;
          if (j + 16 < n) {
            _mm_prefetch(reinterpret_cast<const char*>(v[j + 16] + e0), _MM_HINT_T0);
          }
#pragma GCC unroll 4
          for (int c = 0; c < 4; ++c) {
            x[c] = _mm512_cvtepi32_ps(
                _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask[c], row + 16 * c)));
          }
        });
  }
}

/// acc rows r0 .. r0 + 3 (of `rows`; row stride dv) += P V over n int4 value rows (row j at
/// v[j], its scales, one per `group` elements, at vs[j]; every 32-element block under one
/// scale), P read transposed out of p^T (pt[j * ld + r]): each block widened in registers to
/// the elements q times its scale (one rounding, as the dequantising loader gives them),
/// products accumulated in float (no float copy of the rows). A nibble picks its element out
/// of a table of the 16 levels times the block's scale (vpermps reads an index's low 4 bits,
/// so the bytes need no masking): one instruction per 16 elements for the widening,
/// subtraction and scaling. 64 elements (2 blocks) per pass (values_block(); rows past `rows`
/// weigh 0). The float form of int4_values_part() (avx512/int8_dot.inl), and its form for
/// weights that are not finite.
inline void int4_values_fma(const unsigned char* const* v, const float* const* vs, Index group,
                            Index n, Index dv, const float* pt, Index ld, Index rows, Index r0,
                            float* acc) noexcept {
  constexpr Index kBlockBytes = kInt4Block / 2;
  const __m512 levels = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  alignas(64) float w[kKeyBlock * 4];  // the weights, 4 per key (rows past `rows`: 0)
  const Index nr = std::min<Index>(4, rows - r0);
  for (Index j = 0; j < n; ++j) {
    for (Index i = 0; i < 4; ++i) w[j * 4 + i] = i < nr ? pt[j * ld + r0 + i] : 0.0f;
  }
  for (Index e0 = 0; e0 < dv; e0 += 2 * kInt4Block) {
    const Index cols = std::min<Index>(2 * kInt4Block, dv - e0);
    const bool second = cols > kInt4Block;  // the pass's second block exists
    const Index s0 = e0 / group, s1 = std::min(e0 + kInt4Block, dv - 1) / group;
    values_block(
        r0, rows, e0, cols, n, dv, acc, [&](Index j, int i) { return w[j * 4 + i]; },
        [&](Index j, const __mmask16*, __m512* x) {
          const unsigned char* block = v[j] + e0 / kInt4Block * kBlockBytes;
          if (j + 16 < n) {
            _mm_prefetch(reinterpret_cast<const char*>(v[j + 16] + e0 / kInt4Block * kBlockBytes),
                         _MM_HINT_T0);
          }
          const float* scale = vs[j];
          const __m512 ta = _mm512_mul_ps(levels, _mm512_set1_ps(scale[s0]));
          const __m512 tb = _mm512_mul_ps(levels, _mm512_set1_ps(scale[s1]));
          const __m512i wa =
              _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
          const __m512i wb = second ? _mm512_cvtepu8_epi32(_mm_loadu_si128(
                                          reinterpret_cast<const __m128i*>(block + kBlockBytes)))
                                    : _mm512_set1_epi32(8);  // level 0
          x[0] = _mm512_permutexvar_ps(wa, ta);
          x[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(wa, 4), ta);
          x[2] = _mm512_permutexvar_ps(wb, tb);
          x[3] = _mm512_permutexvar_ps(_mm512_srli_epi32(wb, 4), tb);
        });
  }
}
