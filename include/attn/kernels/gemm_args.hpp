// SPDX-License-Identifier: MIT
// attn/kernels/gemm_args.hpp: what the GEMM driver hands a kernel set: its cache blocking,
// where C is written (GemmOutput), a weight packed once (PackedGemmB) and one planned GEMM
// (GemmPlan). Plain data, compiled with the program's flags; every kernel set reads the same.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <utility>

#include "attn/config.hpp"
#include "attn/isa.hpp"
#include "attn/memory.hpp"
#include "attn/types/bfloat16.hpp"
#include "attn/types/float16.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// Cache blocking of the GEMM (BLIS's loop order). A column tile of at most `cols` is
/// packed depth block by depth block into micro-panels (depth x micro-width, contiguous);
/// row blocks of `rows` stream past it, and the micro-kernel walks down a row block with
/// one B micro-panel, broadcasting A straight from its rows (A is not packed).
struct GemmBlocking {
  Index rows = 0;   // a row block of op(A)
  Index cols = 0;   // the widest column tile of op(B)
  Index depth = 0;  // the deepest depth block
};

/// The row block and the column tile where the CPU's caches give no reason for others.
/// Measured with bench/gemm_bench.cpp:
///  - 2-core AVX2 machine (32 KiB L1, 512 KiB L2): contiguous micro-panels beat a strided
///    (depth x tile) panel by 5-12% (its 768-byte row stride left the B micro-panel in 16 of
///    L1's 64 sets), and 768-column tiles beat 192 by about 10%; depth 512 beat 256.
///  - 2-core AVX-512 machine (48 KiB L1, 1 MiB L2, 64-wide micro-panels): depth 512 (a
///    128 KiB micro-panel, read from L2) beat 128 (an L1-sized one) by 5-10%, since C is
///    then read and written once instead of four times for K = 512; broadcasting A from its
///    rows beat packing it into micro-panels by 3-8% (the packing, a strided scalar copy
///    repeated for every column tile, cost more than it saved).
inline constexpr Index kGemmRows = 96;
inline constexpr Index kGemmCols = 768;

/// The blocking for micro-panels `micro_cols` wide of `word_bytes`-byte words on a CPU whose
/// per-core L2 holds `l2_bytes` (0: unknown), AMD's or not (`amd`):
///  - depth: a B micro-panel of at most 128 KiB (an eighth of a 1 MiB L2), 128 to 512 deep,
///    whatever L2 the CPU reports: the depth block sets the order in which C's sums are
///    added, so it stays one value per kernel set and element type, and a set gives the same
///    bits on every CPU. 512 for 64 floats, measured best on Zen and on Emerald Rapids' 2 MiB
///    L2 (768 was no faster there, 128-256 were 3-16 points of the FMA peak slower).
///  - cols: kGemmCols on AMD and on L2s under 2 MiB (the machines above, where it was
///    measured best; its 1.5 MiB of packed floats, 512 deep, overflow their L2). On other
///    vendors' cores with 2 MiB of L2 or more (Emerald Rapids and its kin, whose shared L3 is
///    a mesh away), the widest tile whose packed panel fills at most half of L2: 512 floats
///    on Emerald Rapids. Measured there (one thread, W packed per call, CPU time, fraction of
///    the FMA peak timed beside each product, medians of 10 paired runs, machine loaded):
///    128 x 1536 x 512 63 % against 47 % with 768 columns, 512 x 1536 x 512 78.5 against
///    75.4 % (ahead in 10 of 10 pairs); 2048 x 2304 x 768 and 4096 x 1536 x 512 within the
///    runs' spread (bench/results/2026-11-29-intel-fp32.txt).
///  - rows: kGemmRows on every CPU (96, 192, 288 and 384 rows were within the spread of the
///    runs on Emerald Rapids).
/// The column tile and the row block do not change any sum: every element of C adds its
/// depth blocks in the same order whatever they are.
constexpr GemmBlocking gemm_blocking(Index micro_cols, Index word_bytes, long l2_bytes,
                                     bool amd) noexcept {
  const Index l2 = l2_bytes > 0 ? static_cast<Index>(l2_bytes) : Index{1} << 20;
  GemmBlocking blocking;
  blocking.rows = kGemmRows;
  blocking.depth = std::clamp<Index>((Index{1} << 17) / (micro_cols * word_bytes), 128, 512);
  blocking.cols = kGemmCols;
  if (!amd && l2_bytes >= (long{2} << 20)) {
    const Index fit = l2 / 2 / (blocking.depth * word_bytes) / micro_cols * micro_cols;
    blocking.cols = std::clamp<Index>(fit, micro_cols, kGemmCols);
  }
  return blocking;
}

