// SPDX-License-Identifier: MIT
// attn/kernels/avx512/int8_dot.inl: the avx512 set's scores of int8 keys against a quantised
// query (generic/kv_load.inl's int8_key_scores()) on AVX512-VNNI: vpdpbusd multiplies 64
// unsigned bytes by 64 signed bytes and adds each four products to a 32-bit lane, so one
// instruction does 64 multiply-adds of a key row. Included by attn/kernels/avx512.hpp inside
// namespace attn::kernels::avx512, in a target region that adds AVX512-VNNI; called only where
// the CPU has it (detail::cpu_has_avx512_vnni()).
//
// Signs: vpdpbusd takes one unsigned operand. The key bytes are flipped to k + 128 (one xor per
// 64 bytes, shared by every query row) and the query stays signed, so each lane sums
// (k + 128) q, and 128 sum(q) (per row, once per task) is subtracted after. The integers are
// exact (|sum| < 2^31 for rows under 66000 elements), so the result is the scalar loop's, bit
// for bit, whatever the order of the additions.
//
// Layout: 4 keys x 4 query rows per step. A key's 4 row accumulators reduce to one vector
// whose 128-bit lane L holds the 4 rows' partial sums over lane L (int8_reduce_rows()); 4 such
// vectors reduce across lanes to one whose lane t holds key t's 4 rows (int8_reduce_keys()),
// which is s^T's layout (keys x rows): one 4-float store per key.

/// 4 accumulators (16 lanes each) -> lane L (128 bits) of the result: [sum over lane L of a0,
/// of a1, of a2, of a3].
inline __m512i int8_reduce_rows(__m512i a0, __m512i a1, __m512i a2, __m512i a3) noexcept {
  const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(a0, a1), _mm512_unpackhi_epi32(a0, a1));
  const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(a2, a3), _mm512_unpackhi_epi32(a2, a3));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
}

/// 4 results of int8_reduce_rows() -> lane t (128 bits): the sums over all lanes of y_t.
inline __m512i int8_reduce_keys(__m512i y0, __m512i y1, __m512i y2, __m512i y3) noexcept {
  const __m512i u0 =
      _mm512_add_epi32(_mm512_shuffle_i32x4(y0, y1, 0x88), _mm512_shuffle_i32x4(y0, y1, 0xDD));
  const __m512i u1 =
      _mm512_add_epi32(_mm512_shuffle_i32x4(y2, y3, 0x88), _mm512_shuffle_i32x4(y2, y3, 0xDD));
  return _mm512_add_epi32(_mm512_shuffle_i32x4(u0, u1, 0x88), _mm512_shuffle_i32x4(u0, u1, 0xDD));
}

