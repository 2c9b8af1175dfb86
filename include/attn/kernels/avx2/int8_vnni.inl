// SPDX-License-Identifier: MIT
// attn/kernels/avx2/int8_vnni.inl: the avx2 set's scores of int8 keys against a quantised
// query (generic/kv_load.inl's int8_key_scores()) on AVX-VNNI, the VEX form of vpdpbusd: 32
// unsigned bytes times 32 signed bytes, each four products added to a 32-bit lane; and its
// P V over int8 and int4 values on AVX-VNNI's vpdpwssd (below). Included by
// attn/kernels/avx2.hpp inside namespace attn::kernels::avx2, in a target region that adds
// AVX-VNNI; called only where the CPU has it (detail::cpu_has_avx_vnni(), see
// avx2/int8_dispatch.inl).
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
  const KeyRequests requests(ahead, k, k_rs);
  for (Index r0 = 0; r0 < q.rows; r0 += 4) {
    const __m256 qs = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(q.scales + r0));
    const __m128i sums = _mm_slli_epi32(  // 128 sum(q) per row
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(q.sums + r0)), 7);
    const __m256i bias = _mm256_set_m128i(sums, sums);
    for (Index j0 = 0; j0 < n; j0 += 2) {
      if (r0 == 0) {  // the rows of `ahead`, as int8_key_scores_madd()
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

// ---- P V over int8 and int4 values on vpdpwssd (generic/kv_load.inl's stored_int8_values()
// and stored_int4_values()) ----
//
// The avx512 set's integer form (avx512/int8_dot.inl, int8_values_vnni()) at 8 lanes: per
// query row, tile and scale of a row, w = p * scale (the float forms' product, one rounding)
// becomes the 16-bit level round(w * 32767 / top), top the largest |w| of the row and scale
// over the tile; two keys' elements side by side in a 32-bit lane against the two keys' levels,
// exact int32 sums, float(sum) * top / 32767 added to the float accumulator once per tile.
// Each weight is off by at most top / 65534, as on AVX-512 (docs/kv_cache.md). The float
// forms (avx2/convert.inl) take 64 FMAs and 32 conversions per value row for 4 query rows at
// hd 128; this form 32 vpdpwssd and 16 widening shuffles.

/// a + the pairs of b times the pairs of w (AVX-VNNI's vpdpwssd). With the intrinsic, GCC 12
/// copied the int8 loop's 8 accumulators into other registers and spilled 2 of them every pair
/// of keys (as on AVX-512, avx512/int8_dot.inl's dpwssd()); the instruction written out keeps
/// them in place. "x": a register VEX can encode (ymm0-15).
inline __m256i dpwssd_avx(__m256i a, __m256i b, __m256i w) noexcept {
#if defined(__GNUC__)
  __asm__("%{vex%} vpdpwssd %2, %1, %0" : "+x"(a) : "x"(b), "x"(w));
  return a;
#else
  return _mm256_dpwssd_avx_epi32(a, b, w);
#endif
}

/// The levels of the weights of query rows r0 .. r0 + nr - 1 (nr <= 4; the rest weigh 0) on
/// n <= kKeyBlock keys under scale s of each key: p (pt[j * ld + r]) times vs[j][s], a pair of
/// keys per 32-bit word: wp[t * 4 + i] = row i's levels of keys 2 t (low half) and 2 t + 1 (high
/// half; 0 past n). unit[i]: the weight per level (top / 32767); sums[i]: the sum of row i's
/// levels. False, nothing usable, when a weight is not finite (P of a NaN score: the caller
/// takes the float form, which propagates it) or a row's largest is under 1e-30 (32767 / top
/// would overflow under 1e-34; the float form keeps such weights as they are).
inline bool weight_levels_avx(const float* const* vs, Index s, Index n, const float* pt, Index ld,
                              Index r0, Index nr, std::int32_t* wp, float* unit,
                              std::int32_t* sums) noexcept {
  static_assert(kKeyBlock <= 256, "a tile's integer sums must stay under 2^31");
  const __m128i live =
      _mm_cmpgt_epi32(_mm_set1_epi32(static_cast<int>(nr)), _mm_setr_epi32(0, 1, 2, 3));
  const __m128 magnitude = _mm_castsi128_ps(_mm_set1_epi32(0x7FFFFFFF));
  alignas(32) float w[(kKeyBlock + 1) / 2 * 8];  // pair t: key 2 t's rows, then key 2 t + 1's
  __m256 top = _mm256_setzero_ps(), nan = _mm256_setzero_ps();  // nan: x - x, NaN for NaN, Inf
  const Index pairs = (n + 1) / 2;
  for (Index t = 0; t < pairs; ++t) {
    const Index j = 2 * t;
    const bool second = j + 1 < n;
    const __m128 p0 = _mm_maskload_ps(pt + j * ld + r0, live);
    const __m128 p1 = second ? _mm_maskload_ps(pt + (j + 1) * ld + r0, live) : _mm_setzero_ps();
    const __m128 s0 = _mm_set1_ps(vs[j][s]), s1 = _mm_set1_ps(second ? vs[j + 1][s] : 0.0f);
    const __m256 x = _mm256_set_m128(_mm_mul_ps(p1, s1), _mm_mul_ps(p0, s0));
    nan = _mm256_or_ps(nan, _mm256_sub_ps(x, x));
    top = _mm256_max_ps(top, _mm256_and_ps(x, _mm256_set_m128(magnitude, magnitude)));
    _mm256_store_ps(w + 8 * t, x);
  }
  if (_mm256_movemask_ps(_mm256_cmp_ps(nan, nan, _CMP_UNORD_Q)) != 0) return false;
  const __m128 top4 = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
  const __m128 some = _mm_cmpgt_ps(top4, _mm_setzero_ps());
  if (_mm_movemask_ps(_mm_and_ps(some, _mm_cmplt_ps(top4, _mm_set1_ps(1e-30f)))) != 0) {
    return false;
  }
  // 32767 / top, and 0 for a row whose weights are all 0 (and the rows past nr).
  const __m128 to_level4 = _mm_and_ps(some, _mm_div_ps(_mm_set1_ps(32767.0f), top4));
  const __m256 to_level = _mm256_set_m128(to_level4, to_level4);
  _mm_storeu_ps(unit, _mm_mul_ps(top4, _mm_set1_ps(1.0f / 32767.0f)));
  // |x| <= top, so x * to_level rounds to at most 32767.01: converted, at most 32767.
  __m128i total = _mm_setzero_si128();
  for (Index t = 0; t < pairs; ++t) {
    const __m256i level = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(w + 8 * t), to_level));
    const __m128i lo = _mm256_castsi256_si128(level), hi = _mm256_extracti128_si256(level, 1);
    total = _mm_add_epi32(total, _mm_add_epi32(lo, hi));
    // The low 16 bits of lo's words, hi's low 16 bits above them.
    _mm_storeu_si128(reinterpret_cast<__m128i*>(wp + 4 * t),
                     _mm_blend_epi16(lo, _mm_slli_epi32(hi, 16), 0xAA));
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(sums), total);
  return true;
}

