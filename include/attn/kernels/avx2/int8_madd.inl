// SPDX-License-Identifier: MIT
// attn/kernels/avx2/int8_madd.inl: the scores of int8 and int4 keys against a quantised
// query (generic/kv_load.inl's int8_key_scores() and int4_key_scores()) on AVX2's vpmaddwd
// and vpmaddubsw, exact, so the scalar loop's bits. The avx2 set's forms, and the avx512
// set's on a CPU without AVX512-VNNI. Included by
// avx2/convert.inl and avx512/convert.inl inside their sets' namespaces and target regions.

/// 4 accumulators (8 lanes each) -> lane L (128 bits) of the result: [sum over lane L of a0,
/// of a1, of a2, of a3].
inline __m256i int8_reduce_rows(__m256i a0, __m256i a1, __m256i a2, __m256i a3) noexcept {
  const __m256i t0 = _mm256_add_epi32(_mm256_unpacklo_epi32(a0, a1), _mm256_unpackhi_epi32(a0, a1));
  const __m256i t1 = _mm256_add_epi32(_mm256_unpacklo_epi32(a2, a3), _mm256_unpackhi_epi32(a2, a3));
  return _mm256_add_epi32(_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1));
}

/// 4 accumulators (8 lanes each) -> their 4 sums (int8_reduce_rows(), the two lanes added).
inline __m128i int8_row_sums(const __m256i* a) noexcept {
  const __m256i y = int8_reduce_rows(a[0], a[1], a[2], a[3]);
  return _mm_add_epi32(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1));
}

/// int8_key_scores() with AVX2's vpmaddubsw (no VNNI needed), exact, so the scalar loop's
/// bits: 32 bytes at a time, |k| (unsigned) times q with k's sign (vpsignb), pairs summed
/// into 16 bits (at most 2 * 128 * 127: the levels are within [-127, 127], a key byte of -128
/// would still fit), then into 32; a remaining 16 bytes widened to 16 bits for vpmaddwd.
/// 2 keys x 4 query rows per step (rows past q.rows repeat the last: stored in s^T's spare
/// columns, never read), asking for the rows of `ahead` key by key (KeyRequests).
/// Widths that are not a multiple of 16: false. (0.76x the instructions of widening every 16
/// bytes to 16 bits for vpmaddwd, int8 decode scores at hd 128, 4 rows.)
inline bool int8_key_scores_madd(const QuantizedQuery& q, const unsigned char* k, Index k_rs,
                                 const float* ks, Index ks_rs, Index n, float* st, Index ld,
                                 const KeyPrefetch& ahead = KeyPrefetch()) noexcept {
  if (q.width % 16 != 0) return false;
  const __m256i spread = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  const __m256i ones16 = _mm256_set1_epi16(1);
  const KeyRequests requests(ahead, k, k_rs);
  for (Index r0 = 0; r0 < q.rows; r0 += 4) {
    const __m256 qs = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(q.scales + r0));
    for (Index j0 = 0; j0 < n; j0 += 2) {
      if (r0 == 0) {
        requests(j0);
        if (j0 + 1 < n) requests(j0 + 1);
        if (j0 % 4 == 0) requests.scales(j0);
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
        Index e = 0;
        for (; e + 32 <= q.width; e += 32) {
          const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + e));
          const __m256i magnitude = _mm256_abs_epi8(x);
#pragma GCC unroll 4
          for (int i = 0; i < 4; ++i) {
            const __m256i qi =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q.q + (r0 + i) * q.ld + e));
            a[i] = _mm256_add_epi32(
                a[i], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(qi, x)),
                                        ones16));
          }
        }
        for (; e < q.width; e += 16) {
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

/// generic/kv_load.inl's int4_key_scores() with vpmaddubsw, exact, so the scalar loop's bits.
/// Block by block, each key's running sum kept in s^T (the same additions in the same order):
/// the block's query bytes of 4 rows stay in registers; each key's 16 bytes become its 32
/// levels + 8 as unsigned bytes (low nibbles: elements 0..15, high: 16..31), multiplied with
/// the signed query bytes, pairs summed into 16 bits (at most 2 * 15 * 127: no saturation),
/// then into 32; less 8 times the block's query sum, the exact dot product of the levels.
/// Rows past q.rows repeat the last (stored in s^T's spare columns, never read). The first
/// block's pass asks for the rows of `ahead` key by key (KeyRequests). Blocks under
/// two scales (group not a multiple of kInt4Block, smaller than the row): false. (Block by
/// block, with the query in registers: 0.64x the instructions of widening keys and query to
/// 16 bits for vpmaddwd key by key, int4 decode scores at hd 128, 4 rows.)
inline bool int4_key_scores_madd(const QuantizedQuery& q, const unsigned char* k, Index k_rs,
                                 const float* ks, Index ks_rs, Index group, Index n, float* st,
                                 Index ld, const KeyPrefetch& ahead = KeyPrefetch()) noexcept {
  if (group % kInt4Block != 0 && group < q.width) return false;
  constexpr Index half = kInt4Block / 2;
  const Index blocks = (q.width + kInt4Block - 1) / kInt4Block;
  const __m256i low = _mm256_set1_epi8(0x0F), ones8 = _mm256_set1_epi8(1);
  const __m256i ones16 = _mm256_set1_epi16(1);
  const KeyRequests requests(ahead, k, k_rs);
  for (Index r0 = 0; r0 < q.rows; r0 += 4) {
    const __m128 qs = _mm_loadu_ps(q.scales + r0);
    for (Index b = 0; b < blocks; ++b) {
      // The query's bytes of this block, 4 rows (zeros past its width up to q.ld, a multiple
      // of 64: whole blocks), and 8 times their sums.
      __m256i x[4], a[4];
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const Index r = std::min<Index>(r0 + i, q.rows - 1);
        x[i] =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q.q + r * q.ld + b * kInt4Block));
        a[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, x[i]), ones16);
      }
      const __m128i eight_sums = _mm_slli_epi32(int8_row_sums(a), 3);
      const Index scale_at = b * kInt4Block / group;
      const bool first = b == 0, last = b + 1 == blocks;
      for (Index j = 0; j < n; ++j) {
        if (first && r0 == 0) {
          requests(j);
          if (j % 4 == 0) requests.scales(j);
        }
        const __m128i raw =
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(k + j * k_rs + b * half));
        const __m256i v = _mm256_and_si256(
            _mm256_inserti128_si256(_mm256_castsi128_si256(raw), _mm_srli_epi16(raw, 4), 1), low);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) a[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(v, x[i]), ones16);
        const __m128i dots = _mm_sub_epi32(int8_row_sums(a), eight_sums);
        float* to = st + j * ld + r0;
        __m128 total = _mm_mul_ps(_mm_cvtepi32_ps(dots), _mm_set1_ps(ks[j * ks_rs + scale_at]));
        if (!first) total = _mm_add_ps(_mm_loadu_ps(to), total);
        if (last) total = _mm_mul_ps(total, qs);
        _mm_storeu_ps(to, total);
      }
    }
  }
  return true;
}