/// gemm_blocking() for this CPU (detail::cpu_l2_bytes(), detail::cpu_is_amd()).
inline GemmBlocking gemm_blocking(Index micro_cols, Index word_bytes) noexcept {
  return gemm_blocking(micro_cols, word_bytes, cpu_l2_bytes(), cpu_is_amd());
}

/// Where a GEMM writes C. Row i = b * rows_per_batch + t and column j = s * segment + e
/// go to data[b * batch_stride + t * ldc + s * segment_stride + e]. The plain row-major
/// layout is one batch and one segment; the head-split layout of the Q/K/V projection,
/// (B, 3H, T, hd), is rows_per_batch = T, segment = hd, segment_stride = T * hd, ldc = hd.
template <class Scalar>
struct GemmOutput {
  Scalar* data = nullptr;
  Index ldc = 0;
  Index rows_per_batch = 0;  // 0: all rows in one batch
  Index batch_stride = 0;
  Index segment = 0;  // 0: all columns in one segment
  Index segment_stride = 0;

  static GemmOutput row_major(Scalar* c, Index ldc) noexcept {
    GemmOutput out;
    out.data = c;
    out.ldc = ldc;
    return out;
  }
  /// The head-major layout (B, columns / segment, T, segment) of rows b * tokens + t and
  /// `columns` columns: each segment-wide block of a batch item's rows contiguous.
  static GemmOutput head_major(Scalar* c, Index tokens, Index columns, Index segment) noexcept {
    GemmOutput out;
    out.data = c;
    out.ldc = segment;
    out.rows_per_batch = tokens;
    out.batch_stride = tokens * columns;
    out.segment = segment;
    out.segment_stride = tokens * segment;
    return out;
  }
  Scalar* row(Index i) const noexcept {
    if (rows_per_batch <= 0) return data + i * ldc;
    return data + (i / rows_per_batch) * batch_stride + (i % rows_per_batch) * ldc;
  }
  /// Offset of column j within a row.
  Index column(Index j, Index seg) const noexcept { return (j / seg) * segment_stride + j % seg; }
};

/// True for the 16-bit operand types the GEMM takes with float results (bfloat16 and
/// float16): their products and sums are float.
template <class Operand>
inline constexpr bool is_gemm_storage_v =
    std::is_same_v<Operand, bfloat16> || std::is_same_v<Operand, float16>;

/// What a packed B micro-panel holds for operands of type Operand: the operands themselves,
/// except bfloat16 and float16, whose panels hold 32-bit words: floats (widened), or for
/// bfloat16 also pairs of bfloat16 (see PackedGemmB).
template <class Operand>
using GemmPanel = std::conditional_t<is_gemm_storage_v<Operand>, float, Operand>;

/// Rows of a packed B micro-panel (32-bit words per column) for `depth` elements on `path`:
/// depth widened (or for float operands), depth / 2 rounded up in k-pairs, rounded up to
/// whole 16-pair tiles for AMX.
constexpr Index gemm_words(Bf16Path path, Index depth) noexcept {
  switch (path) {
    case Bf16Path::kDot:
      return (depth + 1) / 2;
    case Bf16Path::kAmx:
      return (depth + 31) / 32 * 16;
    case Bf16Path::kWiden:
      break;
  }
  return depth;
}

/// Whether a k-pair micro-panel `width` columns wide on `path` is laid out as AMX tiles: on
/// the AMX path, a width of whole 16-column tiles is stored as width / 16 sub-panels of 16
/// columns one after another (each gemm_words(path, depth) x 16 contiguous), so that each
/// 16 x 16-word tile of B is one contiguous KiB (tile loads with a 64-byte row stride); other
/// widths, and the other paths, keep one panel of row stride `width`. Measured (a stand-alone
/// loop of the GEMM's tile pass, one core, 4096 x 1536 x 512, median of 10): 0.52 of the tile
/// peak against 0.45 with one panel (tile rows 256 bytes apart).
constexpr bool gemm_tiled(Bf16Path path, Index width) noexcept {
  return path == Bf16Path::kAmx && width % 16 == 0;
}

