// SPDX-License-Identifier: MIT
// attn/kernels/avx512/bf16_dot.inl: the avx512 set's GEMM kernel for bfloat16 operands on
// AVX512-BF16: vdpbf16ps multiplies 16 lanes of bfloat16 k-pairs and adds both products to 16
// float accumulators, so one instruction does the work of two FMAs (bench/fma_peak.cpp
// measures both rates). Included by attn/kernels/avx512.hpp inside namespace
// attn::kernels::avx512, in a target region that adds AVX512-BF16 (after vec.inl, whose
// kMicroRows x kMicroVecs tile and transpose16() it uses); generic/gemm.inl calls it when the
// plan says `dot`.
//
// Layout: B^T packed as k-pairs (pack_pairs), word (q, c) of a micro-panel holding depth
// elements 2q (low half) and 2q + 1 (high half) of column c; A read in place, each row's pair
// at 2q a 32-bit broadcast. An odd depth's last pair is (a[depth - 1], +0) x (b[depth - 1], +0),
// so the padding adds +0 * +0 = +0 and never meets A's or B's memory beyond depth.
//
// Numerics (Intel SDM, VDPBF16PS; tests/kernels/bf16_gemm_test.cpp checks them bit for bit): per
// lane, acc = fma(a[2q+1], b[2q+1], acc) then acc = fma(a[2q], b[2q], acc), each rounded to nearest
// even; bfloat16 inputs and the accumulator are read with subnormals as zero, results that
// would be subnormal are flushed to zero; MXCSR is neither read nor written. See
// docs/precision.md.

/// pack_transposed() for the dot product: columns [j0, j0 + cols) and depth [p0, p0 + depth)
/// of a bfloat16 B (n, k), row-major with leading dimension ldb, as k-pairs (see above) into
/// out[q * ldo + c], q < (depth + 1) / 2. A pair is 32 contiguous bits of a row of B, so the
/// packing is a transpose of 32-bit words: blocks of 16 columns x 16 pairs through
/// transpose16(), the edges word by word.
inline void pack_pairs(const bfloat16* b, Index ldb, Index j0, Index cols, Index p0, Index depth,
                       float* out, Index ldo) noexcept {
  const Index pairs = depth / 2, words = (depth + 1) / 2;
  const Index pairs_fast = pairs / 16 * 16, cols_fast = cols / 16 * 16;
  for (Index c = 0; c < cols_fast; c += 16) {
    for (Index q = 0; q < pairs_fast; q += 16) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i) {
        r[i] = _mm512_loadu_ps(static_cast<const void*>(b + (j0 + c + i) * ldb + p0 + 2 * q));
      }
      transpose16(r);
      for (int i = 0; i < 16; ++i) _mm512_storeu_ps(out + (q + i) * ldo + c, r[i]);
    }
  }
  for (Index c = 0; c < cols; ++c) {
    const bfloat16* row = b + (j0 + c) * ldb + p0;
    for (Index q = c < cols_fast ? pairs_fast : 0; q < words; ++q) {
      const std::uint32_t high = 2 * q + 1 < depth ? row[2 * q + 1].bits() : 0u;
      const std::uint32_t word = row[2 * q].bits() | high << 16;
      std::memcpy(out + q * ldo + c, &word, sizeof word);
    }
  }
}

