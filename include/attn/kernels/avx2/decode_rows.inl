// SPDX-License-Identifier: MIT
// attn/kernels/avx2/decode_rows.inl: the avx2 set's scores of a task of few query rows (a
// decode step's grouped heads, a short chunk: generic/attention.inl's dot-product rows) over
// float, bfloat16 or float16 keys, and a decode step's P V over 16-bit values (at most 4
// rows), each key or value row widened in registers (exactly) and multiplied in float, with
// no float copy of a tile: the scores 2 keys x 4 rows per step (8 accumulators of the 16
// registers), P V through values_block() (avx2/convert.inl). The AVX-512 form
// (avx512/decode_rows.inl) takes 4 keys per step in its 32 registers; the two sets' scores
// differ in their sums' order, each set's bits fixed. Included by attn/kernels/avx2.hpp after
// avx2/convert.inl (widen8(), values_block()); generic/attention.inl calls them for K and V
// in place, and through generic/kv_load.inl's stored_decode_scores() and stored_half_values()
// for a cache's rows.
//
// Before, this set widened each tile into float rows and took one dot product per key and row
// (each key loaded once per row, each sum reduced across its lanes): a decode step's attention
// over a bfloat16 cache at B 1, L 8192 (Llama-3-8B-shaped, hd 128) took longer than over a
// float cache (bench/results/2026-12-01-avx2-decode-rows.txt).

/// widen8() (avx2/convert.inl) for float rows: 8 elements loaded.
inline __m256 widen8(const float* at) noexcept { return _mm256_loadu_ps(at); }
/// The first `count` (< 8) elements at `at` as floats, the lanes past them +0.
template <class Element>
inline __m256 widen8_tail(const Element* at, Index count) noexcept {
  alignas(32) float lanes[8] = {};
  for (Index i = 0; i < count; ++i) lanes[i] = static_cast<float>(at[i]);
  return _mm256_load_ps(lanes);
}

/// Lanes 4 t + r: the sum of the 8 lanes of a[t][r] (t < 2, r < 4). Each 128-bit half's 4
/// elements first (pairs 0 + 1 and 2 + 3, then their sum: two hadds), then the halves' sums:
/// a fixed tree, so the same bits for the same inputs.
inline __m256 sum_2x4(const __m256 (&a)[2][4]) noexcept {
  __m256 h[2];  // h[t], each 128-bit half: the 4 rows' sums over that half's 4 elements
#pragma GCC unroll 2
  for (int t = 0; t < 2; ++t) {
    h[t] = _mm256_hadd_ps(_mm256_hadd_ps(a[t][0], a[t][1]), _mm256_hadd_ps(a[t][2], a[t][3]));
  }
  return _mm256_add_ps(_mm256_permute2f128_ps(h[0], h[1], 0x20),
                       _mm256_permute2f128_ps(h[0], h[1], 0x31));
}

/// s^T (st[j * ld + r]) of n keys stored as Key (float, bfloat16 or float16: key j at
/// k + j * k_rs, d elements) against `rows` float query rows q[r], times `scale` (after the
/// sum: one rounding, as the float path's). Rows in groups of 4 (the last group's rows past
/// `rows` repeat its last, computed and not stored; packed, ld 4 with rows <= 4: stored in the
/// spare columns, never read), 2 keys per step: 8 accumulators, each key's 8 elements widened
/// once for the 4 rows, the sums reduced by sum_2x4(), so each score's bits depend on its key
/// and row alone, not on the rows or keys beside them. The first group asks for the rows of
/// `ahead` key by key.
template <class Key>
inline bool decode_scores_avx2(const float* const* q, Index rows, const Key* k, Index k_rs, Index d,
                               Index n, float scale, float* st, Index ld,
                               const KeyPrefetch& ahead) noexcept {
  const Index full = d / 8, tail = d - full * 8;
  const __m256 vscale = _mm256_set1_ps(scale);
  const auto* bytes = reinterpret_cast<const unsigned char*>(k);
  const Index byte_rs = k_rs * Index(sizeof(Key));
  const bool packed = ld == 4 && rows <= 4;
  alignas(32) std::int32_t tail_lanes[8] = {};
  for (Index i = 0; i < tail; ++i) tail_lanes[i] = -1;
  const __m256i tail_mask = _mm256_load_si256(reinterpret_cast<const __m256i*>(tail_lanes));
  for (Index r0 = 0; r0 < rows; r0 += 4) {
    const float* qr[4];
    for (Index i = 0; i < 4; ++i) qr[i] = q[std::min<Index>(r0 + i, rows - 1)];
    const Index group = std::min<Index>(4, rows - r0);
    const __m128i row_lanes =
        _mm_cmpgt_epi32(_mm_set1_epi32(static_cast<int>(group)), _mm_setr_epi32(0, 1, 2, 3));
    for (Index j0 = 0; j0 < n; j0 += 2) {
      const Key* key[2];
#pragma GCC unroll 2
      for (int t = 0; t < 2; ++t) {
        key[t] = k + std::min<Index>(j0 + t, n - 1) * k_rs;  // past n: a repeat, not stored
        if (r0 == 0 && j0 + t < n) prefetch_for_key(ahead, bytes, byte_rs, j0 + t);
      }
      __m256 a[2][4];
#pragma GCC unroll 2
      for (int t = 0; t < 2; ++t) {
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) a[t][r] = _mm256_setzero_ps();
      }
      for (Index c = 0; c < full; ++c) {
        const __m256 k0 = widen8(key[0] + 8 * c), k1 = widen8(key[1] + 8 * c);
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
          const __m256 qv = _mm256_loadu_ps(qr[r] + 8 * c);
          a[0][r] = _mm256_fmadd_ps(k0, qv, a[0][r]);
          a[1][r] = _mm256_fmadd_ps(k1, qv, a[1][r]);
        }
      }
      if (tail != 0) {  // the last d % 8 elements; the lanes past d are +0 in both
        const __m256 k0 = widen8_tail(key[0] + 8 * full, tail);
        const __m256 k1 = widen8_tail(key[1] + 8 * full, tail);
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
          const __m256 qv = _mm256_maskload_ps(qr[r] + 8 * full, tail_mask);
          a[0][r] = _mm256_fmadd_ps(k0, qv, a[0][r]);
          a[1][r] = _mm256_fmadd_ps(k1, qv, a[1][r]);
        }
      }
      const Index keys = std::min<Index>(2, n - j0);
      const __m256 s = _mm256_mul_ps(sum_2x4(a), vscale);  // lane 4 t + r: key t, row r
      if (packed) {
        if (keys == 2) {
          _mm256_storeu_ps(st + j0 * 4, s);
        } else {
          _mm_storeu_ps(st + j0 * 4, _mm256_castps256_ps128(s));
        }
        continue;
      }
      _mm_maskstore_ps(st + j0 * ld + r0, row_lanes, _mm256_castps256_ps128(s));
      if (keys == 2)
        _mm_maskstore_ps(st + (j0 + 1) * ld + r0, row_lanes, _mm256_extractf128_ps(s, 1));
    }
  }
  return true;
}