/// A GEMM's B operand (a layer's weight, (n, k) row-major) packed once for one kernel set:
/// gemm_nt then reads it instead of packing B on every call. Layout: the depth blocks of
/// that set's blocking for this k, one after another; within a block, B's rows in column
/// groups (the set's micro-panel width, never straddling a segment, counted from each
/// segment's start), each group depth x width contiguous. Any contiguous run of whole
/// segments of it serves a product on those rows of B (see PackedB), with the same result,
/// bit for bit, as packing on the fly. A pack made for one kernel set is ignored (B is
/// packed per call) when another set runs, e.g. after set_isa().
/// float16 weights are widened to floats. bfloat16 weights are packed for one Bf16Path
/// (`path`): widened to floats, or, for the
/// AVX512-BF16 dot product and AMX, as k-pairs: word (q, c) of a micro-panel holds elements 2q
/// (low half) and 2q + 1 (high half) of the block's depth for column c, an odd depth's last
/// word padded with +0; for AMX the pairs of a depth block run on to a multiple of 16 (whole
/// tiles of 32 depth), padded with +0 words, and groups of whole 16-column tiles are stored
/// tile column by tile column (gemm_tiled()). A pack for another path is ignored as well
/// (after set_bf16_path()).
/// detail::pack_gemm_b() (attn/ops/gemm.hpp) fills one.
template <class Scalar>
class PackedGemmB {
 public:
  using Panel = GemmPanel<Scalar>;
  PackedGemmB() = default;

  /// Storage for B (n, k) with output segments `segment` columns wide (0: one segment),
  /// laid out for `isa`'s micro-panels (`group_cols` wide) and depth blocks, and for `path`.
  PackedGemmB(Index n, Index k, Index segment, Isa isa, Index group_cols, Index depth_block,
              Bf16Path path = Bf16Path::kWiden)
      : n_(n),
        k_(k),
        segment_(segment > 0 ? segment : std::max<Index>(n, 1)),
        group_cols_(group_cols),
        depth_block_(depth_block),
        isa_(isa),
        path_(path) {
    if (!empty()) data_.reserve(static_cast<std::size_t>(n * words(k)));
  }

  PackedGemmB(const PackedGemmB& other)
      : n_(other.n_),
        k_(other.k_),
        segment_(other.segment_),
        group_cols_(other.group_cols_),
        depth_block_(other.depth_block_),
        isa_(other.isa_),
        path_(other.path_) {
    if (other.empty()) return;
    data_.reserve(static_cast<std::size_t>(n_ * words(k_)));
    std::copy(other.data_.data(), other.data_.data() + n_ * words(k_), data_.data());
  }
  PackedGemmB& operator=(const PackedGemmB& other) {
    if (this != &other) *this = PackedGemmB(other);
    return *this;
  }
  PackedGemmB(PackedGemmB&& other) noexcept { *this = std::move(other); }
  PackedGemmB& operator=(PackedGemmB&& other) noexcept {
    data_ = std::move(other.data_);
    n_ = std::exchange(other.n_, 0);
    k_ = std::exchange(other.k_, 0);
    segment_ = std::exchange(other.segment_, 1);
    group_cols_ = std::exchange(other.group_cols_, 1);
    depth_block_ = std::exchange(other.depth_block_, 1);
    isa_ = other.isa_;
    path_ = other.path_;
    return *this;
  }
  ~PackedGemmB() = default;

  bool empty() const noexcept { return n_ <= 0 || k_ <= 0; }
  Index rows() const noexcept { return n_; }
  Index depth() const noexcept { return k_; }
  Index segment() const noexcept { return segment_; }
  Index depth_block() const noexcept { return depth_block_; }
  Isa isa() const noexcept { return isa_; }
  Bf16Path path() const noexcept { return path_; }
  /// Panel rows (words per column) of `depth` elements (gemm_words()).
  Index words(Index depth) const noexcept { return gemm_words(path_, depth); }

