// SPDX-License-Identifier: MIT
// attn/kernels/avx512/int8_dot.inl: the avx512 set's integer kernels of a decode step over
// int8 and int4 rows on AVX512-VNNI: the scores of int8 keys against a quantised query
// (generic/kv_load.inl's int8_key_scores()), P V over int8 and int4 values on vpdpwssd
// (below) and the scores of int4 keys. For the scores, vpdpbusd multiplies 64
// unsigned bytes by 64 signed bytes and adds each four products to a 32-bit lane, so one
// instruction does 64 multiply-adds of a key row. Included by attn/kernels/avx512.hpp inside
// namespace attn::kernels::avx512, in a target region that adds AVX512-VNNI: the VNNI forms run
// only where the CPU has it (detail::cpu_has_avx512_vnni()); elsewhere int8_key_scores_part(),
// int8_values_part() and int4_values_part() take the forms without it
// (int8_key_scores_madd(), int8_values_fma(), int4_values_fma()).
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
  const KeyRequests requests(ahead, k, k_rs);
  for (Index j0 = 0; j0 < n; j0 += 4) {
    if (r0 == 0) requests.scales(j0);
    __m512i y[4];
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) {
      const Index j = std::min<Index>(j0 + t, n - 1);  // past n: a repeat, not stored
      if (r0 == 0 && j0 + t < n) requests(j);
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
    // The 4 keys' scales: one vector load where they lie side by side (a contiguous cache),
    // else loaded one by one into the vector (gathered through a float[4] on the stack, the
    // vector load waited on 4 scalar stores it could not take its bytes from).
    const auto key_scale = [&](Index t) { return ks[std::min<Index>(j0 + t, n - 1) * ks_rs]; };
    const __m128 scales4 = ks_rs == 1 && j0 + 4 <= n ? _mm_loadu_ps(ks + j0)
                                                     : _mm_setr_ps(key_scale(0), key_scale(1),
                                                                   key_scale(2), key_scale(3));
    const __m512 kscale = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(scales4));
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
/// key (KeyRequests) in their first 4 query rows' pass.
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

// ---- P V over int8 and int4 values (generic/kv_load.inl's stored_int8_values() and
// stored_int4_values()) ----
//
// The float forms (avx512/convert.inl's int8_values_fma(), int4_values_fma()) spend 32 FMAs
// on each value row for 4 query rows at hd 128, and 16 more instructions to widen its bytes:
// they bounded a decode step over an int8 cache (the value pass took about 22 cycles per key
// and KV head on Zen 5, in cache, the scores 21). vpdpwssd multiplies 32 pairs of signed
// 16-bit integers and adds each pair's products to a 32-bit lane: two keys' elements side by
// side in a lane, against the two keys' weights as 16-bit integers, do the work of 2 FMAs per
// lane.
//
// Weights (weight_levels()): per query row, tile and scale of a row (int8: one; int4: one per
// group), w = p * scale (the float forms' product, one rounding), then the level
// round(w * 32767 / top), top the largest |w| of the row and scale over the tile. Each weight
// is off by at most top / 65534 (2^-16 of the tile's largest, where the float form is off by
// 2^-24 of itself): 3e-5 to 7e-5 of P V on softmax-shaped weights, under 2 % of the int8 levels'
// own error (docs/kv_cache.md). The integer sums are exact (|sum| <= 128 keys x 32767 x 128 <
// 2^31), so their order does not matter; each tile then adds float(sum) * top / 32767 to the float
// accumulator, once per element.

/// a + the pairs of b times the pairs of w (vpdpwssd). With the intrinsic, GCC 12 kept each of
/// a loop's 16 accumulators in a register of its own and copied all 16 back every step (16
/// moves and 2 spills per pair of keys); the instruction written out keeps them in place.
inline __m512i dpwssd(__m512i a, __m512i b, __m512i w) noexcept {
#if defined(__GNUC__)
  __asm__("vpdpwssd %2, %1, %0" : "+v"(a) : "v"(b), "v"(w));
  return a;
#else
  return _mm512_dpwssd_epi32(a, b, w);
#endif
}

