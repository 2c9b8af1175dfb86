// SPDX-License-Identifier: MIT
// attn/kernels/avx2/int8_madd.inl: the scores of int8 keys against a quantised query
// (generic/kv_load.inl's int8_key_scores()) on AVX2's vpmaddwd, exact, so the scalar loop's
// bits. The avx2 set's form, and the avx512 set's on a CPU without AVX512-VNNI. Included by
// avx2/convert.inl and avx512/convert.inl inside their sets' namespaces and target regions.

/// 4 accumulators (8 lanes each) -> lane L (128 bits) of the result: [sum over lane L of a0,
/// of a1, of a2, of a3].
inline __m256i int8_reduce_rows(__m256i a0, __m256i a1, __m256i a2, __m256i a3) noexcept {
  const __m256i t0 = _mm256_add_epi32(_mm256_unpacklo_epi32(a0, a1), _mm256_unpackhi_epi32(a0, a1));
  const __m256i t1 = _mm256_add_epi32(_mm256_unpacklo_epi32(a2, a3), _mm256_unpackhi_epi32(a2, a3));
  return _mm256_add_epi32(_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1));
}

/// int8_key_scores() with AVX2's vpmaddwd (no VNNI needed): 16 key bytes and 16 query
/// bytes widened to 16-bit lanes, each pair of products summed into a 32-bit lane, exactly, so
/// the scalar loop's bits. 2 keys x 4 query rows per step (rows past q.rows repeat the last:
/// stored in s^T's spare columns, never read). Widths that are not a multiple of 16: false.
inline bool int8_key_scores_madd(const QuantizedQuery& q, const unsigned char* k, Index k_rs,
                                 const float* ks, Index ks_rs, Index n, float* st,
                                 Index ld) noexcept {
  if (q.width % 16 != 0) return false;
  const __m256i spread = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  for (Index r0 = 0; r0 < q.rows; r0 += 4) {
    const __m256 qs = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(q.scales + r0));
    for (Index j0 = 0; j0 < n; j0 += 2) {
      __m256i y[2];
      float scale[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma GCC unroll 2
      for (int t = 0; t < 2; ++t) {
        const Index j = std::min<Index>(j0 + t, n - 1);  // past n: a repeat, not stored
        const unsigned char* key = k + j * k_rs;
        scale[t] = ks[j * ks_rs];
        __m256i a[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                        _mm256_setzero_si256()};
        for (Index e = 0; e < q.width; e += 16) {
          const __m256i x =
              _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(key + e)));
#pragma GCC unroll 4
          for (int i = 0; i < 4; ++i) {
            const __m256i qi = _mm256_cvtepi8_epi16(
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(q.q + (r0 + i) * q.ld + e)));
            a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(x, qi));
          }
        }
        y[t] = int8_reduce_rows(a[0], a[1], a[2], a[3]);
      }
      const __m256i dots = _mm256_add_epi32(_mm256_permute2x128_si256(y[0], y[1], 0x20),
                                            _mm256_permute2x128_si256(y[0], y[1], 0x31));
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

/// generic/kv_load.inl's int4_key_scores() with vpmaddwd, exact, so the scalar loop's bits:
/// each 16-byte block widened to 16-bit levels (low nibbles: elements 0..15, high: 16..31,
/// less 8), multiplied with the query's two halves of the block and summed per row, then
/// scaled and added block by block in order. 1 key x 4 query rows per step (rows past q.rows
/// repeat the last: stored in s^T's spare columns, never read). Blocks under two scales
/// (group not a multiple of kInt4Block, smaller than the row): false.
inline bool int4_key_scores_madd(const QuantizedQuery& q, const unsigned char* k, Index k_rs,
                                 const float* ks, Index ks_rs, Index group, Index n, float* st,
                                 Index ld) noexcept {
  if (group % kInt4Block != 0 && group < q.width) return false;
  constexpr Index half = kInt4Block / 2;
  const Index blocks = (q.width + kInt4Block - 1) / kInt4Block;
  const __m256i low = _mm256_set1_epi16(0x0F), eight = _mm256_set1_epi16(8);
  for (Index r0 = 0; r0 < q.rows; r0 += 4) {
    const __m128 qs = _mm_loadu_ps(q.scales + r0);
    for (Index j = 0; j < n; ++j) {
      const unsigned char* key = k + j * k_rs;
      const float* scales = ks + j * ks_rs;
      __m128 total = _mm_setzero_ps();
      for (Index b = 0; b < blocks; ++b) {
        const __m256i w =
            _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(key + b * half)));
        const __m256i lo = _mm256_sub_epi16(_mm256_and_si256(w, low), eight);
        const __m256i hi = _mm256_sub_epi16(_mm256_srli_epi16(w, 4), eight);
        __m256i a[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          // The query's bytes past its width are 0 up to q.ld, a multiple of 64 (whole blocks).
          const std::int8_t* x = q.q + (r0 + i) * q.ld + b * kInt4Block;
          const __m256i x0 =
              _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
          const __m256i x1 =
              _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + half)));
          a[i] = _mm256_add_epi32(_mm256_madd_epi16(lo, x0), _mm256_madd_epi16(hi, x1));
        }
        const __m256i y = int8_reduce_rows(a[0], a[1], a[2], a[3]);
        const __m128i dots =
            _mm_add_epi32(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1));
        const __m128 term =
            _mm_mul_ps(_mm_cvtepi32_ps(dots), _mm_set1_ps(scales[b * kInt4Block / group]));
        total = b == 0 ? term : _mm_add_ps(total, term);
      }
      _mm_storeu_ps(st + j * ld + r0, _mm_mul_ps(total, qs));
    }
  }
  return true;
}