inline bool decode_key_scores_part(const float* const* q, Index rows, const float* k, Index k_rs,
                                   Index d, Index n, float scale, float* st, Index ld,
                                   const KeyPrefetch& ahead) noexcept {
  return decode_scores_avx2(q, rows, k, k_rs, d, n, scale, st, ld, ahead);
}
inline bool decode_key_scores_part(const float* const* q, Index rows, const bfloat16* k, Index k_rs,
                                   Index d, Index n, float scale, float* st, Index ld,
                                   const KeyPrefetch& ahead) noexcept {
  return decode_scores_avx2(q, rows, k, k_rs, d, n, scale, st, ld, ahead);
}
inline bool decode_key_scores_part(const float* const* q, Index rows, const float16* k, Index k_rs,
                                   Index d, Index n, float scale, float* st, Index ld,
                                   const KeyPrefetch& ahead) noexcept {
  return decode_scores_avx2(q, rows, k, k_rs, d, n, scale, st, ld, ahead);
}

/// acc (rows, dv, row stride dv) += P V over n value rows stored as Half (row j at v[j]), P
/// read transposed out of p^T (pt[j * ld + r]), rounded to Half first when `round_weights` (a
/// storage-type module rounds P before P V), each row widened in registers, products summed in
/// float: 4 query rows x 16 elements per pass, 8 from each half of the rows (values_block(),
/// as int8_values_part() takes them; rows past `rows` weigh 0). A row holding a NaN or an
/// infinity, or a width that is not a multiple of 16: false, nothing done (the float path then
/// adds such a row only for the query rows that see its key, see clean_values()).
template <class Half>
inline bool half_values_avx2(const Half* const* v, Index n, Index dv, const float* pt, Index ld,
                             Index rows, bool round_weights, float* acc) noexcept {
  if (dv % 16 != 0) return false;
  const __m256i exponent =
      _mm256_set1_epi16(static_cast<short>(std::numeric_limits<Half>::infinity().bits()));
  for (Index j = 0; j < n; ++j) {
    __m256i seen = _mm256_setzero_si256();
    for (Index e = 0; e < dv; e += 16) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v[j] + e));
      seen = _mm256_or_si256(seen, _mm256_cmpeq_epi16(_mm256_and_si256(x, exponent), exponent));
    }
    if (!_mm256_testz_si256(seen, seen)) return false;
  }
  alignas(32) float w[kKeyBlock * 4];
  const Index half = dv / 2;
  for (Index r0 = 0; r0 < rows; r0 += 4) {
    const Index nr = std::min<Index>(4, rows - r0);
    for (Index j = 0; j < n; ++j) {
      for (Index i = 0; i < 4; ++i) {
        const float p = i < nr ? pt[j * ld + r0 + i] : 0.0f;
        w[j * 4 + i] = round_weights ? static_cast<float>(Half(p)) : p;
      }
    }
    for (Index e0 = 0; e0 < half; e0 += 8) {
      values_block(
          r0, rows, e0, e0 + half, n, dv, acc, [&](Index j, int i) { return w[j * 4 + i]; },
          [&](Index j, __m256* x) {
            x[0] = widen8(v[j] + e0);
            x[1] = widen8(v[j] + e0 + half);
          });
    }
  }
  return true;
}

inline bool half_values_part(const bfloat16* const* v, Index n, Index dv, const float* pt, Index ld,
                             Index rows, bool round_weights, float* acc) noexcept {
  return half_values_avx2(v, n, dv, pt, ld, rows, round_weights, acc);
}
inline bool half_values_part(const float16* const* v, Index n, Index dv, const float* pt, Index ld,
                             Index rows, bool round_weights, float* acc) noexcept {
  return half_values_avx2(v, n, dv, pt, ld, rows, round_weights, acc);
}
