// SPDX-License-Identifier: MIT
// attn/kernels/avx512/backward_pairs.inl: what the attention backward's bfloat16 products
// (generic/attention_backward.inl, "bfloat16 products") need of the avx512 set beyond its
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
