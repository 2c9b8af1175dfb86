// SPDX-License-Identifier: MIT
// attn/kernels/avx512/decode_rows.inl: the scores of a task of few query rows (a decode step's
// grouped heads, a short chunk: generic/attention.inl's dot-product rows) over float, bfloat16
// or float16 keys, and a decode step's P V over 16-bit values (at most 4 rows), each key or
// value row widened in registers (exactly) and multiplied in float, with no float copy of a
// tile: the scores 4 keys x 4 rows per step, P V through values_block(). Included by
// attn/kernels/avx512.hpp after avx512/convert.inl (values_block(), first_lanes());
// generic/attention.inl calls them for K and V in place, and through generic/kv_load.inl's
// stored_decode_scores() and stored_half_values() for a cache's stored rows.
//
// The float path widens each tile into float rows and takes one dot product per key and row,
// each reduced across its lanes: a decode step over a bfloat16 cache at B 1, L 8192
// (Llama-3-8B-shaped, hd 128) on Zen 5 took 54 ns per key and KV head that way, 25 ns this
// way, against the 17 ns the rows' bytes take from memory
// (bench/results/2026-12-01-half-decode.txt).

/// widen16() (avx512/convert.inl) for float rows: 16 elements loaded.
inline __m512 widen16(const float* at) noexcept { return _mm512_loadu_ps(at); }
inline __m512 widen16(const float* at, __mmask16 mask) noexcept {
  return _mm512_maskz_loadu_ps(mask, at);
}

/// Lane 4 t + r: the sum of the 16 lanes of a[t][r] (t, r < 4). Each 128-bit lane's 4 elements
/// first (pairs 0 + 2 and 1 + 3, then their sum), then the 4 lanes' sums (0 + 1, 2 + 3, then
/// theirs): a fixed tree, so the same bits for the same inputs.
inline __m512 sum_4x4(const __m512 (&a)[4][4]) noexcept {
  __m512 w[4];  // w[t]: per 128-bit lane, the 4 rows' partial sums over its 4 elements
#pragma GCC unroll 4
  for (int t = 0; t < 4; ++t) {
    const __m512 t01 =
        _mm512_add_ps(_mm512_unpacklo_ps(a[t][0], a[t][1]), _mm512_unpackhi_ps(a[t][0], a[t][1]));
    const __m512 t23 =
        _mm512_add_ps(_mm512_unpacklo_ps(a[t][2], a[t][3]), _mm512_unpackhi_ps(a[t][2], a[t][3]));
    w[t] = _mm512_add_ps(_mm512_shuffle_ps(t01, t23, 0x44), _mm512_shuffle_ps(t01, t23, 0xEE));
  }
  const __m512 u0 =
      _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88), _mm512_shuffle_f32x4(w[0], w[1], 0xDD));
  const __m512 u1 =
      _mm512_add_ps(_mm512_shuffle_f32x4(w[2], w[3], 0x88), _mm512_shuffle_f32x4(w[2], w[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(u0, u1, 0x88), _mm512_shuffle_f32x4(u0, u1, 0xDD));
}

/// s^T (st[j * ld + r]) of n keys stored as Key (float, bfloat16 or float16: key j at
/// k + j * k_rs, d elements) against `rows` float query rows q[r], times `scale` (after the
/// sum: one rounding, as the float path's). Rows in groups of 4 (the last group's rows past
/// `rows` repeat its last, computed and not stored; packed, ld 4 with rows <= 4: stored in the
/// spare columns, never read), 4 keys per step: 16 accumulators, each key's 16 elements
/// widened once for the 4 rows, the sums reduced by sum_4x4(), so each score's bits depend on
/// its key and row alone, not on the rows or keys beside them. The first group asks for the
/// rows of `ahead` key by key.
template <class Key>
inline bool decode_scores_avx512(const float* const* q, Index rows, const Key* k, Index k_rs,
                                 Index d, Index n, float scale, float* st, Index ld,
                                 const KeyPrefetch& ahead) noexcept {
  const Index full = d / 16;
  const __mmask16 tail = convert_ops::first_lanes(d - full * 16);
  const __m512 vscale = _mm512_set1_ps(scale);
  const auto* bytes = reinterpret_cast<const unsigned char*>(k);
  const Index byte_rs = k_rs * Index(sizeof(Key));
  const bool packed = ld == 4 && rows <= 4;
  for (Index r0 = 0; r0 < rows; r0 += 4) {
    const float* qr[4];
    for (Index i = 0; i < 4; ++i) qr[i] = q[std::min<Index>(r0 + i, rows - 1)];
    const __mmask16 row_lanes = convert_ops::first_lanes(std::min<Index>(4, rows - r0));
    for (Index j0 = 0; j0 < n; j0 += 4) {
      const Key* key[4];
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
        key[t] = k + std::min<Index>(j0 + t, n - 1) * k_rs;  // past n: a repeat, not stored
        if (r0 == 0 && j0 + t < n) prefetch_for_key(ahead, bytes, byte_rs, j0 + t);
      }
      __m512 a[4][4];
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) a[t][r] = _mm512_setzero_ps();
      }
      for (Index c = 0; c < full; ++c) {
        __m512 kv[4];
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) kv[t] = widen16(key[t] + 16 * c);
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
          const __m512 qv = _mm512_loadu_ps(qr[r] + 16 * c);
#pragma GCC unroll 4
          for (int t = 0; t < 4; ++t) a[t][r] = _mm512_fmadd_ps(kv[t], qv, a[t][r]);
        }
      }
      if (tail != 0) {  // the last d % 16 elements; the lanes past d are +0 in both
        __m512 kv[4];
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) kv[t] = widen16(key[t] + 16 * full, tail);
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
          const __m512 qv = _mm512_maskz_loadu_ps(tail, qr[r] + 16 * full);