/// The levels of a pair of keys' weights w[0 .. 32) (to_level: levels per weight), packed
/// (pack: vpermt2w's word indices) as weight_levels() stores them, at wp[0 .. 16).
inline __m512i level_pair(const float* w, __m512 to_level, __m512i pack,
                          std::int32_t* wp) noexcept {
  const __m512i lo = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(w), to_level));
  const __m512i hi = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(w + 16), to_level));
  const __m512i both = _mm512_permutex2var_epi16(lo, pack, hi);
  _mm512_storeu_si512(wp, both);
  return both;
}

/// The weights of query rows r0 .. r0 + nr - 1 (nr <= 4; the rest weigh 0) on n <= kKeyBlock
/// keys, p (pt[j * ld + r]) times each key's scales vs[j][s0 + c], c < ns <= 4, as 16-bit
/// levels (see above), each row and scale in a lane c * 4 + i of one vector, a pair of keys per
/// 32-bit word: wp[t * 16 + c * 4 + i] = row i's levels under scale c of keys 2 t (low half)
/// and 2 t + 1 (high half; 0 past n). unit[c * 4 + i]: the weight per level (top / 32767);
/// sums[c * 4 + i]: the sum of the levels. False, nothing usable, when a weight is not finite
/// (P of a NaN score: the caller takes the float form, which propagates it) or a row's largest
/// is tiny (below).
inline bool weight_levels(const float* const* vs, Index s0, Index ns, Index n, const float* pt,
                          Index ld, Index r0, Index nr, std::int32_t* wp, float* unit,
                          std::int32_t* sums) noexcept {
  static_assert(kKeyBlock <= 256, "a tile's integer sums must stay under 2^31");
  const __mmask8 rows_live = static_cast<__mmask8>((1u << nr) - 1);
  const __mmask8 scales_live = static_cast<__mmask8>((1u << ns) - 1);
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  alignas(64) float w[(kKeyBlock + 1) * 16];
  const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF);
  // The largest |x| as an integer: the bits of non-negative floats order as the floats do, and
  // an infinity or a NaN lies above every finite one, so one vpmaxud per key both finds top and
  // keeps a non-finite weight in sight (instead of a float max, and x - x or-ed into a NaN
  // flag). With 4 rows and 4 scales (a decode step's GQA group over int4 rows), the p and scale
  // loads go unmasked. (With the level loop below: the int4 step 0.97x in cache, B 1 L 2048 on
  // Zen 5, the int8 step 0.99x.)
  __m512i top_bits = _mm512_setzero_si512();
  const auto weights = [&](auto all_live) {
    constexpr bool kAll = decltype(all_live)::value;
    for (Index j = 0; j < n; ++j) {
      const float* pj = pt + j * ld + r0;
      const __m512 p =
          _mm512_broadcast_f32x4(kAll ? _mm_loadu_ps(pj) : _mm_maskz_loadu_ps(rows_live, pj));
      const __m512 scale = _mm512_permutexvar_ps(
          spread, _mm512_castps128_ps512(kAll ? _mm_loadu_ps(vs[j] + s0)
                                              : _mm_maskz_loadu_ps(scales_live, vs[j] + s0)));
      const __m512 x = _mm512_mul_ps(p, scale);
      top_bits = _mm512_max_epu32(top_bits, _mm512_and_si512(_mm512_castps_si512(x), magnitude));
      _mm512_store_ps(w + 16 * j, x);
    }
  };
  if (nr == 4 && ns == 4) {
    weights(std::true_type());
  } else {
    weights(std::false_type());
  }
  if (_mm512_cmpgt_epu32_mask(top_bits, _mm512_set1_epi32(0x7F7FFFFF)) != 0) return false;
  const __m512 top = _mm512_castsi512_ps(top_bits);
  // A row whose largest weight is under 1e-30 (p ~ e^-60 and below; 32767 / top overflows
  // under 1e-34): the float form too, which keeps such weights as they are.
  const __mmask16 some = _mm512_cmp_ps_mask(top, _mm512_setzero_ps(), _CMP_GT_OQ);
  if (_mm512_mask_cmp_ps_mask(some, top, _mm512_set1_ps(1e-30f), _CMP_LT_OQ) != 0) return false;
  _mm512_store_ps(w + 16 * n, _mm512_setzero_ps());
  const __m512 to_level = _mm512_maskz_div_ps(some, _mm512_set1_ps(32767.0f), top);
  _mm512_storeu_ps(unit, _mm512_mul_ps(top, _mm512_set1_ps(1.0f / 32767.0f)));
  // |x| <= top, so x * to_level rounds to at most 32767.01: converted, at most 32767.
  // (lo & 0xFFFF) | (hi << 16) in one vpermt2w (word 2 m of lo, then word 2 m of hi), and the
  // levels summed from the packed words by vpdpwssd against ones (exact: 16-bit levels), two
  // sums in turn to halve the chain: 3 instructions a pair of keys instead of 5.
  const __m512i pack =
      _mm512_set_epi16(62, 30, 60, 28, 58, 26, 56, 24, 54, 22, 52, 20, 50, 18, 48, 16, 46, 14, 44,
                       12, 42, 10, 40, 8, 38, 6, 36, 4, 34, 2, 32, 0);
  const __m512i ones = _mm512_set1_epi16(1);
  const Index pairs = (n + 1) / 2;
  __m512i total0 = _mm512_setzero_si512(), total1 = _mm512_setzero_si512();
  Index t = 0;
  for (; t + 1 < pairs; t += 2) {
    total0 = dpwssd(total0, level_pair(w + 32 * t, to_level, pack, wp + 16 * t), ones);
    total1 = dpwssd(total1, level_pair(w + 32 * t + 32, to_level, pack, wp + 16 * t + 16), ones);
  }
  if (t < pairs) total0 = dpwssd(total0, level_pair(w + 32 * t, to_level, pack, wp + 16 * t), ones);
  _mm512_storeu_si512(sums, _mm512_add_epi32(total0, total1));
  return true;
}

