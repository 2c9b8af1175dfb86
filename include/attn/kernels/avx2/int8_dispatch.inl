// SPDX-License-Identifier: MIT
// attn/kernels/avx2/int8_dispatch.inl: the avx2 set's choice of its int8 scores form, in the
// set's own target region (included by attn/kernels/avx2.hpp after avx2/int8_vnni.inl), so that
// no code reachable on a CPU without AVX-VNNI is compiled with it.

/// int8_key_scores() with AVX-VNNI's vpdpbusd where the CPU has it (widths a multiple of 32,
/// int8_key_scores_avx_vnni()), else with vpmaddubsw (int8_key_scores_madd()): the same
/// integers, so the same bits.
inline bool int8_key_scores_part(const QuantizedQuery& q, const unsigned char* k, Index k_rs,
                                 const float* ks, Index ks_rs, Index n, float* st, Index ld,
                                 const KeyPrefetch& ahead) noexcept {
  if (q.width % 32 == 0 && detail::cpu_has_avx_vnni()) {
    return int8_key_scores_avx_vnni(q, k, k_rs, ks, ks_rs, n, st, ld, ahead);
  }
  return int8_key_scores_madd(q, k, k_rs, ks, ks_rs, n, st, ld, ahead);
}