#pragma GCC unroll 4
          for (int t = 0; t < 4; ++t) a[t][r] = _mm512_fmadd_ps(kv[t], qv, a[t][r]);
        }
      }
      const Index keys = std::min<Index>(4, n - j0);
      const __m512 s = _mm512_mul_ps(sum_4x4(a), vscale);  // lane 4 t + r: key t, row r
      if (packed) {
        _mm512_mask_storeu_ps(st + j0 * 4, convert_ops::first_lanes(4 * keys), s);
        continue;
      }
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, s);
      for (Index t = 0; t < keys; ++t) {  // key t's 4 rows: a 128-bit lane
        _mm_mask_storeu_ps(st + (j0 + t) * ld + r0, static_cast<__mmask8>(row_lanes),
                           _mm_load_ps(lanes + 4 * t));
      }
    }
  }
  return true;
}

inline bool decode_key_scores_part(const float* const* q, Index rows, const float* k, Index k_rs,
                                   Index d, Index n, float scale, float* st, Index ld,
                                   const KeyPrefetch& ahead) noexcept {
  return decode_scores_avx512(q, rows, k, k_rs, d, n, scale, st, ld, ahead);
}
inline bool decode_key_scores_part(const float* const* q, Index rows, const bfloat16* k, Index k_rs,
                                   Index d, Index n, float scale, float* st, Index ld,
                                   const KeyPrefetch& ahead) noexcept {
  return decode_scores_avx512(q, rows, k, k_rs, d, n, scale, st, ld, ahead);
}
inline bool decode_key_scores_part(const float* const* q, Index rows, const float16* k, Index k_rs,
                                   Index d, Index n, float scale, float* st, Index ld,
                                   const KeyPrefetch& ahead) noexcept {
  return decode_scores_avx512(q, rows, k, k_rs, d, n, scale, st, ld, ahead);
}

/// acc (rows, dv, row stride dv) += P V over n value rows stored as Half (row j at v[j]), P
/// read transposed out of p^T (pt[j * ld + r]), rounded to Half first when `round_weights` (a
/// storage-type module rounds P before P V), each row widened in registers, products summed in
/// float: 4 query rows x 64 elements per pass (values_block(); rows past `rows` weigh 0). A row
/// holding a NaN or an infinity: false, nothing done (the float path then adds such a row only
/// for the query rows that see its key, see clean_values()).
template <class Half>
inline bool half_values_avx512(const Half* const* v, Index n, Index dv, const float* pt, Index ld,
                               Index rows, bool round_weights, float* acc) noexcept {
  const __m512i exponent =
      _mm512_set1_epi16(static_cast<short>(std::numeric_limits<Half>::infinity().bits()));
  for (Index j = 0; j < n; ++j) {
    for (Index e = 0; e < dv; e += 32) {
      const __mmask32 m = convert_ops::first_lanes32(dv - e);
      const __m512i x = _mm512_maskz_loadu_epi16(m, v[j] + e);
      if (_mm512_cmpeq_epi16_mask(_mm512_and_si512(x, exponent), exponent) != 0) return false;
    }
  }
  alignas(64) float w[kKeyBlock * 4];
  for (Index r0 = 0; r0 < rows; r0 += 4) {
    const Index nr = std::min<Index>(4, rows - r0);
    for (Index j = 0; j < n; ++j) {
      for (Index i = 0; i < 4; ++i) {
        const float p = i < nr ? pt[j * ld + r0 + i] : 0.0f;
        w[j * 4 + i] = round_weights ? static_cast<float>(Half(p)) : p;
      }
    }
    for (Index e0 = 0; e0 < dv; e0 += 64) {
      values_block(
          r0, rows, e0, std::min<Index>(64, dv - e0), n, dv, acc,
          [&](Index j, int i) { return w[j * 4 + i]; },
          [&](Index j, const __mmask16* mask, __m512* x) {
#pragma GCC unroll 4
            for (int c = 0; c < 4; ++c) x[c] = widen16(v[j] + e0 + 16 * c, mask[c]);
          });
    }
  }
  return true;
}

inline bool half_values_part(const bfloat16* const* v, Index n, Index dv, const float* pt, Index ld,
                             Index rows, bool round_weights, float* acc) noexcept {
  return half_values_avx512(v, n, dv, pt, ld, rows, round_weights, acc);
}
inline bool half_values_part(const float16* const* v, Index n, Index dv, const float* pt, Index ld,
                             Index rows, bool round_weights, float* acc) noexcept {
  return half_values_avx512(v, n, dv, pt, ld, rows, round_weights, acc);
}