/// out[0 .. cols) (cols <= 64, of query row r0 + i) += (float(a[c] - bias[c]) * unit[c]) for
/// the 4 vectors a[c] of 16 elements each, under lane masks past cols.
inline void add_level_sums(float* out, Index cols, const __m512i* a, const __m512i* bias,
                           const __m512* unit) noexcept {
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __mmask16 m = convert_ops::first_lanes(std::max<Index>(0, cols - 16 * c));
    const __m512 o = _mm512_maskz_loadu_ps(m, out + 16 * c);
    _mm512_mask_storeu_ps(
        out + 16 * c, m,
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(a[c], bias[c])), unit[c], o));
  }
}

/// acc rows r0 .. r0 + 3 (of `rows`; rows past it weigh 0) += P V over n <= kKeyBlock int8
/// value rows on vpdpwssd (see above). A pair of keys' 64 elements (bytes widened to 16 bits,
/// the two rows' words interleaved, vpunpck[lh]wd) make 4 vectors of 16 lanes, elements
/// 8 L + 0..3 (lo) and 8 L + 4..7 (hi) of each 128-bit lane L; the sums' lanes are put back
/// in order (vpermt2d) when the tile is done. False, nothing done, where weight_levels() is.
inline bool int8_values_vnni(const unsigned char* const* v, const float* const* vs, Index n,
                             Index dv, const float* pt, Index ld, Index rows, Index r0,
                             float* acc) noexcept {
  const Index nr = std::min<Index>(4, rows - r0);
  alignas(64) std::int32_t wp[(kKeyBlock + 1) / 2 * 16];
  alignas(64) float unit[16];
  alignas(64) std::int32_t sums[16];
  if (!weight_levels(vs, 0, 1, n, pt, ld, r0, nr, wp, unit, sums)) return false;
  const __m512i in_order_lo =
      _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i in_order_hi =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  const __m512i no_bias[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(),
                              _mm512_setzero_si512(), _mm512_setzero_si512()};
  for (Index e0 = 0; e0 < dv; e0 += 64) {
    const Index cols = std::min<Index>(64, dv - e0);
    const __mmask32 half0 = convert_ops::first_lanes32(cols);
    const __mmask32 half1 = convert_ops::first_lanes32(cols - 32);
    __m512i a[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) a[i][c] = _mm512_setzero_si512();
    }
    for (Index t = 0; t < (n + 1) / 2; ++t) {
      const auto* x = reinterpret_cast<const std::int8_t*>(v[2 * t]) + e0;
      const auto* y = reinterpret_cast<const std::int8_t*>(v[std::min(2 * t + 1, n - 1)]) + e0;
      if (2 * t + 16 < n) {
        _mm_prefetch(reinterpret_cast<const char*>(v[2 * t + 16] + e0), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(v[std::min(2 * t + 17, n - 1)] + e0),
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
        const __m512i wi = _mm512_set1_epi32(wp[16 * t + i]);
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) a[i][c] = dpwssd(a[i][c], b[c], wi);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      if (i >= nr) break;
      const __m512i in_order[4] = {_mm512_permutex2var_epi32(a[i][0], in_order_lo, a[i][1]),
                                   _mm512_permutex2var_epi32(a[i][0], in_order_hi, a[i][1]),
                                   _mm512_permutex2var_epi32(a[i][2], in_order_lo, a[i][3]),
                                   _mm512_permutex2var_epi32(a[i][2], in_order_hi, a[i][3])};
      const __m512 u = _mm512_set1_ps(unit[i]);
      const __m512 units[4] = {u, u, u, u};
      add_level_sums(acc + (r0 + i) * dv + e0, cols, in_order, no_bias, units);
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

/// The most scales of an int4 value row int4_values_vnni() takes (its weights' levels on the
/// stack, 4 scales per vector: 16 KB at 8).
inline constexpr Index kInt4LevelScales = 8;

/// vpshufb's byte indices for int4_values_vnni(): byte p of lane L takes byte 4 L + p / 4.
alignas(64) inline constexpr unsigned char kInt4PairBytes[64] = {
    0,  0,  0,  0,  1,  1,  1,  1,  2,  2,  2,  2,  3,  3,  3,  3,  4,  4,  4,  4,  5,  5,
    5,  5,  6,  6,  6,  6,  7,  7,  7,  7,  8,  8,  8,  8,  9,  9,  9,  9,  10, 10, 10, 10,
    11, 11, 11, 11, 12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15};

/// One pass of int4_values_vnni() (below) over the columns [e0, e0 + cols) of n <= kKeyBlock
/// int4 value rows, cols <= 2 kInt4Block, the pass's blocks from byte `offset` of each row
/// (Second: a second block exists): out rows i < nr (row stride dv) += the sums, the weights'
/// levels of the first block at w0[16 t + i] (pair t), of the second at w1, their sums and
/// units at sum0, unit0 and sum1, unit1 [i]. Its own function, templated on Second and kept
/// out of line, with its lambdas always inlined: so GCC keeps the 16 accumulators in registers
/// with no copies in the loop (the pass written inside int4_values_vnni() copied 3 of them back
/// and forth each pair of keys; this one inlined there, or its pair lambda called out of line
/// from the 3 loops, kept them in memory: the int4 step 1.25x the time). The pairs whose rows
/// are asked for ahead, the others, and the last odd key are looped apart (no clamping per
/// pair). A block's bytes are spread as in int4_values_vnni() into 16-bit words (x, y, x, y,
/// ...), taken whole, lo + 16 hi, with no mask: the sum less 16 times the high nibbles' sum,
/// once per pass, is the low nibbles' (exact: |sum| <= 256 keys x 32767 x 255 < 2^31). (The
/// int4 step 0.97x the time in cache, B 1 L 2048 on Zen 5, against that pass inside
/// int4_values_vnni() with the same weight_levels().)
template <bool Second>
[[gnu::noinline]] void int4_values_pass(const unsigned char* const* v, Index n, Index offset,
                                        const std::int32_t* w0, const std::int32_t* w1,
                                        const std::int32_t* sum0, const std::int32_t* sum1,
                                        const float* unit0, const float* unit1, Index nr,
                                        float* out, Index dv, Index cols) noexcept {
  __m512i a[4][4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) a[i][c] = _mm512_setzero_si512();
  }
  // Both keys' bytes of a block: b[0] the whole bytes (elements 0..15 in the low nibbles),
  // b[1] the high nibbles (elements 16..31), each 32-bit lane a pair (x, y) of 16-bit words.
  // kInt4PairBytes: byte p of lane L takes byte 4 L + p / 4 (of x where p % 4 is 0, of y where
  // it is 2; the words' high bytes 0).
  const __m512i pick = _mm512_load_si512(kInt4PairBytes);
  const __mmask64 x_bytes = 0x1111111111111111ull, y_bytes = 0x4444444444444444ull;
  const auto widen_block = [&](const unsigned char* x, const unsigned char* y, __m512i* b)
      __attribute__((always_inline)) {
    const __m512i xb = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
    const __m512i yb = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y)));
    b[0] =
        _mm512_mask_shuffle_epi8(_mm512_maskz_shuffle_epi8(x_bytes, xb, pick), y_bytes, yb, pick);
    b[1] = _mm512_srli_epi16(b[0], 4);
  };
  const auto pair = [&](const unsigned char* x, const unsigned char* y, Index t)
      __attribute__((always_inline)) {
    __m512i b[4];
    widen_block(x + offset, y + offset, b);
    if (Second) widen_block(x + offset + kInt4Block / 2, y + offset + kInt4Block / 2, b + 2);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const __m512i l0 = _mm512_set1_epi32(w0[16 * t + i]);
      a[i][0] = dpwssd(a[i][0], b[0], l0);
      a[i][1] = dpwssd(a[i][1], b[1], l0);
      if (Second) {
        const __m512i l1 = _mm512_set1_epi32(w1[16 * t + i]);
        a[i][2] = dpwssd(a[i][2], b[2], l1);
        a[i][3] = dpwssd(a[i][3], b[3], l1);
      }
    }
  };
  const auto ask = [&](Index j) __attribute__((always_inline)) {
    _mm_prefetch(reinterpret_cast<const char*>(v[j] + offset), _MM_HINT_T0);
  };
  const Index pairs = n / 2;
  // Pairs t whose keys 2 t + 16 and 2 t + 17 exist: both asked for ahead.
  const Index asking = std::clamp<Index>((n - 16) / 2, 0, pairs);
  Index t = 0;
  for (; t < asking; ++t) {
    ask(2 * t + 16), ask(2 * t + 17);
    pair(v[2 * t], v[2 * t + 1], t);
  }
  for (; t < pairs; ++t) {
    if (2 * t + 16 < n) ask(2 * t + 16);  // the last key, n - 1
    pair(v[2 * t], v[2 * t + 1], t);
  }
  if (n % 2 != 0) pair(v[n - 1], v[n - 1], t);  // its partner weighs 0
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    if (i >= nr) break;
    a[i][0] = _mm512_sub_epi32(a[i][0], _mm512_slli_epi32(a[i][1], 4));
    a[i][2] = _mm512_sub_epi32(a[i][2], _mm512_slli_epi32(a[i][3], 4));
    const __m512i bias0 = _mm512_set1_epi32(8 * sum0[i]);
    const __m512i bias1 = _mm512_set1_epi32(8 * sum1[i]);
    const __m512i bias[4] = {bias0, bias0, bias1, bias1};
    const __m512 u0 = _mm512_set1_ps(unit0[i]);
    const __m512 u1 = _mm512_set1_ps(unit1[i]);
    const __m512 units[4] = {u0, u0, u1, u1};
    add_level_sums(out + i * dv, cols, a[i], bias, units);
  }
}

