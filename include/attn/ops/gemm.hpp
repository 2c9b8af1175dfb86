// SPDX-License-Identifier: MIT
// attn/ops/gemm.hpp: the packed, threaded, allocation-free GEMM behind Linear and the
// Q/K/V and output projections, forward and backward: its plan (GemmPlan) and its driver
// here, the per-set work in attn/kernels/ (generic/gemm.inl). The forward product also
// takes bfloat16 and float16 operands with float results (float accumulation): bfloat16 on
// the path bf16_path() names (AMX tiles or AVX512-BF16's dot product where the avx512 set runs
// on a CPU that has them, else widened to float while packing), float16 always widened while
// packing; docs/precision.md gives each path's rounding.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "attn/config.hpp"
#include "attn/kernels/dispatch.hpp"
#include "attn/kernels/gemm_args.hpp"
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

/// The path products on `Operand`s take now: bf16_path() for bfloat16, else kWiden (the
/// operands' own kernels, or float16 widened to float).
template <class Operand>
Bf16Path gemm_path() {
  if constexpr (std::is_same_v<Operand, bfloat16>) {
    return bf16_path();
  } else {
    return Bf16Path::kWiden;
  }
}

/// The depth blocks' size multiple: whole 32-deep AMX tiles on that path (no padding inside
/// a product), else 8.
inline Index gemm_depth_multiple(Bf16Path path) noexcept { return path == Bf16Path::kAmx ? 32 : 8; }

/// The depth blocks' limit: the set's gemm_depth() (`set_depth`), except on AMX: 1024 (a
/// 128 KiB k-pair micro-panel, as the float one at 512). Each depth block past the first reads
/// and writes C once more, which costs more than its tiles: measured (one thread, W packed,
/// 2048 x 2304 x 768, fraction of the tile peak measured in the same run, median of 3 runs,
/// machine loaded), one block of 768 against two of 384: 0.41 against 0.19 with C rounded to
/// bfloat16, 0.38 against 0.26 with C float.
inline Index gemm_depth_limit(Index set_depth, Bf16Path path) noexcept {
  return path == Bf16Path::kAmx ? 1024 : set_depth;
}

/// B (n, k), row-major with leading dimension ldb, packed once for the active kernel set,
/// for products whose output segments are `segment` columns wide (0: one segment).
/// Allocates n * k elements (floats for a bfloat16 or float16 B widened, k-pairs for the dot
/// product and AMX).
template <class Operand>
PackedGemmB<Operand> pack_gemm_b(Index n, Index k, const Operand* b, Index ldb, Index segment) {
  using Panel = GemmPanel<Operand>;
  const Isa isa = kernel_isa();
  const Bf16Path path = gemm_path<Operand>();
  return with_kernels(isa, [&](auto set) {
    using Set = decltype(set);
    PackedGemmB<Operand> pack(
        n, k, segment, isa, Set::template micro_cols<Panel>(),
        even_block(k, gemm_depth_limit(Set::template gemm_blocking<Panel>().depth, path),
                   gemm_depth_multiple(path)),
        path);
    if (!pack.empty()) Set::pack_gemm_b(b, ldb, pack);
    return pack;
  });
}

