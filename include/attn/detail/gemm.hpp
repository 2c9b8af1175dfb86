// SPDX-License-Identifier: MIT
// attn/detail/gemm.hpp: the packed, threaded, allocation-free GEMM behind Linear and the
// Q/K/V and output projections: the plan and the threads here, the per-set work in
// attn/kernels/ (generic/gemm.inl).
#pragma once

#include <algorithm>
#include <cstddef>

#include "attn/config.hpp"
#include "attn/kernels/dispatch.hpp"
#include "attn/kernels/types.hpp"
#include "attn/parallel.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// Splits `total` into the fewest parts of at most `limit`, of equal size rounded up to a
/// multiple of `multiple` (the last part takes the remainder): equal tiles keep the threads
/// balanced and the depth blocks even.
inline Index even_block(Index total, Index limit, Index multiple) noexcept {
  const Index parts = (total + limit - 1) / limit;
  const Index size = (total + parts - 1) / parts;
  return std::min(limit, (size + multiple - 1) / multiple * multiple);
}

/// B (n, k), row-major with leading dimension ldb, packed once for the active kernel set,
/// for products whose output segments are `segment` columns wide (0: one segment).
/// Allocates n * k elements.
template <class Scalar>
PackedGemmB<Scalar> pack_gemm_b(Index n, Index k, const Scalar* b, Index ldb, Index segment) {
  const Isa isa = kernel_isa();
  return with_kernels(isa, [&](auto set) {
    using Set = decltype(set);
    PackedGemmB<Scalar> pack(n, k, segment, isa, Set::template micro_cols<Scalar>(),
                             even_block(k, Set::template gemm_depth<Scalar>(), 8));
    if (!pack.empty()) Set::pack_gemm_b(b, ldb, pack);
    return pack;
  });
}

/// C = A (m, k) * B (n, k)^T [+ bias (n) on every row], A and B row-major with the given
/// leading dimensions, C written through `out` (see GemmOutput). This is y = x W^T + b with
/// W in torch.nn.Linear's layout. `prepacked` is B packed once (pack_gemm_b), used when it
/// was packed for the kernel set that runs now; `ws` holds the per-thread packing buffers
/// (a temporary workspace when null, which allocates).
///
/// BLIS's loop order: tasks are column tiles of kGemmCols (each packs its B^T panel once
/// per depth block), split by rows only when there are too few to feed the threads; a
/// row block of kGemmRows streams past the panel. Each element of C is computed by one
/// thread in a fixed order, so the result does not depend on the thread count. Does not
/// allocate once `ws` has served a product as large.
template <class Scalar>
void gemm_nt(Index m, Index n, Index k, const Scalar* a, Index lda, const Scalar* b, Index ldb,
             const GemmOutput<Scalar>& out, const Scalar* bias, PackedB<Scalar> prepacked = {},
             Workspace* ws = nullptr) {
  if (m <= 0 || n <= 0) return;
  GemmPlan<Scalar> g;
  g.m = m, g.n = n, g.k = k, g.a = a, g.lda = lda, g.b = b, g.ldb = ldb, g.out = out;
  g.bias = bias;
  g.segment = out.segment > 0 ? out.segment : n;
  if (k <= 0) {
    for (Index i = 0; i < m; ++i) {
      for (Index j = 0; j < n; ++j) {
        out.row(i)[out.column(j, g.segment)] = bias != nullptr ? bias[j] : Scalar(0);
      }
    }
    return;
  }
  const Isa isa = kernel_isa();
  const PackedGemmB<Scalar>* pre = prepacked.pack;
  if (pre != nullptr && !pre->empty() && pre->isa() == isa) {
    ATTN_ASSERT(pre->depth() == k && prepacked.offset + n <= pre->rows() &&
                g.segment % pre->segment() == 0 && prepacked.offset % pre->segment() == 0);
    g.pre = pre;
    g.pre_offset = prepacked.offset;
  }
  with_kernels(isa, [&](auto set) {
    using Set = decltype(set);
    const Index group_cols = Set::template micro_cols<Scalar>();
    const Index micro_rows = Set::template micro_rows<Scalar>();
    g.depth_block = g.pre != nullptr ? g.pre->depth_block()
                                     : even_block(k, Set::template gemm_depth<Scalar>(), 8);
    g.tile_cols = even_block(n, kGemmCols, group_cols);
    g.col_tiles = (n + g.tile_cols - 1) / g.tile_cols;
    const Index want = 2 * static_cast<Index>(num_threads());
    const Index row_chunks = std::max<Index>(
        1, std::min<Index>((want + g.col_tiles - 1) / g.col_tiles, (m + kGemmRows - 1) / kGemmRows));
    g.chunk_rows =
        ((m + row_chunks - 1) / row_chunks + micro_rows - 1) / micro_rows * micro_rows;
    const Index tasks = g.col_tiles * row_chunks;
    // Per thread: the packed B^T micro-panels (depth x tile_cols); none with a pre-packed B.
    const Index pack_size = g.pre != nullptr ? 0 : g.depth_block * g.tile_cols;
    Workspace local;
    Workspace& scratch = ws != nullptr ? *ws : local;
    const int threads = static_cast<int>(std::min<Index>(num_threads(), tasks));
    const bool parallel = ATTN_HAS_OPENMP && threads > 1 &&
                          2.0 * static_cast<double>(m) * static_cast<double>(n) *
                                  static_cast<double>(k) > 1e6;
    // Every thread's buffer is sized now, whether or not the dynamic schedule hands it a
    // task this time: then no later call allocates.
    for (int t = 0; t < (parallel ? threads : 1); ++t) {
      workspace_get<Scalar>(scratch, WorkspaceSlot::kGemmPack, pack_size, t);
    }
#if ATTN_HAS_OPENMP
    if (parallel) {
#pragma omp parallel num_threads(threads)
      {
        Scalar* packed = workspace_peek<Scalar>(scratch, WorkspaceSlot::kGemmPack, thread_id());
#pragma omp for schedule(dynamic, 1)
        for (Index task = 0; task < tasks; ++task) Set::gemm_task(g, task, packed);
      }
      return;
    }
#endif
    Scalar* packed = workspace_peek<Scalar>(scratch, WorkspaceSlot::kGemmPack, 0);
    for (Index task = 0; task < tasks; ++task) Set::gemm_task(g, task, packed);
  });
}

/// Row-major C (m, n) with leading dimension ldc: C = A B^T [+ bias].
template <class Scalar>
void gemm_nt(Index m, Index n, Index k, const Scalar* a, Index lda, const Scalar* b, Index ldb,
             Scalar* c, Index ldc, const Scalar* bias, PackedB<Scalar> prepacked = {},
             Workspace* ws = nullptr) {
  gemm_nt(m, n, k, a, lda, b, ldb, GemmOutput<Scalar>::row_major(c, ldc), bias, prepacked, ws);
}

}  // namespace detail
ATTN_NAMESPACE_END