/// acc rows r0 .. r0 + 3 (of `rows`; rows past it weigh 0) += P V over n <= kKeyBlock int4
/// value rows (row j at v[j], its scales, one per `group` elements, at vs[j]; every 32-element
/// block under one scale) on vpdpwssd (see above), with the levels of each scale's weights, in
/// passes of two blocks (int4_values_pass()). A block's 16 bytes of two keys, each broadcast to
/// the 4 lanes of a vector, are spread by two masked vpshufb into one vector of 16-bit words:
/// lane L holds bytes 4 L .. 4 L + 3 of both keys, one key's byte in each word's low half
/// (x, y, x, y, ...), so the low nibbles are elements 0..15 of the two keys side by side and
/// the high ones (shifted down) elements 16..31, in order; they are the unsigned q + 8, so each
/// sum less 8 times the sum of its levels is the sum over q. (4 instructions a block against
/// the 8 of interleaving the bytes and widening them, vpunpck[lh]bw and vpmovzxbw: the int4
/// step took 0.94x the time from memory and 0.95x in cache at hd 128 on Zen 5.) False, nothing
/// done, where weight_levels() is or the row has more than kInt4LevelScales scales.
inline bool int4_values_vnni(const unsigned char* const* v, const float* const* vs, Index group,
                             Index n, Index dv, const float* pt, Index ld, Index rows, Index r0,
                             float* acc) noexcept {
  constexpr Index kBlockBytes = kInt4Block / 2;
  constexpr Index kPairs = (kKeyBlock + 1) / 2;
  const Index scales = (dv + group - 1) / group;
  if (scales > kInt4LevelScales) return false;
  const Index nr = std::min<Index>(4, rows - r0);
  // Scales 4 g + c in wp[g], lane c * 4 + i.
  alignas(64) std::int32_t wp[kInt4LevelScales / 4][kPairs * 16];
  alignas(64) float unit[kInt4LevelScales / 4][16];
  alignas(64) std::int32_t sums[kInt4LevelScales / 4][16];
  for (Index g = 0; g * 4 < scales; ++g) {
    if (!weight_levels(vs, 4 * g, std::min<Index>(4, scales - 4 * g), n, pt, ld, r0, nr, wp[g],
                       unit[g], sums[g])) {
      return false;
    }
  }
  // Row i's level of scale s, pair t: wp[s / 4][t * 16 + s % 4 * 4 + i].
  const auto lane = [](Index s) { return s % 4 * 4; };
  for (Index e0 = 0; e0 < dv; e0 += 2 * kInt4Block) {
    const Index cols = std::min<Index>(2 * kInt4Block, dv - e0);
    const Index offset = e0 / kInt4Block * kBlockBytes;
    const Index s0 = e0 / group, s1 = std::min(e0 + kInt4Block, dv - 1) / group;
    const std::int32_t* w0 = wp[s0 / 4] + lane(s0);
    const std::int32_t* w1 = wp[s1 / 4] + lane(s1);
    const std::int32_t* sum0 = sums[s0 / 4] + lane(s0);
    const std::int32_t* sum1 = sums[s1 / 4] + lane(s1);
    const float* unit0 = unit[s0 / 4] + lane(s0);
    const float* unit1 = unit[s1 / 4] + lane(s1);
    if (cols > kInt4Block) {
      int4_values_pass<true>(v, n, offset, w0, w1, sum0, sum1, unit0, unit1, nr, acc + r0 * dv + e0,
                             dv, cols);
    } else {
      int4_values_pass<false>(v, n, offset, w0, w1, sum0, sum1, unit0, unit1, nr,
                              acc + r0 * dv + e0, dv, cols);
    }
  }
  return true;
}