/// The scores of n keys against query rows r0 .. r0 + 3 (rows past q.rows repeat the last
/// row: computed, stored in s^T's spare columns, never read). Chunks: the key's 64-byte chunks,
/// known at compile time (the query's chunks then stay in registers), or 0: any width.
template <int Chunks>
inline void int8_scores_vnni_rows(const QuantizedQuery& q, Index r0, const unsigned char* k,
                                  Index k_rs, const float* ks, Index ks_rs, Index n, float* st,
                                  Index ld, const KeyPrefetch& ahead) noexcept {
  const Index chunks = Chunks > 0 ? Chunks : q.ld / 64;
  const Index tail = q.width - (chunks - 1) * 64;  // bytes of the last chunk
  const __mmask64 last = tail >= 64 ? ~__mmask64(0) : (__mmask64(1) << tail) - 1;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i qv[Chunks > 0 ? Chunks : 1][4];
#pragma GCC unroll 4
  for (Index c = 0; c < (Chunks > 0 ? Chunks : 0); ++c) {
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) qv[c][i] = _mm512_loadu_si512(q.q + (r0 + i) * q.ld + 64 * c);
  }
  const __m512i bias = _mm512_broadcast_i32x4(_mm_slli_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(q.sums + r0)), 7));  // 128 sum(q)
  const __m512 qs = _mm512_broadcast_f32x4(_mm_loadu_ps(q.scales + r0));
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  for (Index j0 = 0; j0 < n; j0 += 4) {
    __m512i y[4];
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) {
      const Index j = std::min<Index>(j0 + t, n - 1);  // past n: a repeat, not stored
      if (r0 == 0 && j0 + t < n) prefetch_for_key(ahead, k, k_rs, j);
      const unsigned char* key = k + j * k_rs;
      __m512i a[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                      _mm512_setzero_si512()};
#pragma GCC unroll 4
      for (Index c = 0; c < chunks; ++c) {
        // The last chunk's bytes past the row: 0, flipped to 128, times the query's 0 padding.
        const __m512i x = c + 1 < chunks ? _mm512_loadu_si512(key + 64 * c)
                                         : _mm512_maskz_loadu_epi8(last, key + 64 * c);
        const __m512i u = _mm512_xor_si512(x, flip);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          const __m512i qc = Chunks > 0 ? qv[Chunks > 0 ? c : 0][i]
                                        : _mm512_loadu_si512(q.q + (r0 + i) * q.ld + 64 * c);
          a[i] = _mm512_dpbusd_epi32(a[i], u, qc);
        }
      }
      y[t] = int8_reduce_rows(a[0], a[1], a[2], a[3]);
    }
    const __m512i dots = _mm512_sub_epi32(int8_reduce_keys(y[0], y[1], y[2], y[3]), bias);
    // The 4 keys' scales loaded one by one into the vector (gathered through a float[4] on the
    // stack, the vector load waited on 4 scalar stores it could not take its bytes from).
    const auto key_scale = [&](Index t) { return ks[std::min<Index>(j0 + t, n - 1) * ks_rs]; };
    const __m512 kscale = _mm512_permutexvar_ps(
        spread, _mm512_castps128_ps512(
                    _mm_setr_ps(key_scale(0), key_scale(1), key_scale(2), key_scale(3))));
    const __m512 s = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dots), kscale), qs);
    const Index keys = std::min<Index>(4, n - j0);
    float* to = st + j0 * ld + r0;
    _mm_storeu_ps(to, _mm512_castps512_ps128(s));
    if (keys > 1) _mm_storeu_ps(to + ld, _mm512_extractf32x4_ps(s, 1));
    if (keys > 2) _mm_storeu_ps(to + 2 * ld, _mm512_extractf32x4_ps(s, 2));
    if (keys > 3) _mm_storeu_ps(to + 3 * ld, _mm512_extractf32x4_ps(s, 3));
  }
}

/// int8_key_scores() on AVX512-VNNI (see the file comment); on a CPU without it, with
/// vpmaddubsw (int8_key_scores_madd(), the same bits). Both ask for the rows of `ahead` key by
/// key (prefetch_for_key()) in their first 4 query rows' pass.
inline bool int8_key_scores_part(const QuantizedQuery& q, const unsigned char* k, Index k_rs,
                                 const float* ks, Index ks_rs, Index n, float* st, Index ld,
                                 const KeyPrefetch& ahead) noexcept {
  if (!detail::cpu_has_avx512_vnni()) {
    return int8_key_scores_madd(q, k, k_rs, ks, ks_rs, n, st, ld, ahead);
  }
  for (Index r0 = 0; r0 < q.rows; r0 += 4) {
    switch (q.ld / 64) {
      case 1:
        int8_scores_vnni_rows<1>(q, r0, k, k_rs, ks, ks_rs, n, st, ld, ahead);
        break;
      case 2:
        int8_scores_vnni_rows<2>(q, r0, k, k_rs, ks, ks_rs, n, st, ld, ahead);
        break;
      default:
        int8_scores_vnni_rows<0>(q, r0, k, k_rs, ks, ks_rs, n, st, ld, ahead);
        break;
    }
  }
  return true;
}

