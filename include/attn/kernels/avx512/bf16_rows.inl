// SPDX-License-Identifier: MIT
// attn/kernels/avx512/bf16_rows.inl: a decode step's few query rows (at most 4 per group: a
// step's grouped heads) over bfloat16 keys and values on vdpbf16ps, the `dot` path of a
// bfloat16 module's call when a task has so few rows that the k-pair micro-tiles would leave
// most of their lanes idle. Included by attn/kernels/avx512.hpp inside namespace
// attn::kernels::avx512, in the region that adds AVX512-BF16 (after bf16_dot.inl); called by
// generic/attention.inl's streaming_tile() only on that path, so only on CPUs that have it.
//
// Widened, each bfloat16 row costs a conversion per 16 elements and one FMA per element and
// query row: on Zen 5 (B 4, L 8192, Llama-3-8B-shaped, one thread) the step's two passes took
// about 75 cycles per key and KV head, against the 17 ns (60 cycles) the rows' 512 bytes take
// from memory. vdpbf16ps reads the rows as they are stored and does two products per lane:
//  - scores: 4 keys x 4 rows per step, each key's 32 elements against each row's (the query is
//    a bfloat16 row: exact), 16 accumulators reduced by sum_4x4() (decode_rows.inl), so each
//    score's bits depend on its key and row alone;
//  - P V: P rounded to bfloat16 (vcvtne2ps2bf16, as the k-pair paths round it), two keys' rows
//    interleaved word by word (vpunpck[lh]wd) against the pair of their weights, 4 rows x 64
//    elements per pass in 16 accumulators, the lanes put back in order (vpermt2ps) when the
//    tile is done and the tile's sums added to the float accumulator.
// Numerics: those of vdpbf16ps (avx512/bf16_dot.inl, docs/precision.md): products exact, each
// added in float, subnormal inputs and results flushed to zero.

/// 32 bfloat16 elements of a row, as vdpbf16ps reads them (pairs of neighbours); masked: the
/// words outside m are +0.
inline __m512bh bf16_row_words(const bfloat16* at) noexcept {
  return (__m512bh)_mm512_loadu_si512(at);
}
inline __m512bh bf16_row_words(const bfloat16* at, __mmask32 m) noexcept {
  return (__m512bh)_mm512_maskz_loadu_epi16(m, at);
}

/// s^T (st[j * ld + r]) of n bfloat16 keys (key j at k + j * k_rs, d elements) against `rows`
/// bfloat16 query rows q[r], times `scale` after the sum. Rows in groups of 4 (the last
/// group's rows past `rows` repeat its last: computed, not stored; packed, ld 4 with rows <= 4:
/// stored in the spare columns, never read), 4 keys per step (past n: a repeat, not stored).
/// The first group asks for the rows of `ahead` key by key.
inline void dot_rows_scores(const bfloat16* const* q, Index rows, const bfloat16* k, Index k_rs,
                            Index d, Index n, float scale, float* st, Index ld,
                            const KeyPrefetch& ahead) noexcept {
  const Index full = d / 32;
  const __mmask32 tail = convert_ops::first_lanes32(d - full * 32);
  const __m512 vscale = _mm512_set1_ps(scale);
  const auto* bytes = reinterpret_cast<const unsigned char*>(k);
  const Index byte_rs = k_rs * Index(sizeof(bfloat16));
  const bool packed = ld == 4 && rows <= 4;
  for (Index r0 = 0; r0 < rows; r0 += 4) {
    const bfloat16* qr[4];
    for (Index i = 0; i < 4; ++i) qr[i] = q[std::min<Index>(r0 + i, rows - 1)];
    const __mmask16 row_lanes = convert_ops::first_lanes(std::min<Index>(4, rows - r0));
    for (Index j0 = 0; j0 < n; j0 += 4) {
      const bfloat16* key[4];
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
        key[t] = k + std::min<Index>(j0 + t, n - 1) * k_rs;
        if (r0 == 0 && j0 + t < n) prefetch_for_key(ahead, bytes, byte_rs, j0 + t);
      }
      __m512 a[4][4];
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) a[t][r] = _mm512_setzero_ps();
      }
      for (Index c = 0; c < full; ++c) {
        __m512bh kv[4];
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) kv[t] = bf16_row_words(key[t] + 32 * c);
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
          const __m512bh qv = bf16_row_words(qr[r] + 32 * c);
#pragma GCC unroll 4
          for (int t = 0; t < 4; ++t) a[t][r] = _mm512_dpbf16_ps(a[t][r], kv[t], qv);
        }
      }
      if (tail != 0) {  // the last d % 32 elements; the words past d are +0 in both
        __m512bh kv[4];
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) kv[t] = bf16_row_words(key[t] + 32 * full, tail);
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
          const __m512bh qv = bf16_row_words(qr[r] + 32 * full, tail);
#pragma GCC unroll 4
          for (int t = 0; t < 4; ++t) a[t][r] = _mm512_dpbf16_ps(a[t][r], kv[t], qv);
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
      for (Index t = 0; t < keys; ++t) {
        _mm_mask_storeu_ps(st + (j0 + t) * ld + r0, static_cast<__mmask8>(row_lanes),
                           _mm_load_ps(lanes + 4 * t));
      }
    }
  }
}

/// The widest value row dot_rows_values() takes: its sums wait in a stack buffer of 4 rows
/// until all are known to be finite.
inline constexpr Index kDotRowsMaxValueDim = 256;

