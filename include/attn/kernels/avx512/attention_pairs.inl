// SPDX-License-Identifier: MIT
// attn/kernels/avx512/attention_pairs.inl: the streaming attention's softmax passes on the
// scores of the k-pair paths (AMX and vdpbf16ps: generic/attention.inl's streaming_tile()).
// Included by attn/kernels/avx512.hpp inside namespace attn::kernels::avx512, in the target
// region that adds AVX512-BF16 (P is rounded by vcvtne2ps2bf16; no tile instruction), so both
// paths call them.
//
// With AMX or vdpbf16ps, s^T (keys x rows, row stride ld) leaves the products unscaled, and
// the passes between the two products (scale, bounds, max, exp, transpose into P) were as
// long as the products themselves (perf, B 8, H 8, T 512, d 64, causal, one core: the
// kernel's own loops 38 %, P's transpose 11 %, the tiles 24 %). These functions do them in
// two reads of s^T instead of five, with the same bits.

/// Pass 3 on k-pair scores, columns [c, c + 16) of s^T (keys [0, width)), `lanes` of them
/// real: each score times `scale` (one rounding, as scale_row()), -inf where key j0 + j is
/// outside the row's [begin, end) (when `bounded`), stored back; returns the column max.
inline __m512 pairs_scale_bound_max(float* st, Index ld, Index width, Index lanes, float scale,
                                    bool bounded, const Index* begin, const Index* end,
                                    Index j0) noexcept {
  const __mmask16 live = static_cast<__mmask16>(lanes >= 16 ? 0xffffu : (1u << lanes) - 1u);
  alignas(64) std::int32_t lo[16] = {}, hi[16] = {};
  for (Index r = 0; r < lanes; ++r) {
    lo[r] = static_cast<std::int32_t>(begin[r] - j0);
    hi[r] = static_cast<std::int32_t>(end[r] - j0);
  }
  const __m512i lo_v = _mm512_load_si512(lo), hi_v = _mm512_load_si512(hi);
  const __m512 s = _mm512_set1_ps(scale),
               minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 tmax = minus_inf;
  for (Index j = 0; j < width; ++j) {
    float* x = st + j * ld;
    __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(live, x), s);
    if (bounded) {
      const __m512i key = _mm512_set1_epi32(static_cast<int>(j));
      const __mmask16 out = _mm512_cmpgt_epi32_mask(lo_v, key) | _mm512_cmple_epi32_mask(hi_v, key);
      v = _mm512_mask_mov_ps(v, out, minus_inf);
    }
    _mm512_mask_storeu_ps(x, live, v);
    tmax = _mm512_max_ps(tmax, v);
  }
  return tmax;
}

/// exp(d) of 16 shifted scores d = s - shift (d <= 0, or NaN: pairs_exp_probabilities()), for
/// P, which is rounded to bfloat16's 8 bits, and the row sums l, which stay float: t = d log2(e)
/// (one rounding), then 2^t = 2^n 2^r with n = round(t) and r = t - n (exact: vreduceps), 2^r
/// by a degree-5 polynomial on [-1/2, 1/2] (fitted for relative error with its constant term 1,
/// so exp(0) = 1 exactly; at most 2 float ulp, 1.7e-7 relative) and 2^n by vscalefps. 10
/// vector instructions against vexp_nonpositive()'s 16 (its degree-7 polynomial and two-part
/// ln 2 reach 1 ulp): the exponentials were half the bfloat16 call (perf, B 8, H 8, T 512,
/// d 64). Error against exp(d): t's rounding adds |d| 2^-24 relative, so at most 1.7e-7 +
/// 6e-8 |d| (below 1e-6 for every d > -14; smaller terms are below 1e-6 of the row's largest,
/// exp(0) = 1). t below -125 (d below -86.6) gives +0, as vexp_nonpositive() does below
/// -86.3, so that no subnormal is produced (each row's sum is at least 1); NaN stays NaN.
inline __m512 pairs_exp_shifted(__m512 d) noexcept {
  const __m512 t = _mm512_mul_ps(d, _mm512_set1_ps(1.44269504088896341f));
  // t >= -125 or NaN (not less than, unordered true): 2^n p stays normal (p >= 2^-1/2).
  const __mmask16 keep = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-125.0f), _CMP_NLT_UQ);
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_reduce_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_set1_ps(1.326472731307149e-3f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.671512991189957e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.550733581185341e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.4022242426872253e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.931470036506653e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(keep, p, n);
}

