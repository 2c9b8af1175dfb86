// SPDX-License-Identifier: MIT
// attn/kernels/generic/microkernel.inl: the register-blocked product C (rows x cols) (+)=
// alpha * A (rows x k) * B (k x cols), A broadcast with any strides, B row-major; every
// product in attn (projections, Q K^T, P V) is a loop over this kernel. Written once over a
// set's Vec and its kMicroRows x kMicroVecs tile shape.

/// Columns of one micro-tile: kMicroVecs registers.
template <class Scalar>
constexpr Index micro_cols() noexcept {
  return Index{kMicroVecs} * Vec<Scalar>::kWidth;
}

/// B's rows for micro_tile(): row p at b + p * ldb (row-major B).
template <class Scalar>
struct StridedRows {
  const Scalar* b;
  Index ldb;
  const Scalar* operator()(Index p) const noexcept { return b + p * ldb; }
};

/// B's rows one address each (rows[p] + offset): the value rows of a paged cache, read in
/// their blocks with the same arithmetic as a contiguous B.
template <class Scalar>
struct GatheredRows {
  const Scalar* const* rows;
  Index offset;
  const Scalar* operator()(Index p) const noexcept { return rows[p] + offset; }
};

/// One micro-tile: C[r, c] = (accumulate ? C[r, c] : 0) + alpha * sum_p A[r, p] B[p, c]
/// (+ bias[c] when bias is given), for r < Rows and c < cols (cols <= micro_cols()).
/// A element (r, p) is a[r * ars + p * acs] (A is only ever broadcast, so any strides
/// work: acs = 1 is row-major A, ars = 1 is A stored transposed); B element (p, c) is
/// brow(p)[c] (StridedRows or GatheredRows). Reads of B beyond `cols` are masked off (no
/// memory touched). Row r of C starts at crow[r] (rows need not be evenly spaced).
template <class Scalar, int Rows, class BRows>
inline void micro_tile(Index k, const Scalar* a, Index ars, Index acs, BRows brow,
                       Scalar* const* crow, Index cols, Scalar alpha, bool accumulate,
                       const Scalar* bias) noexcept {
  using V = Vec<Scalar>;
  using Reg = typename V::Reg;
  constexpr int W = V::kWidth;
  constexpr int NV = kMicroVecs;
  Reg acc[Rows][NV];
#if defined(__GNUC__)
#pragma GCC unroll 8
#endif
  for (int r = 0; r < Rows; ++r) {
#if defined(__GNUC__)
#pragma GCC unroll 8
#endif
    for (int v = 0; v < NV; ++v) acc[r][v] = V::zero();
  }
#if defined(__GNUC__)
  // Fetch the C tile while the k loop runs: it was last touched a whole depth block ago.
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) __builtin_prefetch(crow[r] + v * W, 1, 3);
  }
#endif
  if (cols >= NV * W) {
    for (Index p = 0; p < k; ++p) {
      const Scalar* bp = brow(p);
      Reg bv[NV];
#if defined(__GNUC__)
#pragma GCC unroll 8
#endif
      for (int v = 0; v < NV; ++v) bv[v] = V::load(bp + v * W);
#if defined(__GNUC__)
#pragma GCC unroll 8
#endif
      for (int r = 0; r < Rows; ++r) {
        const Reg av = V::set1(a[r * ars + p * acs]);
#if defined(__GNUC__)
#pragma GCC unroll 8
#endif
        for (int v = 0; v < NV; ++v) acc[r][v] = V::fmadd(av, bv[v], acc[r][v]);
      }
    }
  } else {
    for (Index p = 0; p < k; ++p) {
      const Scalar* bp = brow(p);
      Reg bv[NV];
#if defined(__GNUC__)
#pragma GCC unroll 8
#endif
      for (int v = 0; v < NV; ++v) bv[v] = V::load_partial(bp + v * W, cols - v * W);
#if defined(__GNUC__)
#pragma GCC unroll 8
#endif
      for (int r = 0; r < Rows; ++r) {
        const Reg av = V::set1(a[r * ars + p * acs]);
#if defined(__GNUC__)
#pragma GCC unroll 8
#endif
        for (int v = 0; v < NV; ++v) acc[r][v] = V::fmadd(av, bv[v], acc[r][v]);
      }
    }
  }
  // Store: scale, add the previous C and/or the bias, write the valid columns only. Every
  // loop here has compile-time bounds and is fully unrolled, so the accumulators stay in
  // registers (an index GCC cannot resolve at compile time would force them to the stack
  // on every k step).
  const Reg alpha_v = V::set1(alpha);
