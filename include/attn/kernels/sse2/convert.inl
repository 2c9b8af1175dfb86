// SPDX-License-Identifier: MIT
// attn/kernels/sse2/convert.inl: float <-> bfloat16 and float <-> float16 rows, 8 elements per
// step (two xmm of floats, one of 16-bit values; the tail is left to the scalar conversion).
// Included by attn/kernels/sse2.hpp. SSE2 has no F16C, so float16 is converted with integer
// operations plus float steps that are exact (a scaling by 2^24, a truncation, a subtraction):
// like the scalar code in attn/types/, the result does not depend on MXCSR's rounding mode,
// flush-to-zero or denormals-are-zero, and every set gives the same bits (tested over every
// float and every 16-bit pattern).

namespace convert_ops {

inline __m128i set1(std::uint32_t v) noexcept { return _mm_set1_epi32(static_cast<int>(v)); }

/// mask ? a : b, lane by lane (mask lanes all-ones or zero).
inline __m128i select(__m128i mask, __m128i a, __m128i b) noexcept {
  return _mm_or_si128(_mm_and_si128(mask, a), _mm_andnot_si128(mask, b));
}

/// 4 floats (as integer lanes) -> 4 bfloat16, sign-extended from 16 bits (what packs_epi32
/// keeps exactly): the arithmetic shift takes the high half with its sign.
inline __m128i bfloat16_lanes(__m128i u) noexcept {
  const __m128i lsb = _mm_and_si128(_mm_srli_epi32(u, 16), set1(1));
  const __m128i rounded = _mm_srai_epi32(_mm_add_epi32(_mm_add_epi32(u, set1(0x7FFF)), lsb), 16);
  const __m128i nan = _mm_cmpgt_epi32(_mm_and_si128(u, set1(0x7FFFFFFF)), set1(0x7F800000));
  return select(nan, set1(0x7FC0), rounded);
}

/// 4 floats (as integer lanes) -> 4 float16, sign-extended from 16 bits.
inline __m128i float16_lanes(__m128i u) noexcept {
  const __m128i a = _mm_and_si128(u, set1(0x7FFFFFFF));  // |x|, below 2^31: signed compares work
  const __m128i sign = _mm_and_si128(_mm_srli_epi32(u, 16), set1(0x8000));
  // normal results, 2^-14 <= |x| < 65520: rebias, then round the 13 dropped bits to even
  const __m128i lsb = _mm_and_si128(_mm_srli_epi32(a, 13), set1(1));
  const __m128i normal = _mm_srli_epi32(
      _mm_add_epi32(_mm_sub_epi32(a, set1(0x38000000)), _mm_add_epi32(set1(0x0FFF), lsb)), 13);
  // subnormal results, |x| < 2^-14: |x| * 2^24 rounded to an integer, nearest even, in exact
  // float steps (other lanes compute 0)
  const __m128i small = _mm_cmplt_epi32(a, set1(0x38800000));
  const __m128 p = _mm_mul_ps(_mm_castsi128_ps(_mm_and_si128(a, small)), _mm_set1_ps(16777216.0f));
  const __m128i t = _mm_cvttps_epi32(p);
  const __m128 f = _mm_sub_ps(p, _mm_cvtepi32_ps(t));
  const __m128i odd = _mm_cmpeq_epi32(_mm_and_si128(t, set1(1)), set1(1));
  const __m128i up =
      _mm_or_si128(_mm_castps_si128(_mm_cmpgt_ps(f, _mm_set1_ps(0.5f))),
                   _mm_and_si128(_mm_castps_si128(_mm_cmpeq_ps(f, _mm_set1_ps(0.5f))), odd));
  __m128i r = select(small, _mm_sub_epi32(t, up), normal);
  r = select(_mm_cmpgt_epi32(a, set1(0x477FEFFF)), set1(0x7C00), r);  // from 65520: infinity
  r = select(_mm_cmpgt_epi32(a, set1(0x7F800000)), set1(0x7E00), r);  // NaN
  r = _mm_or_si128(r, sign);
  return _mm_srai_epi32(_mm_slli_epi32(r, 16), 16);
}

/// 4 float16 (zero-extended in 32-bit lanes) -> 4 floats, exactly.
inline __m128i float_lanes(__m128i h) noexcept {
  const __m128i sign = _mm_slli_epi32(_mm_and_si128(h, set1(0x8000)), 16);
  const __m128i magnitude = _mm_and_si128(h, set1(0x7FFF));
  const __m128i exponent = _mm_and_si128(h, set1(0x7C00));
  const __m128i mantissa = _mm_and_si128(h, set1(0x03FF));
  const __m128i shifted = _mm_slli_epi32(magnitude, 13);
  const __m128i normal = _mm_add_epi32(shifted, set1(0x38000000));  // exponent + 112
  // infinity, or a NaN made quiet with its payload kept
  const __m128i quiet =
      _mm_andnot_si128(_mm_cmpeq_epi32(mantissa, _mm_setzero_si128()), set1(0x00400000));
  const __m128i special = _mm_or_si128(_mm_or_si128(shifted, set1(0x7F800000)), quiet);
  const __m128i subnormal = _mm_castps_si128(
      _mm_mul_ps(_mm_cvtepi32_ps(mantissa), _mm_set1_ps(5.9604644775390625e-8f)));  // 2^-24
  __m128i r = select(_mm_cmpeq_epi32(exponent, set1(0x7C00)), special, normal);
  r = select(_mm_cmpeq_epi32(exponent, _mm_setzero_si128()), subnormal, r);
  return _mm_or_si128(r, sign);
}

inline __m128i load(const void* p) noexcept {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}
inline void store(void* p, __m128i v) noexcept { _mm_storeu_si128(static_cast<__m128i*>(p), v); }

}  // namespace convert_ops

inline Index convert_vector_part(const float* src, bfloat16* dst, Index n) noexcept {
  Index i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i a = convert_ops::bfloat16_lanes(convert_ops::load(src + i));
    const __m128i b = convert_ops::bfloat16_lanes(convert_ops::load(src + i + 4));
    convert_ops::store(dst + i, _mm_packs_epi32(a, b));
  }
  return i;
}

inline Index convert_vector_part(const bfloat16* src, float* dst, Index n) noexcept {
  Index i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = convert_ops::load(src + i);
    convert_ops::store(dst + i, _mm_unpacklo_epi16(_mm_setzero_si128(), h));  // h << 16
    convert_ops::store(dst + i + 4, _mm_unpackhi_epi16(_mm_setzero_si128(), h));
  }
  return i;
}

inline Index convert_vector_part(const float* src, float16* dst, Index n) noexcept {
  Index i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i a = convert_ops::float16_lanes(convert_ops::load(src + i));
    const __m128i b = convert_ops::float16_lanes(convert_ops::load(src + i + 4));
    convert_ops::store(dst + i, _mm_packs_epi32(a, b));
  }
  return i;
}

inline Index convert_vector_part(const float16* src, float* dst, Index n) noexcept {
  Index i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = convert_ops::load(src + i);
    convert_ops::store(dst + i,
                       convert_ops::float_lanes(_mm_unpacklo_epi16(h, _mm_setzero_si128())));
    convert_ops::store(dst + i + 4,
                       convert_ops::float_lanes(_mm_unpackhi_epi16(h, _mm_setzero_si128())));
  }
  return i;
}
