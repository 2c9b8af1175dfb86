// SPDX-License-Identifier: MIT
// attn/kernels/avx2/int8_dispatch.inl: the avx2 set's choice of its int8 scores form and of
// its int8 and int4 values forms, in the
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

/// acc (rows, dv, row stride dv) += P V over n <= kKeyBlock int8 value rows (row j at v[j], its
/// scale at vs[j][0]), P read transposed out of p^T (pt[j * ld + r]), 4 query rows at a time:
/// on AVX-VNNI's vpdpwssd where the CPU has it and the weights are finite
/// (values_avx_vnni()), in float otherwise (int8_values_fma()). Value widths that are not a
/// multiple of 16: false, nothing done.
inline bool int8_values_part(const unsigned char* const* v, const float* const* vs, Index n,
                             Index dv, const float* pt, Index ld, Index rows, float* acc) noexcept {
  if (dv % 16 != 0) return false;
  const bool vnni = detail::cpu_has_avx_vnni();
  for (Index r0 = 0; r0 < rows; r0 += 4) {
    if (!vnni || !values_avx_vnni<false>(v, vs, dv, n, dv, pt, ld, rows, r0, acc)) {
      int8_values_fma(v, vs, n, dv, pt, ld, rows, r0, acc);
    }
  }
  return true;
}

/// acc (rows, dv, row stride dv) += P V over n <= kKeyBlock int4 value rows (row j at v[j],
/// its scales, one per `group` elements, at vs[j]), 4 query rows at a time: on vpdpwssd where
/// the CPU has AVX-VNNI, the weights are finite and the row has at most 8 scales
/// (values_avx_vnni()), in float otherwise (int4_values_fma()). Value widths that are not a
/// multiple of 16, or blocks under two scales (group not a multiple of kInt4Block, smaller than
/// the row): false, nothing done.
inline bool int4_values_part(const unsigned char* const* v, const float* const* vs, Index group,
                             Index n, Index dv, const float* pt, Index ld, Index rows,
                             float* acc) noexcept {
  if (dv % 16 != 0 || (group % kInt4Block != 0 && group < dv)) return false;
  const bool vnni = detail::cpu_has_avx_vnni();
  for (Index r0 = 0; r0 < rows; r0 += 4) {
    if (!vnni || !values_avx_vnni<true>(v, vs, group, n, dv, pt, ld, rows, r0, acc)) {
      int4_values_fma(v, vs, group, n, dv, pt, ld, rows, r0, acc);
    }
  }
  return true;
}