/// Rows [0, n) of a bfloat16 matrix (row stride ldv, `cols` wide) as k-pairs along its
/// columns, the layout of a B that is read row-major (attention's V): word (q, c) of out (row
/// stride ldo) holds row 2q's element c in its low half and row 2q + 1's in its high half (+0
/// past an odd n). Returns whether any element read is NaN or infinite (exponent all ones).
inline bool pack_row_pairs(const bfloat16* v, Index ldv, Index n, Index cols, float* out,
                           Index ldo) noexcept {
  const __m256i exponent = _mm256_set1_epi16(0x7f80);
  __m256i bad = _mm256_setzero_si256();
  bool bad_tail = false;
  for (Index q = 0; q < (n + 1) / 2; ++q) {
    const bfloat16* r0 = v + 2 * q * ldv;
    const bfloat16* r1 = 2 * q + 1 < n ? r0 + ldv : nullptr;
    float* to = out + q * ldo;
    Index c = 0;
    for (; c + 16 <= cols; c += 16) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + c));
      const __m256i b = r1 != nullptr ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1 + c))
                                      : _mm256_setzero_si256();
      bad = _mm256_or_si256(bad, _mm256_cmpeq_epi16(_mm256_and_si256(a, exponent), exponent));
      bad = _mm256_or_si256(bad, _mm256_cmpeq_epi16(_mm256_and_si256(b, exponent), exponent));
      // unpack interleaves within 128-bit lanes: columns 0-3 and 8-11, then 4-7 and 12-15.
      const __m256i lo = _mm256_unpacklo_epi16(a, b), hi = _mm256_unpackhi_epi16(a, b);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + c),
                          _mm256_permute2x128_si256(lo, hi, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + c + 8),
                          _mm256_permute2x128_si256(lo, hi, 0x31));
    }
    for (; c < cols; ++c) {
      const std::uint32_t low = r0[c].bits(), high = r1 != nullptr ? r1[c].bits() : 0u;
      bad_tail = bad_tail || (low & 0x7f80u) == 0x7f80u || (high & 0x7f80u) == 0x7f80u;
      const std::uint32_t word = low | high << 16;
      std::memcpy(to + c, &word, sizeof word);
    }
  }
  return bad_tail || _mm256_testz_si256(bad, bad) == 0;
}

/// Attention's P as the A operand of its P V product: p^T (n keys x `rows` floats, row stride
/// ld, rows <= 64 <= ld) transposed and rounded to bfloat16 (nearest even, as convert_row())
/// into out (row stride ldo >= n rounded up to 16), +0 past key n and in rows [rows,
/// padded). Blocks of 16 keys x 16 rows through transpose16(), each row then narrowed: one
/// pass and no float copy of P, though no faster than a float transpose and a conversion
/// (perf, B 1, H 16, T 1024, d 128 on AMX: 12 % of the time against their 13 %; the
/// transpose's shuffles dominate).
inline void pack_probabilities(const float* pt, Index ld, Index n, Index rows, Index padded,
                               bfloat16* out, Index ldo) noexcept {
  const Index n16 = (n + 15) / 16 * 16;
  for (Index r0 = 0; r0 < rows; r0 += 16) {
    const Index nr = std::min<Index>(16, rows - r0);
    for (Index j0 = 0; j0 < n; j0 += 16) {
      const Index nj = std::min<Index>(16, n - j0);
      __m512 x[16];
      for (Index i = 0; i < 16; ++i) {
        x[i] = i < nj ? _mm512_loadu_ps(pt + (j0 + i) * ld + r0) : _mm512_setzero_ps();
      }
      transpose16(x);  // x[r]: keys j0 .. j0 + 15 of row r0 + r
      for (Index r = 0; r < nr; ++r) {
        const __m512i b = convert_ops::bfloat16_lanes(_mm512_castps_si512(x[r]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (r0 + r) * ldo + j0),
                            _mm512_cvtepi32_epi16(b));
      }
    }
    for (Index r = 0; r < nr; ++r) {
      std::fill(out + (r0 + r) * ldo + n16, out + (r0 + r + 1) * ldo, bfloat16::from_bits(0));
    }
  }
  std::fill(out + rows * ldo, out + padded * ldo, bfloat16::from_bits(0));
}

/// The 32-bit broadcast of a k-pair of A: (a[0], a[1]), or (a[0], +0) for the odd tail.
inline __m512bh bf16_pair(const bfloat16* a) noexcept {
  std::uint32_t word = 0;
  std::memcpy(&word, a, sizeof word);
  return (__m512bh)_mm512_set1_epi32(static_cast<int>(word));
}
inline __m512bh bf16_single(const bfloat16* a) noexcept {
  return (__m512bh)_mm512_set1_epi32(static_cast<int>(a->bits()));
}
inline __m512bh bf16_words(const float* b) noexcept {
  return (__m512bh)_mm512_castps_si512(_mm512_loadu_ps(b));
}
inline __m512bh bf16_words(const float* b, Index n) noexcept {
  return (__m512bh)_mm512_castps_si512(Vec<float>::load_partial(b, n));
}