/// acc (rows, dv, row stride dv) += P V over n <= kKeyBlock bfloat16 value rows (row j at
/// v[j]), P read transposed out of p^T (pt[j * ld + r]) and rounded to bfloat16, for rows <= 4
/// (see the file comment). False, nothing done, for more rows, dv over kDotRowsMaxValueDim, or
/// when a sum is not finite (a value row holding a NaN or an infinity, or a weight that is
/// not finite: the caller's widened form then adds such a row only for the query rows that see
/// its key).
inline bool dot_rows_values(const bfloat16* const* v, Index n, Index dv, const float* pt, Index ld,
                            Index rows, float* acc) noexcept {
  if (rows > 4 || dv > kDotRowsMaxValueDim) return false;
  if (n <= 0) return true;
  const Index pairs = (n + 1) / 2;
  const __mmask8 rows_live = static_cast<__mmask8>((1u << rows) - 1);
  // Word 4 t + i: row i's weights of keys 2 t (low half) and 2 t + 1 (high half; +0 past n).
  alignas(64) std::uint32_t wp[(kKeyBlock / 2 + 1) * 4];
  for (Index t = 0; t < pairs; ++t) {
    const __m128 p0 = _mm_maskz_loadu_ps(rows_live, pt + 2 * t * ld);
    const __m128 p1 =
        2 * t + 1 < n ? _mm_maskz_loadu_ps(rows_live, pt + (2 * t + 1) * ld) : _mm_setzero_ps();
    const __m128i b = (__m128i)_mm_cvtne2ps_pbh(p1, p0);  // words: p0's 4, then p1's 4
    _mm_store_si128(reinterpret_cast<__m128i*>(wp + 4 * t),
                    _mm_unpacklo_epi16(b, _mm_srli_si128(b, 8)));
  }
  // Lanes 4 L + 0..3 of the low unpack hold elements 8 L + 0..3, of the high one 8 L + 4..7:
  // elements 0..15 and 16..31 of a 32-element chunk, in order.
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  alignas(64) float sums[4 * kDotRowsMaxValueDim];
  __m512 bad = _mm512_setzero_ps();  // x - x over the sums: NaN where one is NaN or infinite
  for (Index e0 = 0; e0 < dv; e0 += 64) {
    const Index cols = std::min<Index>(64, dv - e0);
    const __mmask32 m0 = convert_ops::first_lanes32(cols);
    const __mmask32 m1 = convert_ops::first_lanes32(cols - 32);
    __m512 a[2][2][4];  // [chunk][low, high unpack][row]
#pragma GCC unroll 2
    for (int c = 0; c < 2; ++c) {
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) a[c][h][i] = _mm512_setzero_ps();
      }
    }
    for (Index t = 0; t < pairs; ++t) {
      const bfloat16* x = v[2 * t];
      const bfloat16* y = 2 * t + 1 < n ? v[2 * t + 1] : nullptr;
      const __m512i x0 = _mm512_maskz_loadu_epi16(m0, x + e0);
      const __m512i x1 = _mm512_maskz_loadu_epi16(m1, x + e0 + 32);
      const __m512i y0 =
          y != nullptr ? _mm512_maskz_loadu_epi16(m0, y + e0) : _mm512_setzero_si512();
      const __m512i y1 =
          y != nullptr ? _mm512_maskz_loadu_epi16(m1, y + e0 + 32) : _mm512_setzero_si512();
      const __m512bh u[2][2] = {
          {(__m512bh)_mm512_unpacklo_epi16(x0, y0), (__m512bh)_mm512_unpackhi_epi16(x0, y0)},
          {(__m512bh)_mm512_unpacklo_epi16(x1, y1), (__m512bh)_mm512_unpackhi_epi16(x1, y1)}};
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const __m512bh w = (__m512bh)_mm512_set1_epi32(static_cast<int>(wp[4 * t + i]));
#pragma GCC unroll 2
        for (int c = 0; c < 2; ++c) {
#pragma GCC unroll 2
          for (int h = 0; h < 2; ++h) a[c][h][i] = _mm512_dpbf16_ps(a[c][h][i], u[c][h], w);
        }
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
#pragma GCC unroll 2
      for (int c = 0; c < 2; ++c) {
        const Index at = i * kDotRowsMaxValueDim + e0 + 32 * c;
        const __m512 lo = _mm512_permutex2var_ps(a[c][0][i], first, a[c][1][i]);
        const __m512 hi = _mm512_permutex2var_ps(a[c][0][i], second, a[c][1][i]);
        bad = _mm512_or_ps(bad, _mm512_or_ps(_mm512_sub_ps(lo, lo), _mm512_sub_ps(hi, hi)));
        _mm512_store_ps(sums + at, lo);
        _mm512_store_ps(sums + at + 16, hi);
      }
    }
  }
  if (_mm512_cmp_ps_mask(bad, bad, _CMP_UNORD_Q) != 0) return false;
  for (Index i = 0; i < rows; ++i) {
    float* out = acc + i * dv;
    const float* s = sums + i * kDotRowsMaxValueDim;
    for (Index e = 0; e < dv; e += 16) {
      const __mmask16 m = convert_ops::first_lanes(dv - e);
      _mm512_mask_storeu_ps(
          out + e, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, out + e), _mm512_load_ps(s + e)));
    }
  }
  return true;
}