/// acc (rows, dv, row stride dv) += P V over n <= kKeyBlock int4 value rows (row j at v[j],
/// its scales, one per `group` elements, at vs[j]), P read transposed out of p^T
/// (pt[j * ld + r]), 4 query rows at a time: on vpdpwssd where the CPU has AVX512-VNNI, the
/// weights are finite and the row has at most kInt4LevelScales scales (int4_values_vnni()), in
/// float otherwise (int4_values_fma()). Blocks under two scales (group not a multiple of
/// kInt4Block, smaller than the row): false, nothing done.
inline bool int4_values_part(const unsigned char* const* v, const float* const* vs, Index group,
                             Index n, Index dv, const float* pt, Index ld, Index rows,
                             float* acc) noexcept {
  if (group % kInt4Block != 0 && group < dv) return false;
  const bool vnni = detail::cpu_has_avx512_vnni();
  for (Index r0 = 0; r0 < rows; r0 += 4) {
    if (!vnni || !int4_values_vnni(v, vs, group, n, dv, pt, ld, rows, r0, acc)) {
      int4_values_fma(v, vs, group, n, dv, pt, ld, rows, r0, acc);
    }
  }
  return true;
}

// ---- int4 keys (generic/kv_load.inl's int4 scores) ----
//
// A 64-byte chunk of an int4 row is 4 blocks, one per 128-bit lane: its low nibbles are each
// block's elements 0..15, its high nibbles elements 16..31, unsigned (k + 8), so vpdpbusd
// takes them as they are against the query's bytes rearranged to match (query chunk lo: each
// block's first 16 elements, hi: its last 16). The 4 query rows share one accumulator a key:
// its lane (L, m) (element m of 128-bit lane L) sums block L of row m, so no reduction across
// lanes follows. In step r (0..3) the key's nibbles are rotated within each 128-bit lane by r
// dwords (vpshufd; none at r = 0), so element m meets the key's dword (m + r) % 4, against a
// query vector whose element (L, m) is row m's dword (m + r) % 4 of block L (built once per
// call): 8 vpdpbusd and 6 vpshufd a key in place of 8 vpdpbusd into 4 accumulators and the 9
// instructions of int8_reduce_rows(). The accumulators start at -8 sum(q) over the block (the
// k + 8 bias, the same sums as before). Lane L is then block L's 4 rows, converted and scaled
// by block L's scale, and the blocks are added in order, as before: the integers are exact, so
// the bits are those of the reduction. The 8 steps go to 4 accumulators (2 steps each, then 2
// levels of adds): with one chain of 8 the step took about 1.02x the time of 4 chains. (The
// int4 step 0.95-0.99x the time in cache, B 1 L 2048 on Zen 5, over several runs.)