/// Plans and runs `g` (its operands, output, bias and accumulate flag set; m, n > 0, k > 0):
/// the blocking (gemm_blocking(), from this CPU's L2), the tasks and the threads. BLIS's loop
/// order: tasks are column tiles (each packs its op(B) panel once per depth block), split by
/// rows only when there are too few to feed the threads; a row block streams past the panel.
/// Tasks own disjoint blocks of C and each runs the whole depth in a fixed order, so the
/// result does not depend on the thread count. `ws` holds the per-thread packing buffers (a
/// temporary workspace when null, which allocates); none is allocated once it has served a
/// product as large. bfloat16 and float16 operands take the blocking of float ones (the same
/// tiles and depth blocks, of whole 32-deep tiles for AMX), their B packed in k-pairs on the
/// dot-product and AMX paths (half the words), A widened into the per-thread buffer when
/// widening, copied into it as whole zero-padded tiles for AMX, read in place by the dot
/// product; AMX's products go through two per-thread blocks of a group's results.
template <class Scalar, class Operand>
void run_gemm(GemmPlan<Scalar, Operand>& g, PackedB<Operand> prepacked, Workspace* ws) {
  const Isa isa = kernel_isa();
  constexpr bool kWiden = !std::is_same_v<Operand, Scalar>;
  g.path = gemm_path<Operand>();
  const bool amx = g.path == Bf16Path::kAmx;
  // An AMX product's C of 8 MiB or more (twice the L2 of both cores of this Emerald Rapids
  // VM together, so no core keeps it for the next product) goes to memory with non-temporal
  // stores, which skip reading each line first. Measured (one thread, W packed, C float,
  // 4096 x 1536 x 512 / 2048 x 2304 x 768 / 8192 x 1536 x 512, CPU time, best of 5, machine
  // loaded): 22.8 / 16.3 / 17.2 ms against 28.3 / 37.8 / 58.6 ms with ordinary stores.
  const double c_bytes = static_cast<double>(g.m) * static_cast<double>(g.n) *
                         (g.rounded != nullptr ? 2.0 : static_cast<double>(sizeof(Scalar)));
  g.stream = amx && c_bytes >= 8.0 * 1024 * 1024;
  const PackedGemmB<Operand>* pre = prepacked.pack;
  if (pre != nullptr && !pre->empty() && pre->isa() == isa && pre->path() == g.path) {
    ATTN_ASSERT(!g.b_kn && pre->depth() == g.k && prepacked.offset + g.n <= pre->rows() &&
                g.segment % pre->segment() == 0 && prepacked.offset % pre->segment() == 0);
    g.pre = pre;
    g.pre_offset = prepacked.offset;
  }
  with_kernels(isa, [&](auto set) {
    using Set = decltype(set);
    const Index group_cols = Set::template micro_cols<Scalar>();
    // AMX works on 32-row blocks (two 16-row tiles); row chunks of whole blocks waste none.
    const Index micro_rows = amx ? 32 : Set::template micro_rows<Scalar>();
    const Index m = g.m, n = g.n, k = g.k;
    // This CPU's blocking (gemm_blocking()); AMX keeps the constants its kernel was
    // measured with, and its deeper blocks (gemm_depth_limit()).
    const GemmBlocking blocking = Set::template gemm_blocking<Scalar>();
    g.depth_block = g.pre != nullptr ? g.pre->depth_block()
                                     : even_block(k, gemm_depth_limit(blocking.depth, g.path),
                                                  gemm_depth_multiple(g.path));
    g.block_rows = amx ? kGemmRows : blocking.rows;
    g.tile_cols = even_block(n, amx ? kGemmCols : blocking.cols, group_cols);
    g.col_tiles = (n + g.tile_cols - 1) / g.tile_cols;
    const Index want = 2 * static_cast<Index>(num_threads());
    const Index row_chunks =
        std::max<Index>(1, std::min<Index>((want + g.col_tiles - 1) / g.col_tiles,
                                           (m + g.block_rows - 1) / g.block_rows));
    g.chunk_rows = ((m + row_chunks - 1) / row_chunks + micro_rows - 1) / micro_rows * micro_rows;
    const Index tasks = g.col_tiles * row_chunks;
    // Per thread: the packed op(B) micro-panels (gemm_words(depth) x tile_cols), none with a
    // pre-packed B; then a row block of A when its layout needs packing, it is widened, or
    // copied into whole AMX tiles (bfloat16, half the words).
    const Index b_words = gemm_words(g.path, g.depth_block);
    const bool a_buffer = g.a_pack || (kWiden && g.path != Bf16Path::kDot);
    const Index pack_size = (g.pre != nullptr ? 0 : b_words * g.tile_cols) +
                            (a_buffer ? g.block_rows * g.depth_block : 0) +
                            (amx ? 2 * g.block_rows * (group_cols + 16) : 0);
    Workspace local;
    Workspace& scratch = ws != nullptr ? *ws : local;
    // Small products (under a MFLOP) run on the calling thread: a fork costs more.
    const bool parallel =
        2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) > 1e6;
    const int threads = parallel ? task_threads(tasks) : 1;
    // Every thread's buffer is sized now, whether or not the dynamic schedule hands it a
    // task this time: then no later call allocates.
    for (int t = 0; t < threads; ++t) {
      workspace_get<Scalar>(scratch, WorkspaceSlot::kGemmPack, pack_size, t);
    }
    run_tasks(threads, tasks, [&](Index task, int thread) {
      Set::gemm_task(g, task, workspace_peek<Scalar>(scratch, WorkspaceSlot::kGemmPack, thread));
    });
  });
}