/// A block of 16 keys x 16 rows of exponentials (x[i]: key i of rows 0-15; +0, NaN, or normal
/// floats: pairs_exp_shifted()'s results) rounded to bfloat16 and stored transposed: row r's 16
/// keys at out + r * ldo, rows [0, nr). vcvtne2ps2bf16 rounds two keys at once to nearest
/// even, as convert_ops::bfloat16_lanes() rounds them (subnormal inputs, none here, read as 0;
/// a NaN keeps its sign and payload where convert_row() writes 0x7FC0: P only multiplies V,
/// and a NaN there makes the output row NaN, written as 0x7FC0 whatever the payload). The
/// transpose then runs on 32-bit key pairs: each rounded pair of keys interleaved into one
/// word per row (vpermw), an 8 x 16 transpose of those words (unpacks, then vpermt2q), two
/// rows per register: 40 shuffles and 8 conversions per block against transpose16()'s 64
/// shuffles and 16 conversions of the floats.
inline void pairs_store_probabilities(const __m512 (&x)[16], Index nr, bfloat16* out,
                                      Index ldo) noexcept {
  // Word 2r of w[m]: key 2m of row r; word 2r + 1: key 2m + 1 (from y's halves).
  const __m512i pair = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                        8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  __m512i w[8];
  for (int m = 0; m < 8; ++m) {
    const __m512i y = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(x[2 * m + 1], x[2 * m]));
    w[m] = _mm512_permutexvar_epi16(pair, y);
  }
  // Dword transpose: after the unpacks, lane L of q[g][o] holds row 4L + o, key pairs
  // 4g .. 4g + 3.
  __m512i t[8], q[2][4];
  for (int k = 0; k < 4; ++k) {
    t[2 * k] = _mm512_unpacklo_epi32(w[2 * k], w[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_epi32(w[2 * k], w[2 * k + 1]);
  }
  for (int g = 0; g < 2; ++g) {
    q[g][0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    q[g][1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    q[g][2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    q[g][3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  // Row 4L + o: lane L of q[0][o], then lane L of q[1][o]; rows o, 4 + o in the first
  // register, 8 + o, 12 + o in the second.
  const __m512i first = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
  const __m512i second = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
  const auto store = [&](Index r, __m256i v) {
    if (r < nr) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * ldo), v);
  };
  for (int o = 0; o < 4; ++o) {
    const __m512i a = _mm512_permutex2var_epi64(q[0][o], first, q[1][o]);
    const __m512i b = _mm512_permutex2var_epi64(q[0][o], second, q[1][o]);
    store(o, _mm512_castsi512_si256(a));
    store(4 + o, _mm512_extracti64x4_epi64(a, 1));
    store(8 + o, _mm512_castsi512_si256(b));
    store(12 + o, _mm512_extracti64x4_epi64(b, 1));
  }
}

/// Passes 4 and 5a on k-pair scores: for rows [0, rows) of s^T's columns, e = exp(s - shift)
/// (pairs_exp_shifted(): s <= shift) for keys [0, n), summed per row in key order
/// into sum[r] (which starts at +0), and written transposed and rounded to bfloat16 (nearest even,
/// as convert_row()) into out (row stride ldo >= n rounded up to 16), +0 past key n and in rows
/// [rows, padded): pack_probabilities() of the exponentials, without storing them. Keys past
/// n are -inf in every row, so their +0 terms are left out of the sums, which they would not
/// change; so are blocks of 16 keys x 16 rows outside every one of those rows' [begin - key0,
/// end - key0) (when `bounded`: -inf there), whose P is +0 (the causal diagonal's far side).
/// `between()` is called after each computed block of 16 keys x 16 rows (the streaming
/// kernel issues the next tile's products there: AmxTileQueue).
template <class Between>
inline void pairs_exp_probabilities(const float* st, Index ld, Index n, Index rows, Index padded,
                                    const float* shift, bool bounded, const Index* begin,
                                    const Index* end, Index key0, float* sum, bfloat16* out,
                                    Index ldo, Between&& between) noexcept {
  const Index n16 = (n + 15) / 16 * 16;
  for (Index r0 = 0; r0 < rows; r0 += 16) {
    const Index nr = std::min<Index>(16, rows - r0);
    const __m512 sh = _mm512_loadu_ps(shift + r0);
    __m512 total = _mm512_setzero_ps();
    Index lo = 0, hi = n;  // the keys some row of this group sees
    if (bounded) {
      lo = n, hi = 0;
      for (Index r = r0; r < r0 + nr; ++r) {
        if (end[r] <= begin[r]) continue;
        lo = std::min(lo, begin[r] - key0), hi = std::max(hi, end[r] - key0);
      }
    }
    for (Index j0 = 0; j0 < n; j0 += 16) {
      const Index nj = std::min<Index>(16, n - j0);
      if (j0 >= hi || j0 + 16 <= lo) {
        for (Index r = 0; r < nr; ++r) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (r0 + r) * ldo + j0),
                              _mm256_setzero_si256());
        }
        continue;
      }
      __m512 x[16];
      for (Index i = 0; i < 16; ++i) {
        if (i < nj) {
          x[i] = pairs_exp_shifted(_mm512_sub_ps(_mm512_loadu_ps(st + (j0 + i) * ld + r0), sh));
          total = _mm512_add_ps(total, x[i]);
        } else {
          x[i] = _mm512_setzero_ps();
        }
      }
      pairs_store_probabilities(x, nr, out + r0 * ldo + j0, ldo);
      between();
    }
    _mm512_storeu_ps(sum + r0, total);
    for (Index r = 0; r < nr; ++r) {
      std::fill(out + (r0 + r) * ldo + n16, out + (r0 + r + 1) * ldo, bfloat16::from_bits(0));
    }
  }
  std::fill(out + rows * ldo, out + padded * ldo, bfloat16::from_bits(0));
}