/// Element m of each 128-bit lane from x[m] (vpblendmd).
inline __m512i int4_rows_in_lanes(const __m512i* x) noexcept {
  return _mm512_mask_blend_epi32(0xCCCC, _mm512_mask_blend_epi32(0x2222, x[0], x[1]),
                                 _mm512_mask_blend_epi32(0x8888, x[2], x[3]));
}

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
  // qr[c][2 r + h]: element (L, m) = row m's dword (m + r) % 4 of block 4 c + L, half h (lo,
  // hi); start[c]: -8 sum(q) over block 4 c + L of row m.
  __m512i qr[Chunks][8], start[Chunks];
  __mmask64 bytes[Chunks];
  Index scale_at[Chunks][4];  // block 4 c + L's scale index (clamped past the row: weight 0)
  // One scale per block and 4 blocks in the chunk: the chunk's scales are 4 consecutive floats
  // (one vector load instead of 4 scalar loads and 3 inserts per key and chunk).
  bool in_order[Chunks];
#pragma GCC unroll 2
  for (int c = 0; c < Chunks; ++c) {
    const Index left = std::max<Index>(0, row_bytes - 64 * c);
    bytes[c] = left >= 64 ? ~__mmask64(0) : (__mmask64(1) << left) - 1;
    __m512i sum8[4], half[2][4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const std::int8_t* x = q.q + (r0 + i) * q.ld + 128 * c;
      const __m512i a = 128 * c < q.ld ? _mm512_loadu_si512(x) : _mm512_setzero_si512();
      const __m512i b = 128 * c + 64 < q.ld ? _mm512_loadu_si512(x + 64) : _mm512_setzero_si512();
      half[0][i] = _mm512_shuffle_i32x4(a, b, 0x88);  // lanes a0 a2 b0 b2
      half[1][i] = _mm512_shuffle_i32x4(a, b, 0xDD);  // lanes a1 a3 b1 b3
      sum8[i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), eight, half[0][i]),
                                    eight, half[1][i]);
    }
    start[c] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                int8_reduce_rows(sum8[0], sum8[1], sum8[2], sum8[3]));
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m512i* x = half[h];
      const __m512i r1[4] = {
          _mm512_shuffle_epi32(x[0], _MM_PERM_ADCB), _mm512_shuffle_epi32(x[1], _MM_PERM_ADCB),
          _mm512_shuffle_epi32(x[2], _MM_PERM_ADCB), _mm512_shuffle_epi32(x[3], _MM_PERM_ADCB)};
      const __m512i r2[4] = {
          _mm512_shuffle_epi32(x[0], _MM_PERM_BADC), _mm512_shuffle_epi32(x[1], _MM_PERM_BADC),
          _mm512_shuffle_epi32(x[2], _MM_PERM_BADC), _mm512_shuffle_epi32(x[3], _MM_PERM_BADC)};
      const __m512i r3[4] = {
          _mm512_shuffle_epi32(x[0], _MM_PERM_CBAD), _mm512_shuffle_epi32(x[1], _MM_PERM_CBAD),
          _mm512_shuffle_epi32(x[2], _MM_PERM_CBAD), _mm512_shuffle_epi32(x[3], _MM_PERM_CBAD)};
      qr[c][h] = int4_rows_in_lanes(x);
      qr[c][2 + h] = int4_rows_in_lanes(r1);
      qr[c][4 + h] = int4_rows_in_lanes(r2);
      qr[c][6 + h] = int4_rows_in_lanes(r3);
    }
    in_order[c] = true;
    for (int t = 0; t < 4; ++t) {
      const Index block = std::min<Index>(4 * c + t, blocks - 1);
      scale_at[c][t] = block * kInt4Block / group;
      in_order[c] = in_order[c] && scale_at[c][t] == 4 * c + t;
    }
  }
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const __m512 qs = _mm512_broadcast_f32x4(_mm_loadu_ps(q.scales + r0));
  const KeyRequests requests(ahead, k, k_rs);
  for (Index j0 = 0; j0 < n; j0 += 4) {
    if (r0 == 0) requests.scales(j0);
    __m512 f[Chunks][4];  // key t's blocks 4 c + L (lane L), scaled, its 4 rows in each lane
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) {
      const Index j = std::min<Index>(j0 + t, n - 1);  // past n: a repeat, not stored
      if (r0 == 0 && j0 + t < n) requests(j);
      const unsigned char* key = k + j * k_rs;
      const float* scales = ks + j * ks_rs;
#pragma GCC unroll 2
      for (int c = 0; c < Chunks; ++c) {
        const __m512i x = _mm512_maskz_loadu_epi8(bytes[c], key + 64 * c);
        const __m512i lo = _mm512_and_si512(x, low);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), low);
        const __m512i* qc = qr[c];
        __m512i a0 = _mm512_dpbusd_epi32(start[c], lo, qc[0]);
        __m512i a1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, qc[1]);
        __m512i a2 = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                         _mm512_shuffle_epi32(lo, _MM_PERM_ADCB), qc[2]);
        __m512i a3 = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                         _mm512_shuffle_epi32(hi, _MM_PERM_ADCB), qc[3]);
        a0 = _mm512_dpbusd_epi32(a0, _mm512_shuffle_epi32(lo, _MM_PERM_BADC), qc[4]);
        a1 = _mm512_dpbusd_epi32(a1, _mm512_shuffle_epi32(hi, _MM_PERM_BADC), qc[5]);
        a2 = _mm512_dpbusd_epi32(a2, _mm512_shuffle_epi32(lo, _MM_PERM_CBAD), qc[6]);
        a3 = _mm512_dpbusd_epi32(a3, _mm512_shuffle_epi32(hi, _MM_PERM_CBAD), qc[7]);
        const __m512i dots = _mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3));
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