/// C = A (m, k) * B (n, k)^T [+ bias (n) on every row], A and B row-major with the given
/// leading dimensions, C written through `out` (see GemmOutput). This is y = x W^T + b with
/// W in torch.nn.Linear's layout. `prepacked` is B packed once (pack_gemm_b), used when it
/// was packed for the kernel set that runs now; `ws` holds the per-thread packing buffers
/// (see run_gemm()). Does not allocate once `ws` has served a product as large.
/// Operand is Scalar, or bfloat16 or float16 for float C and bias: then the products and sums
/// are float, for bfloat16 on the path bf16_path() names (see docs/precision.md).
/// `rounded` (bfloat16 or float16 operands; see gemm_nt_rounded()): an Operand twin of out's
/// memory that every path rounds C into; returns whether it did (not for k <= 0).
template <class Scalar, class Operand>
bool gemm_nt(Index m, Index n, Index k, const Operand* a, Index lda, const Operand* b, Index ldb,
             const GemmOutput<Scalar>& out, const Scalar* bias, PackedB<Operand> prepacked = {},
             Workspace* ws = nullptr, Operand* rounded = nullptr) {
  static_assert(std::is_same_v<Operand, Scalar> ||
                    (is_gemm_storage_v<Operand> && std::is_same_v<Scalar, float>),
                "gemm_nt: operands of the output's type, or bfloat16 or float16 for a float "
                "output");
  if (m <= 0 || n <= 0) return false;
  GemmPlan<Scalar, Operand> g;
  g.m = m, g.n = n, g.k = k, g.a = a, g.lda = lda, g.b = b, g.ldb = ldb, g.out = out;
  g.bias = bias;
  g.segment = out.segment > 0 ? out.segment : n;
  if (k <= 0) {
    for (Index i = 0; i < m; ++i) {
      for (Index j = 0; j < n; ++j) {
        out.row(i)[out.column(j, g.segment)] = bias != nullptr ? bias[j] : Scalar(0);
      }
    }
    return false;
  }
  g.rounded = rounded;
  run_gemm(g, prepacked, ws);
  return g.rounded != nullptr;
}

/// Row-major C (m, n) with leading dimension ldc: C = A B^T [+ bias].
template <class Scalar, class Operand>
void gemm_nt(Index m, Index n, Index k, const Operand* a, Index lda, const Operand* b, Index ldb,
             Scalar* c, Index ldc, const Scalar* bias, PackedB<Operand> prepacked = {},
             Workspace* ws = nullptr) {
  gemm_nt(m, n, k, a, lda, b, ldb, GemmOutput<Scalar>::row_major(c, ldc), bias, prepacked, ws);
}