/// One micro-tile: C[r, c] = (accumulate ? C[r, c] : 0) + (sum_p A[r, p] B[p, c] + bias[c])
/// (bias +0 when null), r < Rows, c < cols <= micro_cols<float>(), the sum in k-pairs as
/// vdpbf16ps forms it (see above). A element (r, p) is a[r * lda + p]; `b` is a k-pair
/// micro-panel with row stride ldb (words). Row r of C starts at crow[r]. The same steps as
/// generic/microkernel.inl's micro_tile(), with the pairs' dot product for its FMAs.
template <int Rows>
inline void bf16_dot_tile(Index depth, const bfloat16* a, Index lda, const float* b, Index ldb,
                          float* const* crow, Index cols, bool accumulate,
                          const float* bias) noexcept {
  using V = Vec<float>;
  constexpr int W = V::kWidth;
  constexpr int NV = kMicroVecs;
  __m512 acc[Rows][NV];
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[r][v] = V::zero();
  }
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) __builtin_prefetch(crow[r] + v * W, 1, 3);
  }
  const Index pairs = depth / 2;
  if (cols >= NV * W) {
    for (Index q = 0; q < pairs; ++q) {
      __m512bh bv[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) bv[v] = bf16_words(b + q * ldb + v * W);
#pragma GCC unroll 8
      for (int r = 0; r < Rows; ++r) {
        const __m512bh av = bf16_pair(a + r * lda + 2 * q);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
      }
    }
  } else {
    for (Index q = 0; q < pairs; ++q) {
      __m512bh bv[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) bv[v] = bf16_words(b + q * ldb + v * W, cols - v * W);
#pragma GCC unroll 8
      for (int r = 0; r < Rows; ++r) {
        const __m512bh av = bf16_pair(a + r * lda + 2 * q);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
      }
    }
  }
  if (depth % 2 != 0) {  // the odd tail: (a, +0) x (b, +0)
    __m512bh bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = bf16_words(b + pairs * ldb + v * W, cols - v * W);
#pragma GCC unroll 8
    for (int r = 0; r < Rows; ++r) {
      const __m512bh av = bf16_single(a + r * lda + 2 * pairs);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  // Store: add the bias and/or the previous C, write the valid columns only (compile-time
  // bounds, fully unrolled: the accumulators stay in registers).
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    const Index n = cols - v * W;
    if (n > 0) {
      __m512 bias_v = V::zero();
      if (bias != nullptr)
        bias_v = n >= W ? V::load(bias + v * W) : V::load_partial(bias + v * W, n);
#pragma GCC unroll 8
      for (int r = 0; r < Rows; ++r) {
        float* cp = crow[r] + v * W;
        __m512 out = V::add(acc[r][v], bias_v);
        if (n >= W) {
          if (accumulate) out = V::add(out, V::load(cp));
          V::store(cp, out);
        } else {
          if (accumulate) out = V::add(out, V::load_partial(cp, n));
          V::store_partial(cp, out, n);
        }
      }
    }
  }
}

/// bf16_dot_tile for a run-time row count 1..Rows.
template <int Rows = kMicroRows>
inline void bf16_dot_tile_rows(Index rows, Index depth, const bfloat16* a, Index lda,
                               const float* b, Index ldb, float* const* crow, Index cols,
                               bool accumulate, const float* bias) noexcept {
  if (rows == Rows) {
    bf16_dot_tile<Rows>(depth, a, lda, b, ldb, crow, cols, accumulate, bias);
  } else if constexpr (Rows > 1) {
    bf16_dot_tile_rows<Rows - 1>(rows, depth, a, lda, b, ldb, crow, cols, accumulate, bias);
  }
}