#if defined(__GNUC__)
#pragma GCC unroll 8
#endif
  for (int v = 0; v < NV; ++v) {
    const Index n = cols - v * W;
    if (n > 0) {
      Reg bias_v = V::zero();
      if (bias != nullptr)
        bias_v = n >= W ? V::load(bias + v * W) : V::load_partial(bias + v * W, n);
#if defined(__GNUC__)
#pragma GCC unroll 8
#endif
      for (int r = 0; r < Rows; ++r) {
        Scalar* cp = crow[r] + v * W;
        Reg out = V::fmadd(acc[r][v], alpha_v, bias_v);
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

/// micro_tile for a run-time row count 1..Rows (Rows = kMicroRows by default).
template <class Scalar, int Rows = kMicroRows, class BRows>
inline void micro_tile_rows(Index rows, Index k, const Scalar* a, Index ars, Index acs, BRows brow,
                            Scalar* const* crow, Index cols, Scalar alpha, bool accumulate,
                            const Scalar* bias) noexcept {
  if (rows == Rows) {
    micro_tile<Scalar, Rows>(k, a, ars, acs, brow, crow, cols, alpha, accumulate, bias);
  } else if constexpr (Rows > 1) {
    micro_tile_rows<Scalar, Rows - 1>(rows, k, a, ars, acs, brow, crow, cols, alpha, accumulate,
                                      bias);
  }
}

/// micro_tile_rows over a row-major B (row stride ldb).
template <class Scalar>
inline void micro_tile_rows(Index rows, Index k, const Scalar* a, Index ars, Index acs,
                            const Scalar* b, Index ldb, Scalar* const* crow, Index cols,
                            Scalar alpha, bool accumulate, const Scalar* bias) noexcept {
  micro_tile_rows<Scalar>(rows, k, a, ars, acs, StridedRows<Scalar>{b, ldb}, crow, cols, alpha,
                          accumulate, bias);
}

/// C (m x n) (+)= alpha * A (m x k) B (k x n) [+ bias], looping micro-tiles; rows in groups
/// of kMicroRows (the last group smaller), columns in groups of micro_cols(). A element
/// (r, p) is a[r * ars + p * acs]; B and C are row-major with leading dimensions.
template <class Scalar>
inline void micro_gemm(Index m, Index n, Index k, const Scalar* a, Index ars, Index acs,
                       const Scalar* b, Index ldb, Scalar* c, Index ldc, Scalar alpha,
                       bool accumulate, const Scalar* bias) noexcept {
  const Index nc = micro_cols<Scalar>();
  Scalar* crow[kMicroRows];
  for (Index j = 0; j < n; j += nc) {
    const Index cols = std::min(nc, n - j);
    const Scalar* bj = b + j;
    const Scalar* bias_j = bias != nullptr ? bias + j : nullptr;
    for (Index i = 0; i < m; i += kMicroRows) {
      const Index rows = std::min<Index>(kMicroRows, m - i);
      for (Index r = 0; r < rows; ++r) crow[r] = c + (i + r) * ldc + j;
      micro_tile_rows(rows, k, a + i * ars, ars, acs, bj, ldb, crow, cols, alpha, accumulate,
                      bias_j);
    }
  }
}

/// micro_gemm over B rows given one address each (b_rows[p], n wide): the same products, in
/// the same order, as over those rows stored one after another.
template <class Scalar>
inline void micro_gemm_gathered(Index m, Index n, Index k, const Scalar* a, Index ars, Index acs,
                                const Scalar* const* b_rows, Scalar* c, Index ldc, Scalar alpha,
                                bool accumulate) noexcept {
  const Index nc = micro_cols<Scalar>();
  Scalar* crow[kMicroRows];
  for (Index j = 0; j < n; j += nc) {
    const Index cols = std::min(nc, n - j);
    for (Index i = 0; i < m; i += kMicroRows) {
      const Index rows = std::min<Index>(kMicroRows, m - i);
      for (Index r = 0; r < rows; ++r) crow[r] = c + (i + r) * ldc + j;
      micro_tile_rows<Scalar>(rows, k, a + i * ars, ars, acs, GatheredRows<Scalar>{b_rows, j}, crow,
                              cols, alpha, accumulate, nullptr);
    }
  }
}