/// gemm_nt() on bfloat16 or float16 operands with a C of the same type (a bfloat16 or
/// float16 module's projections): the bias (n) widened to float, the products and sums in
/// float as gemm_nt() computes them, each result rounded once, to nearest even, into C. The
/// float results go through `layout(float*)`, a GemmOutput over m n contiguous floats
/// (row-major with ldc n, or head-major), into the workspace's kWideOutput slot, of which C
/// is the Operand twin. Every path rounds each result into C as it makes it (the same bits on
/// every set and path), so the floats of a product of one depth block are neither written nor
/// read back (for B 8, T 512, E 512's Q/K/V projection: 25 MB of stores and their reading);
/// deeper products keep their partial sums there. C must not overlap A, B or the bias (it may
/// be written while they are read).
template <class Operand, class Layout>
void gemm_nt_rounded(Index m, Index n, Index k, const Operand* a, Index lda, const Operand* b,
                     Index ldb, Operand* c, Layout layout, const Operand* bias,
                     PackedB<Operand> prepacked, Workspace& ws) {
  static_assert(is_gemm_storage_v<Operand>, "gemm_nt_rounded: bfloat16 or float16 operands");
  if (m <= 0 || n <= 0) return;
  // Scratch: the widened bias (n), then the float results (m n).
  float* wide = workspace_get<float>(ws, WorkspaceSlot::kWideOutput, n + m * n);
  with_kernels(kernel_isa(), [&](auto set) {
    if (bias != nullptr) set.convert_row(bias, wide, n);
    const bool done = gemm_nt(m, n, k, a, lda, b, ldb, layout(wide + n),
                              bias != nullptr ? wide : nullptr, prepacked, &ws, c);
    if (!done) set.convert_row(static_cast<const float*>(wide + n), c, m * n);
  });
}

/// A matrix in a GemmOutput layout read as a GEMM's A operand: row-major ones are read in
/// place, others (head-major gradients) through a packed copy of each row block.
template <class Scalar>
void set_gemm_a(GemmPlan<Scalar>& g, const GemmOutput<const Scalar>& a, Index columns,
                bool transposed) {
  g.a_transposed = transposed;
  if (a.rows_per_batch <= 0 && (a.segment <= 0 || a.segment >= columns)) {
    g.a = a.data, g.lda = a.ldc;
  } else {
    g.a_pack = true;
    g.a_layout = a;
    g.a_segment = a.segment > 0 ? a.segment : columns;
  }
}

/// C (m, n) (+)= op(A) B, B (k, n) row-major with leading dimension ldb: op(A) is `a`
/// (m, k) in any GemmOutput layout, or its transpose (`a` stored (k, m)) when
/// `a_transposed`. C += with `accumulate`. The backward passes: dX += dY W (A = dY, B = W)
/// and dW += dY^T X (A^T = dY^T, B = X, k = tokens). Same blocking, threads and determinism
/// as gemm_nt (parallel over blocks of C only; each element's sum in a fixed order).
template <class Scalar>
void gemm_nn(Index m, Index n, Index k, const GemmOutput<const Scalar>& a, bool a_transposed,
             const Scalar* b, Index ldb, const GemmOutput<Scalar>& out, bool accumulate,
             Workspace* ws = nullptr) {
  if (m <= 0 || n <= 0) return;
  GemmPlan<Scalar> g;
  g.m = m, g.n = n, g.k = k, g.b = b, g.ldb = ldb, g.b_kn = true, g.out = out;
  g.accumulate = accumulate;
  g.segment = out.segment > 0 ? out.segment : n;
  if (k <= 0) {
    if (accumulate) return;
    for (Index i = 0; i < m; ++i) {
      for (Index j = 0; j < n; ++j) out.row(i)[out.column(j, g.segment)] = Scalar(0);
    }
    return;
  }
  set_gemm_a(g, a, a_transposed ? m : k, a_transposed);
  run_gemm(g, {}, ws);
}

/// sums[j] += sum_i A(i, j) for an (m, n) matrix in any GemmOutput layout, rows in order
/// (one thread: m n additions, against the m n k of the GEMMs beside it): a bias gradient.
template <class Scalar>
void column_sums(Index m, Index n, const GemmOutput<const Scalar>& a, Scalar* sums) {
  if (m <= 0 || n <= 0) return;
  const Index segment = a.segment > 0 ? a.segment : n;
  with_kernels(kernel_isa(), [&](auto set) { set.column_sums(m, 0, n, a, segment, sums); });
}

}  // namespace detail
ATTN_NAMESPACE_END
