// SPDX-License-Identifier: MIT
// attn/kernels/avx2/convert.inl: float <-> bfloat16 and float <-> float16 rows, 8 lanes per ymm
// (the tail is left to the scalar conversion). Included by attn/kernels/avx2.hpp; each gives the
// bits of the scalar conversions in attn/types/ (tested over every float and every 16-bit
// pattern). bfloat16 rounds with integer adds; float16 uses F16C's vcvtps2ph / vcvtph2ps, which
// round to nearest even from the immediate (not MXCSR) and keep subnormals, after NaN lanes are
// replaced by sign | 0x7FC00000 (so a NaN comes out as sign | 0x7E00, and a signalling NaN
// raises no invalid-operation flag).

namespace convert_ops {

/// All-ones in the lanes of u (float bits) that hold a NaN: |u| > 0x7F800000 (signed compare:
/// both sides are below 2^31).
inline __m256i nan_lanes(__m256i u) noexcept {
  return _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
                            _mm256_set1_epi32(0x7F800000));
}

/// 8 floats (as integer lanes) -> 8 bfloat16 in the low halves of 32-bit lanes.
inline __m256i bfloat16_lanes(__m256i u) noexcept {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  return _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), nan_lanes(u));
}

inline __m256i load(const float* p) noexcept {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

}  // namespace convert_ops

inline Index convert_vector_part(const float* src, bfloat16* dst, Index n) noexcept {
  Index i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = convert_ops::bfloat16_lanes(convert_ops::load(src + i));
    const __m256i b = convert_ops::bfloat16_lanes(convert_ops::load(src + i + 8));
    // packus works within 128-bit halves: a0 b0 | a1 b1 -> reorder the 64-bit quarters.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
  }
  for (; i + 8 <= n; i += 8) {
    const __m256i a = convert_ops::bfloat16_lanes(convert_ops::load(src + i));
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, a), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_castsi256_si128(packed));
  }
  return i;
}

inline Index convert_vector_part(const bfloat16* src, float* dst, Index n) noexcept {
  Index i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  return i;
}

inline Index convert_vector_part(const float* src, float16* dst, Index n) noexcept {
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256i quiet = _mm256_set1_epi32(0x7FC00000);
  Index i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = convert_ops::load(src + i);
    const __m256i canonical = _mm256_or_si256(_mm256_and_si256(u, sign), quiet);
    const __m256 x =
        _mm256_castsi256_ps(_mm256_blendv_epi8(u, canonical, convert_ops::nan_lanes(u)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
  return i;
}

inline Index convert_vector_part(const float16* src, float* dst, Index n) noexcept {
  Index i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  return i;
}