  /// First column of the group holding column j, and that group's width.
  Index group_start(Index j) const noexcept {
    const Index s0 = j - j % segment_;
    return s0 + (j - s0) / group_cols_ * group_cols_;
  }
  Index group_width(Index g) const noexcept {
    return std::min({group_cols_, segment_ - g % segment_, n_ - g});
  }
  /// The micro-panel of the group starting at column g, in the depth block starting at p0
  /// (words(depth) x group_width(g), row stride group_width(g); p0 is even).
  const Panel* panel(Index p0, Index g, Index depth) const noexcept {
    return data_.data() + words(p0) * n_ + g * words(depth);
  }
  Panel* mutable_panel(Index p0, Index g, Index depth) noexcept {
    return data_.data() + words(p0) * n_ + g * words(depth);
  }

 private:
  AlignedBuffer<Panel> data_;
  Index n_ = 0, k_ = 0, segment_ = 1, group_cols_ = 1, depth_block_ = 1;
  Isa isa_ = Isa::kScalar;
  Bf16Path path_ = Bf16Path::kWiden;
};

/// The rows [offset, offset + n) of a PackedGemmB, as the B operand of one gemm_nt call
/// (offset a multiple of the pack's segment). An empty PackedB means "pack B per call".
template <class Scalar>
struct PackedB {
  const PackedGemmB<Scalar>* pack = nullptr;
  Index offset = 0;
};

/// One GEMM, C (m, n) (+)= op(A) (m, k) op(B) (k, n) [+ bias], as the driver
/// (detail::gemm) planned it: tasks are column tiles of `tile_cols` times row chunks of
/// `chunk_rows`; each packs its op(B) panel per depth block (unless `pre` holds B packed for
/// this set) and streams row blocks of `block_rows` of op(A) past it.
///  - A: row-major (a, lda), op(A) = A (m, k) or, `a_transposed`, A^T with A stored (k, m);
///    or, `a_pack`, any GemmOutput layout (a head-major (B, P*H, T, hd) gradient) in
///    `a_layout`, copied row block by row block into the task's buffer first.
///  - B: (b, ldb) row-major, stored (n, k) (op(B) = B^T: y = x W^T, the forward) unless
///    `b_kn`, stored (k, n) (op(B) = B: dX = dY W, dW = dY^T X).
///  - `accumulate`: C += the product (the backward passes add into gradients); else C =.
///  - Operand: A's and B's element type, Scalar (C's, the bias's and the arithmetic's), or
///    bfloat16 or float16 for Scalar float: a row-major A and B^T, on `path`: widened to
///    float while packing (float16 always), or for bfloat16 multiplied in k-pairs by
///    AVX512-BF16's dot product or AMX tiles.
template <class Scalar, class Operand = Scalar>
struct GemmPlan {
  Index m = 0, n = 0, k = 0;
  const Operand* a = nullptr;  // A row-major, leading dimension lda
  Index lda = 0;
  bool a_transposed = false;
  bool a_pack = false;
  GemmOutput<const Operand> a_layout;  // with a_pack: A's memory, any layout
  Index a_segment = 0;                 // a_layout's segment width (its columns when 0)
  const Operand* b = nullptr;          // B row-major, leading dimension ldb
  Index ldb = 0;
  bool b_kn = false;
  bool accumulate = false;
  Bf16Path path = Bf16Path::kWiden;
  GemmOutput<Scalar> out;
  const Scalar* bias = nullptr;
  const PackedGemmB<Operand>* pre = nullptr;  // B packed for this kernel set, or null
  // gemm_nt_rounded()'s C, an Operand twin of out's memory (the same offsets from its start):
  // every path rounds the final sums into it as it makes them (gemm_task()); out then holds
  // no final sums, only earlier depth blocks' partial ones.
  Operand* rounded = nullptr;
  bool stream = false;  // AMX: C written with non-temporal stores (run_gemm() says when)
  Index pre_offset = 0;
  Index segment = 0;  // output segment width (n when the output has one segment)
  Index depth_block = 0, block_rows = 0, tile_cols = 0, col_tiles = 0, chunk_rows = 0;
};

}  // namespace detail
ATTN_NAMESPACE_END