// ---- P V over int8 values (generic/kv_load.inl's stored_int8_values()) ----
//
// The float form (avx512/convert.inl's int8_values_fma()) spends 32 FMAs on each value row
// for 4 query rows at hd 128, and 16 more instructions to widen its bytes: it bounded a decode
// step over an int8 cache (the value pass took about 22 cycles per key and KV head on Zen 5,
// in cache, the scores 21). vpdpwssd multiplies 32 pairs of signed 16-bit integers and adds
// each pair's products to a 32-bit lane: two keys' elements side by side in a lane, against
// the two keys' weights as 16-bit integers, do the work of 2 FMAs per lane.
//
// Weights: per query row and tile, w = p * scale (the float form's product, one rounding),
// then wq = round(w * 32767 / top) with top the row's largest |w| in the tile, |wq| <= 32767.
// Each weight is off by at most top / 65534 (2^-16 of the tile's largest, where the float form
// is off by 2^-24 of itself): about 1e-5 of the output on random data, far under the int8
// levels' own error (docs/kv_cache.md). The integer sums are exact (|sum| <= 128 keys x
// 32767 x 128 < 2^31), so their order does not matter; each row's tile then adds
// float(sum) * top / 32767 to its float accumulator, once per element.
//
// Layout: a pair of keys' 64 elements (bytes widened to 16 bits, the two rows' words
// interleaved, vpunpck[lh]wd) make 4 vectors of 16 lanes, elements 8 L + 0..3 (lo) and
// 8 L + 4..7 (hi) of each 128-bit lane L; the accumulators' lanes are put back in order
// (vpermt2d) when the tile is done.

/// a += the pairs of b times the pairs of w (vpdpwssd). GCC 12 kept each accumulator of the
/// intrinsic's loop in a register of its own and copied all 16 back every step (16 moves and 2
/// spills per pair of keys); the instruction written out keeps them in place.
inline __m512i dpwssd(__m512i a, __m512i b, __m512i w) noexcept {
#if defined(__GNUC__)
  __asm__("vpdpwssd %2, %1, %0" : "+v"(a) : "v"(b), "v"(w));
  return a;
#else
  return _mm512_dpwssd_epi32(a, b, w);
#endif
}