/// acc rows r0 .. r0 + 3 (row stride dv; rows past `rows` weigh 0) += P V over n <= kKeyBlock
/// value rows on vpdpwssd (see above): int8 rows (Int4 false; row j at v[j], its scale at
/// vs[j][0]) or int4 rows (row j's scales, one per `group` elements, at vs[j]; every block under
/// one scale; the nibbles are the unsigned q + 8, so each sum less 8 times the sum of its levels
/// is the sum over q). 16 elements per pass, 4 rows x 2 accumulators: a pair of keys' 16 bytes
/// interleaved (vpunpck[lh]bw; int4: a block's low or high nibbles, elements 0..15 or 16..31)
/// and widened to 16 bits make 2 vectors of 8 pairs, in order. dv a multiple of 16. False,
/// nothing done, where weight_levels_avx() is or the row has more than kLevelScales scales.
template <bool Int4>
inline bool values_avx_vnni(const unsigned char* const* v, const float* const* vs, Index group,
                            Index n, Index dv, const float* pt, Index ld, Index rows, Index r0,
                            float* acc) noexcept {
  constexpr Index kLevelScales = 8;  // hd 256 in groups of 32; 8 KB of levels on the stack
  constexpr Index kPairs = (kKeyBlock + 1) / 2;
  constexpr Index kBlockBytes = kInt4Block / 2;
  const Index scales = Int4 ? (dv + group - 1) / group : 1;
  if (scales > kLevelScales) return false;
  const Index nr = std::min<Index>(4, rows - r0);
  alignas(32) std::int32_t wp[kLevelScales][kPairs * 4];
  alignas(16) float unit[kLevelScales][4];
  alignas(16) std::int32_t sums[kLevelScales][4];
  for (Index s = 0; s < scales; ++s) {  // every scale's first: a false leaves acc untouched
    if (!weight_levels_avx(vs, s, n, pt, ld, r0, nr, wp[s], unit[s], sums[s])) return false;
  }
  const __m128i nibble = _mm_set1_epi8(0x0F);
  for (Index e0 = 0; e0 < dv; e0 += 16) {
    const Index s = Int4 ? e0 / group : 0;
    // The pass's bytes in a row: int8, elements e0 ..; int4, its block's 16 bytes (low nibbles
    // for the block's first 16 elements, high for its last 16).
    const Index offset = Int4 ? e0 / kInt4Block * kBlockBytes : e0;
    const bool high = Int4 && e0 % kInt4Block != 0;
    const bool ask = offset % 64 == 0 && !high;  // the first pass over a cache line of the rows
    __m256i a[4][2];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) a[i][0] = a[i][1] = _mm256_setzero_si256();
    for (Index t = 0; t < (n + 1) / 2; ++t) {
      const unsigned char* x = v[2 * t] + offset;
      const unsigned char* y = v[std::min(2 * t + 1, n - 1)] + offset;  // past n: weighs 0
      if (ask && 2 * t + 16 < n) {
        _mm_prefetch(reinterpret_cast<const char*>(v[2 * t + 16] + offset), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(v[std::min(2 * t + 17, n - 1)] + offset),
                     _MM_HINT_T0);
      }
      const __m128i bx = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
      const __m128i by = _mm_loadu_si128(reinterpret_cast<const __m128i*>(y));
      __m128i lo = _mm_unpacklo_epi8(bx, by), hi = _mm_unpackhi_epi8(bx, by);
      __m256i b[2];
      if constexpr (Int4) {
        if (high) {
          lo = _mm_srli_epi16(lo, 4);
          hi = _mm_srli_epi16(hi, 4);
        }
        b[0] = _mm256_cvtepu8_epi16(_mm_and_si128(lo, nibble));
        b[1] = _mm256_cvtepu8_epi16(_mm_and_si128(hi, nibble));
      } else {
        b[0] = _mm256_cvtepi8_epi16(lo);
        b[1] = _mm256_cvtepi8_epi16(hi);
      }
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const __m256i wi = _mm256_set1_epi32(wp[s][4 * t + i]);
        a[i][0] = dpwssd_avx(a[i][0], b[0], wi);
        a[i][1] = dpwssd_avx(a[i][1], b[1], wi);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      if (i >= nr) break;
      const __m256i bias = _mm256_set1_epi32(Int4 ? 8 * sums[s][i] : 0);
      const __m256 u = _mm256_set1_ps(unit[s][i]);
      float* out = acc + (r0 + i) * dv + e0;
#pragma GCC unroll 2
      for (int c = 0; c < 2; ++c) {
        _mm256_storeu_ps(out + 8 * c,
                         _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(a[i][c], bias)), u,
                                         _mm256_loadu_ps(out + 8 * c)));
      }
    }
  }
  return true;
}
