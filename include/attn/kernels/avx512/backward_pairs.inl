// SPDX-License-Identifier: MIT
// attn/kernels/avx512/backward_pairs.inl: what the attention backward's bfloat16 products
// (generic/attention_backward_pairs.inl) need of the avx512 set beyond its
// conversions: a register of floats rounded into bfloat16 where the backward's elementwise
// pass computes it, so that A and dS reach their products without a second pass over them.
// Included by attn/kernels/avx512.hpp inside namespace attn::kernels::avx512, in the set's
// AVX-512 region (after convert.inl).

/// 16 floats rounded to bfloat16 (nearest even, NaN kept quiet: convert_row()'s bits) into
/// to[0, 16).
inline void store_rounded(bfloat16* to, __m512 x) noexcept {
  const __m512i b = convert_ops::bfloat16_lanes(_mm512_castps_si512(x));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(to), _mm512_cvtepi32_epi16(b));
}

/// Sets to +0 every non-finite bfloat16 (all exponent bits set: infinity or NaN) among the
/// `words` 32-bit words at x, two bfloat16 each. One read-only pass when there is none.
inline void zero_nonfinite_pairs(float* x, Index words) noexcept {
  const __m512i ones = _mm512_set1_epi16(0x7f80);
  const auto nonfinite = [&](__m512i w) {
    return _mm512_cmpeq_epi16_mask(_mm512_and_si512(w, ones), ones);
  };
  const Index whole = words / 16 * 16;
  const auto tail = static_cast<__mmask16>((1u << (words - whole)) - 1u);
  __mmask32 any = 0;
  for (Index i = 0; i < whole; i += 16) any |= nonfinite(_mm512_loadu_si512(x + i));
  any |= nonfinite(_mm512_maskz_loadu_epi32(tail, x + whole));
  if (any == 0) return;
  for (Index i = 0; i < words; i += 16) {
    const auto lanes = static_cast<__mmask16>(i + 16 <= words ? 0xffffu : tail);
    const __m512i w = _mm512_maskz_loadu_epi32(lanes, x + i);
    _mm512_mask_storeu_epi32(x + i, lanes, _mm512_maskz_mov_epi16(~nonfinite(w), w));
  }
}