/// acc rows r0 .. r0 + 3 (of `rows`; rows past it weigh 0) += P V over n <= kKeyBlock int8
/// value rows on vpdpwssd (see above). False, nothing done, when a weight is not finite (P of
/// a NaN score: the caller takes the float form, which propagates it).
inline bool int8_values_vnni(const unsigned char* const* v, const float* const* vs, Index n,
                             Index dv, const float* pt, Index ld, Index rows, Index r0,
                             float* acc) noexcept {
  static_assert(kKeyBlock <= 256, "the tile's integer sums must stay under 2^31");
  // 1. Weights (n, 4 rows) and each row's largest; the weights past n are 0 (an odd tile's
  //    last pair).
  const Index nr = std::min<Index>(4, rows - r0);
  const __mmask8 live = static_cast<__mmask8>((1u << nr) - 1);
  alignas(64) float w[(kKeyBlock + 1) * 4];
  const __m128 magnitude = _mm_castsi128_ps(_mm_set1_epi32(0x7FFFFFFF));
  __m128 top = _mm_setzero_ps(), nan = _mm_setzero_ps();  // nan: x - x, NaN for NaN and Inf
  for (Index j = 0; j < n; ++j) {
    const __m128 x = _mm_mul_ps(_mm_maskz_loadu_ps(live, pt + j * ld + r0), _mm_set1_ps(vs[j][0]));
    nan = _mm_or_ps(nan, _mm_sub_ps(x, x));
    top = _mm_max_ps(top, _mm_and_ps(x, magnitude));
    _mm_store_ps(w + 4 * j, x);
  }
  if (_mm_movemask_ps(_mm_cmpunord_ps(nan, nan)) != 0) return false;
  _mm_store_ps(w + 4 * n, _mm_setzero_ps());
  // 2. The 16-bit weights, a pair of keys per 32-bit word: wp[t * 4 + i] = row i's weights of
  //    keys 2 t (low half) and 2 t + 1 (high half), each within [-32767, 32767].
  const __mmask8 some = _mm_cmp_ps_mask(top, _mm_setzero_ps(), _CMP_GT_OQ);
  const __m128 to_int = _mm_maskz_div_ps(some, _mm_set1_ps(32767.0f), top);
  const __m128 back = _mm_mul_ps(top, _mm_set1_ps(1.0f / 32767.0f));
  const Index pairs = (n + 1) / 2;
  alignas(64) std::int32_t wp[(kKeyBlock + 1) / 2 * 4];
  const __m128i most = _mm_set1_epi32(32767), least = _mm_set1_epi32(-32767);
  const auto level = [&](const float* x) {  // (x * 32767 / top can round past 32767)
    return _mm_max_epi32(_mm_min_epi32(_mm_cvtps_epi32(_mm_mul_ps(_mm_load_ps(x), to_int)), most),
                         least);
  };
  for (Index t = 0; t < pairs; ++t) {
    const __m128i lo = _mm_and_si128(level(w + 8 * t), _mm_set1_epi32(0xFFFF));
    _mm_store_si128(reinterpret_cast<__m128i*>(wp + 4 * t),
                    _mm_or_si128(lo, _mm_slli_epi32(level(w + 8 * t + 4), 16)));
  }
  alignas(16) float unit[4];  // each row's float per integer step: top / 32767
  _mm_store_ps(unit, back);
  // 3. 64 elements per pass: 4 rows x 4 vectors of 32-bit sums in registers.
  const __m512i in_order_lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i in_order_hi =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (Index e0 = 0; e0 < dv; e0 += 64) {
    const Index cols = std::min<Index>(64, dv - e0);
    const __mmask32 half0 = convert_ops::first_bytes32(cols), half1 = convert_ops::first_bytes32(cols - 32);
    __m512i a[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) a[i][c] = _mm512_setzero_si512();
    }
    for (Index t = 0; t < pairs; ++t) {
      const auto* x = reinterpret_cast<const std::int8_t*>(v[2 * t]) + e0;
      const auto* y = reinterpret_cast<const std::int8_t*>(v[std::min(2 * t + 1, n - 1)]) + e0;
      if (2 * t + 16 < n) {
        _mm_prefetch(reinterpret_cast<const char*>(v[2 * t + 16] + e0), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(v[2 * t + 17 < n ? 2 * t + 17 : 2 * t + 16] + e0),
                     _MM_HINT_T0);
      }
      const __m512i x0 = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(half0, x));
      const __m512i x1 = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(half1, x + 32));
      const __m512i y0 = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(half0, y));
      const __m512i y1 = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(half1, y + 32));
      const __m512i b[4] = {_mm512_unpacklo_epi16(x0, y0), _mm512_unpackhi_epi16(x0, y0),
                            _mm512_unpacklo_epi16(x1, y1), _mm512_unpackhi_epi16(x1, y1)};
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const __m512i wi = _mm512_set1_epi32(wp[4 * t + i]);
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) a[i][c] = dpwssd(a[i][c], b[c], wi);
      }
    }
    // 4. Elements back in order, acc += float(sum) * unit, under lane masks past cols.
    __mmask16 mask[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) mask[c] = convert_ops::first_lanes(std::max<Index>(0, cols - 16 * c));
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      if (i >= nr) break;
      const __m512 u = _mm512_set1_ps(unit[i]);
      float* out = acc + (r0 + i) * dv + e0;
      const __m512i sums[4] = {_mm512_permutex2var_epi32(a[i][0], in_order_lo, a[i][1]),
                               _mm512_permutex2var_epi32(a[i][0], in_order_hi, a[i][1]),
                               _mm512_permutex2var_epi32(a[i][2], in_order_lo, a[i][3]),
                               _mm512_permutex2var_epi32(a[i][2], in_order_hi, a[i][3])};
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m512 o = _mm512_maskz_loadu_ps(mask[c], out + 16 * c);
        _mm512_mask_storeu_ps(out + 16 * c, mask[c],
                              _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[c]), u, o));
      }
    }
  }
  return true;
}

/// acc (rows, dv, row stride dv) += P V over n <= kKeyBlock int8 value rows (row j at v[j],
/// its scale at vs[j][0]), P read transposed out of p^T (pt[j * ld + r]), 4 query rows at a
/// time: on vpdpwssd where the CPU has AVX512-VNNI and the weights are finite
/// (int8_values_vnni()), in float otherwise (int8_values_fma()).
inline bool int8_values_part(const unsigned char* const* v, const float* const* vs, Index n,
                             Index dv, const float* pt, Index ld, Index rows, float* acc) noexcept {
  const bool vnni = detail::cpu_has_avx512_vnni();
  for (Index r0 = 0; r0 < rows; r0 += 4) {
    if (!vnni || !int8_values_vnni(v, vs, n, dv, pt, ld, rows, r0, acc)) {
      int8_values_fma(v, vs, n, dv, pt, ld, rows, r0, acc);
    }
  }
  return true;
}

