// SPDX-License-Identifier: MIT
// attn/kernels/avx512/convert.inl: float <-> bfloat16 and float <-> float16 rows, 16 lanes
// per zmm, the tail under a lane mask. Included by attn/kernels/avx512.hpp; each gives the bits
// of the scalar conversions in attn/types/ (tested over every float and every 16-bit pattern).
//
// bfloat16 rounds with AVX-512F integer adds, not AVX512-BF16's vcvtneps2bf16: that
// instruction treats subnormal inputs as zero (0x007FFFFF gives 0x0000, not 0x0080) and keeps
// a NaN's payload, so it cannot give PyTorch's bits. float16 uses vcvtps2ph / vcvtph2ps
// (AVX-512F), which round to nearest even from the immediate (not MXCSR) and keep subnormals;
// NaN lanes are replaced by sign | 0x7FC00000 before the conversion, so a NaN comes out as
// sign | 0x7E00 and a signalling NaN raises no invalid-operation flag.

namespace convert_ops {

/// Lane mask of the first n (0 <= n <= 16) lanes.
inline __mmask16 first_lanes(Index n) noexcept {
  return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u);
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

}  // namespace convert_ops

inline Index convert_vector_part(const float* src, bfloat16* dst, Index n) noexcept {
  Index i = 0;
  for (; i + 32 <= n; i += 32) {  // two registers per step: two independent chains
    const __m512i a = convert_ops::bfloat16_lanes(_mm512_loadu_si512(src + i));
    const __m512i b = convert_ops::bfloat16_lanes(_mm512_loadu_si512(src + i + 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(a));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + 16), _mm512_cvtepi32_epi16(b));
  }
  for (; i < n; i += 16) {
    const __mmask16 m = convert_ops::first_lanes(n - i);
    const __m512i r = convert_ops::bfloat16_lanes(_mm512_maskz_loadu_epi32(m, src + i));
    _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtepi32_epi16(r));
  }
  return n;
}

inline Index convert_vector_part(const bfloat16* src, float* dst, Index n) noexcept {
  Index i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_si512(dst + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  if (i < n) {
    const __mmask16 m = convert_ops::first_lanes(n - i);
    const __m256i h = _mm256_maskz_loadu_epi16(m, src + i);
    _mm512_mask_storeu_epi32(dst + i, m, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
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
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
  }
  if (i < n) {
    const __mmask16 m = convert_ops::first_lanes(n - i);
    _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + i)));
  }
  return n;
}
