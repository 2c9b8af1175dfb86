// SPDX-License-Identifier: MIT
// attn/kernels/avx2/int8_vnni.inl: the avx2 set's scores of int8 keys against a quantised
// query (generic/kv_load.inl's int8_key_scores()) on AVX-VNNI, the VEX form of vpdpbusd: 32
// unsigned bytes times 32 signed bytes, each four products added to a 32-bit lane. Included by
// attn/kernels/avx2.hpp inside namespace attn::kernels::avx2, in a target region that adds
// AVX-VNNI; called only where the CPU has it (detail::cpu_has_avx_vnni(), see avx2/convert.inl).
// As on AVX512-VNNI (avx512/int8_dot.inl): the key bytes flipped to k + 128, the query signed,
// 128 sum(q) subtracted after; the integers are exact, so the scalar loop's bits.

/// int8_key_scores() for widths a multiple of 32: 2 keys x 4 query rows per step (rows past
/// q.rows repeat the last: stored in s^T's spare columns, never read), the products and
/// roundings of int8_key_scores_madd().
inline bool int8_key_scores_avx_vnni(const QuantizedQuery& q, const unsigned char* k, Index k_rs,
                                     const float* ks, Index ks_rs, Index n, float* st, Index ld,
                                     const KeyPrefetch& ahead = KeyPrefetch()) noexcept {
  const __m256i spread = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (Index r0 = 0; r0 < q.rows; r0 += 4) {
    const __m256 qs = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(q.scales + r0));
    const __m128i sums = _mm_slli_epi32(  // 128 sum(q) per row
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(q.sums + r0)), 7);
    const __m256i bias = _mm256_set_m128i(sums, sums);
    for (Index j0 = 0; j0 < n; j0 += 2) {
      if (r0 == 0) {  // the rows of `ahead`, as int8_key_scores_madd()
        prefetch_for_key(ahead, k, k_rs, j0);
        if (j0 + 1 < n) prefetch_for_key(ahead, k, k_rs, j0 + 1);
      }
      __m256i y[2];
      float scale[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma GCC unroll 2
      for (int t = 0; t < 2; ++t) {
        const Index j = std::min<Index>(j0 + t, n - 1);  // past n: a repeat, not stored
        const unsigned char* key = k + j * k_rs;
        scale[t] = ks[j * ks_rs];
        __m256i a[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                        _mm256_setzero_si256()};
        for (Index e = 0; e < q.width; e += 32) {
          const __m256i u =
              _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + e)), flip);
#pragma GCC unroll 4
          for (int i = 0; i < 4; ++i) {
            a[i] = _mm256_dpbusd_avx_epi32(
                a[i], u,
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q.q + (r0 + i) * q.ld + e)));
          }
        }
        y[t] = int8_reduce_rows(a[0], a[1], a[2], a[3]);
      }
      const __m256i dots =
          _mm256_sub_epi32(_mm256_add_epi32(_mm256_permute2x128_si256(y[0], y[1], 0x20),
                                            _mm256_permute2x128_si256(y[0], y[1], 0x31)),
                           bias);
      const __m256 kscale =
          _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(scale)), spread);
      const __m256 s = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dots), kscale), qs);
      float* to = st + j0 * ld + r0;
      _mm_storeu_ps(to, _mm256_castps256_ps128(s));
      if (j0 + 1 < n) _mm_storeu_ps(to + ld, _mm256_extractf128_ps(s, 1));
    }
  }
  return true;
}