// ---- int4 keys (generic/kv_load.inl's int4 scores) ----
//
// A 64-byte chunk of an int4 row is 4 blocks, one per 128-bit lane: its low nibbles are each
// block's elements 0..15, its high nibbles elements 16..31, unsigned (k + 8), so vpdpbusd
// takes them as they are against the query's bytes rearranged to match (query chunk lo: each
// block's first 16 elements, hi: its last 16). Each 128-bit lane of a row's accumulator then
// sums one block; int8_reduce_rows() gives lane L = block L's 4 rows, less 8 sum(q) over the
// block (the same reduction over vpdpbusd(8, q)), converted and scaled by block L's scale,
// and the blocks are added in order.

/// The scores of n int4 keys against query rows r0 .. r0 + 3 (rows past q.rows repeat the
/// last row: computed, stored in s^T's spare columns, never read), 4 keys per step. Chunks:
/// 64-byte chunks of a key row (1 or 2; the query's in registers).
template <int Chunks>
inline void int4_scores_vnni_rows(const QuantizedQuery& q, Index r0, const unsigned char* k,
                                  Index k_rs, const float* ks, Index ks_rs, Index group, Index n,
                                  float* st, Index ld, const KeyPrefetch& ahead) noexcept {
  const Index row_bytes = stored_row_bytes(KVElement::kInt4, q.width);
  const Index blocks = row_bytes / (kInt4Block / 2);
  const __m512i low = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
  __m512i qlo[Chunks][4], qhi[Chunks][4], bias[Chunks];
  __mmask64 bytes[Chunks];
  Index scale_at[Chunks][4];  // block 4 c + L's scale index (clamped past the row: weight 0)
  // One scale per block and 4 blocks in the chunk: the chunk's scales are 4 consecutive floats
  // (one vector load instead of 4 scalar loads and 3 inserts per key and chunk).
  bool in_order[Chunks];
#pragma GCC unroll 2
  for (int c = 0; c < Chunks; ++c) {
    const Index left = std::max<Index>(0, row_bytes - 64 * c);
    bytes[c] = left >= 64 ? ~__mmask64(0) : (__mmask64(1) << left) - 1;
    __m512i sum8[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const std::int8_t* x = q.q + (r0 + i) * q.ld + 128 * c;
      const __m512i a = 128 * c < q.ld ? _mm512_loadu_si512(x) : _mm512_setzero_si512();
      const __m512i b = 128 * c + 64 < q.ld ? _mm512_loadu_si512(x + 64) : _mm512_setzero_si512();
      qlo[c][i] = _mm512_shuffle_i32x4(a, b, 0x88);  // lanes a0 a2 b0 b2
      qhi[c][i] = _mm512_shuffle_i32x4(a, b, 0xDD);  // lanes a1 a3 b1 b3
      sum8[i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), eight, qlo[c][i]),
                                    eight, qhi[c][i]);
    }
    bias[c] = int8_reduce_rows(sum8[0], sum8[1], sum8[2], sum8[3]);
    in_order[c] = true;
    for (int t = 0; t < 4; ++t) {
      const Index block = std::min<Index>(4 * c + t, blocks - 1);
      scale_at[c][t] = block * kInt4Block / group;
      in_order[c] = in_order[c] && scale_at[c][t] == 4 * c + t;
    }
  }
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const __m512 qs = _mm512_broadcast_f32x4(_mm_loadu_ps(q.scales + r0));
  for (Index j0 = 0; j0 < n; j0 += 4) {
    __m512 f[Chunks][4];  // key t's blocks 4 c + L (lane L), scaled, its 4 rows in each lane
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) {
      const Index j = std::min<Index>(j0 + t, n - 1);  // past n: a repeat, not stored
      if (r0 == 0 && j0 + t < n) prefetch_for_key(ahead, k, k_rs, j);
      const unsigned char* key = k + j * k_rs;
      const float* scales = ks + j * ks_rs;
#pragma GCC unroll 2
      for (int c = 0; c < Chunks; ++c) {
        const __m512i x = _mm512_maskz_loadu_epi8(bytes[c], key + 64 * c);
        const __m512i lo = _mm512_and_si512(x, low);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), low);
        __m512i a[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          a[i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, qlo[c][i]), hi,
                                     qhi[c][i]);
        }
        const __m512i dots = _mm512_sub_epi32(int8_reduce_rows(a[0], a[1], a[2], a[3]), bias[c]);
        const __m128 block_scales =
            in_order[c] ? _mm_loadu_ps(scales + 4 * c)
                        : _mm_setr_ps(scales[scale_at[c][0]], scales[scale_at[c][1]],
                                      scales[scale_at[c][2]], scales[scale_at[c][3]]);
        const __m512 kscale = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(block_scales));
        f[c][t] = _mm512_mul_ps(_mm512_cvtepi32_ps(dots), kscale);
      }
    }
    // The 4 keys' blocks transposed (128-bit lanes): g[L] lane t = key t's block 4 c + L, so
    // each key's blocks are added in order with one vector add per block for all 4 keys.
    __m512 total = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int c = 0; c < Chunks; ++c) {
      const __m512 u0 = _mm512_shuffle_f32x4(f[c][0], f[c][1], 0x44);
      const __m512 u1 = _mm512_shuffle_f32x4(f[c][0], f[c][1], 0xEE);
      const __m512 u2 = _mm512_shuffle_f32x4(f[c][2], f[c][3], 0x44);
      const __m512 u3 = _mm512_shuffle_f32x4(f[c][2], f[c][3], 0xEE);
      const __m512 g[4] = {_mm512_shuffle_f32x4(u0, u2, 0x88), _mm512_shuffle_f32x4(u0, u2, 0xDD),
                           _mm512_shuffle_f32x4(u1, u3, 0x88), _mm512_shuffle_f32x4(u1, u3, 0xDD)};
      total = c == 0 ? g[0] : _mm512_add_ps(total, g[0]);
      if (4 * c + 1 < blocks) total = _mm512_add_ps(total, g[1]);
      if (4 * c + 2 < blocks) total = _mm512_add_ps(total, g[2]);
      if (4 * c + 3 < blocks) total = _mm512_add_ps(total, g[3]);
    }
    const __m512 s = _mm512_mul_ps(total, qs);
    const Index keys = std::min<Index>(4, n - j0);
    float* to = st + j0 * ld + r0;
    _mm_storeu_ps(to, _mm512_castps512_ps128(s));
    if (keys > 1) _mm_storeu_ps(to + ld, _mm512_extractf32x4_ps(s, 1));
    if (keys > 2) _mm_storeu_ps(to + 2 * ld, _mm512_extractf32x4_ps(s, 2));
    if (keys > 3) _mm_storeu_ps(to + 3 * ld, _mm512_extractf32x4_ps(s, 3));
  }
}

/// The int4 scores on AVX512-VNNI (see above), for rows of up to 256 elements (2 chunks) whose
/// blocks each lie under one scale (a group of whole blocks, or one scale per row); on a CPU
/// without AVX512-VNNI or for longer rows, with vpmaddubsw (int4_key_scores_madd(), the same
/// bits); otherwise false. Rows asked for ahead as int8_key_scores_part() asks.
inline bool int4_key_scores_part(const QuantizedQuery& q, const unsigned char* k, Index k_rs,
                                 const float* ks, Index ks_rs, Index group, Index n, float* st,
                                 Index ld, const KeyPrefetch& ahead) noexcept {
  const Index chunks = (stored_row_bytes(KVElement::kInt4, q.width) + 63) / 64;
  if (group % kInt4Block != 0 && group < q.width) return false;
  if (!detail::cpu_has_avx512_vnni() || chunks > 2) {
    return int4_key_scores_madd(q, k, k_rs, ks, ks_rs, group, n, st, ld, ahead);
  }
  for (Index r0 = 0; r0 < q.rows; r0 += 4) {
    if (chunks == 1) {
      int4_scores_vnni_rows<1>(q, r0, k, k_rs, ks, ks_rs, group, n, st, ld, ahead);
    } else {
      int4_scores_vnni_rows<2>(q, r0, k, k_rs, ks, ks_rs, group, n, st, ld, ahead);
    }
  }
  return true;
}
