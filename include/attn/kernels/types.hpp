// SPDX-License-Identifier: MIT
// attn/kernels/types.hpp: what the drivers hand the kernel sets: where a GEMM writes, a
// weight packed once, one GEMM's blocking plan, one attention call's operands and one head's
// mask. Plain data, compiled with the program's flags; every kernel set reads the same.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>

#include "attn/config.hpp"
#include "attn/detail/checked.hpp"
#include "attn/isa.hpp"
#include "attn/memory.hpp"
#include "attn/tensor/tensor_view.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// Cache blocking of the GEMM (BLIS's loop order). A column tile of at most kGemmCols is
/// packed depth block by depth block into micro-panels (depth x micro-width, contiguous);
/// row blocks of kGemmRows stream past it, and the micro-kernel walks down a row block with
/// one B micro-panel, broadcasting A straight from its rows (A is not packed). Measured
/// with bench/gemm_bench.cpp:
///  - 2-core AVX2 machine (32 KiB L1, 512 KiB L2): contiguous micro-panels beat a strided
///    (depth x tile) panel by 5-12% (its 768-byte row stride left the B micro-panel in 16 of
///    L1's 64 sets), and 768-column tiles beat 192 by about 10%; depth 512 beat 256.
///  - 2-core AVX-512 machine (48 KiB L1, 1 MiB L2, 64-wide micro-panels): depth 512 (a
///    128 KiB micro-panel, read from L2) beat 128 (an L1-sized one) by 5-10%, since C is
///    then read and written once instead of four times for K = 512; broadcasting A from its
///    rows beat packing it into micro-panels by 3-8% (the packing, a strided scalar copy
///    repeated for every column tile, cost more than it saved).
/// The depth block is each set's gemm_depth() (attn/kernels/generic/gemm.inl).
inline constexpr Index kGemmRows = 96;
inline constexpr Index kGemmCols = 768;

/// Query rows per attention task, and key columns per streaming tile.
inline constexpr Index kQueryBlock = 64;
inline constexpr Index kKeyBlock = 128;

/// Decoding (T_q <= kSplitKeysQueries): the keys of each (batch, key/value head) are split
/// into chunks of kKeyChunk, fixed in the logical key index (never in the thread count), each
/// a task whose partial softmax state is merged in chunk order: bit-identical for any thread
/// count, and two threads share even one head's keys at B = 1.
inline constexpr Index kKeyChunk = 512;
inline constexpr Index kSplitKeysQueries = 8;

/// Scratch elements one materialised attention task needs: a (kQueryBlock, T_k) score
/// block and K^T (d, T_k), later V (T_k, d_v) when it must be cleaned.
constexpr Index materialized_scratch_size(Index head_dim, Index value_dim, Index keys) noexcept {
  return kQueryBlock * keys + std::max(head_dim, value_dim) * keys + 64;
}

/// Whether materialized_scratch_size() for these sizes is an object the machine can hold
/// (broadcast views with zero strides can claim 2^60 keys): callers check this first.
template <class Scalar>
constexpr bool materialized_scratch_fits(Index head_dim, Index value_dim, Index keys) noexcept {
  std::size_t count = 0, bytes = 0;
  const auto width = static_cast<std::size_t>(kQueryBlock + std::max(head_dim, value_dim));
  return checked_mul(width, static_cast<std::size_t>(keys), count) && count < kMaxObjectBytes &&
         checked_bytes(count + 64, sizeof(Scalar), bytes);
}

/// Scratch elements one streaming attention task needs: Q^T (d, kQueryBlock), a score tile
/// (kKeyBlock, kQueryBlock), the output accumulator (kQueryBlock, d_v), five statistics per
/// query and a V tile (kKeyBlock, d_v) for values that must be cleaned.
constexpr Index stream_scratch_size(Index head_dim, Index value_dim) noexcept {
  return head_dim * kQueryBlock + kKeyBlock * kQueryBlock + kQueryBlock * value_dim +
         5 * kQueryBlock + kKeyBlock * value_dim + 64;
}

/// Scratch elements one streaming backward task needs: Q^T (d, kQueryBlock), dO^T (d_v,
/// kQueryBlock), D and lse per query, P^T, dS^T and the dropout factors (kKeyBlock,
/// kQueryBlock) each, and accumulators for dK and dV (kKeyBlock, d + d_v) or dQ
/// (kQueryBlock, d).
constexpr Index stream_backward_scratch_size(Index head_dim, Index value_dim) noexcept {
  return (head_dim + value_dim + 2) * kQueryBlock + 3 * kKeyBlock * kQueryBlock +
         std::max(kKeyBlock * (head_dim + value_dim), kQueryBlock * head_dim) + 64;
}

/// Scratch elements one materialised backward task needs: P (then A) and dA (then dS),
/// (T_q, T_k) each, and K^T or V^T (max(d, d_v), T_k).
constexpr Index materialized_backward_scratch_size(Index queries, Index head_dim, Index value_dim,
                                                   Index keys) noexcept {
  return 2 * queries * keys + std::max(head_dim, value_dim) * keys + 64;
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

/// A GEMM's B operand (a layer's weight, (n, k) row-major) packed once for one kernel set:
/// gemm_nt then reads it instead of packing B on every call. Layout: the depth blocks of
/// that set's blocking for this k, one after another; within a block, B's rows in column
/// groups (the set's micro-panel width, never straddling a segment, counted from each
/// segment's start), each group depth x width contiguous. Any contiguous run of whole
/// segments of it serves a product on those rows of B (see PackedB), with the same result,
/// bit for bit, as packing on the fly. A pack made for one kernel set is ignored (B is
/// packed per call) when another set runs, e.g. after set_isa().
/// detail::pack_gemm_b() (attn/detail/gemm.hpp) fills one.
template <class Scalar>
class PackedGemmB {
 public:
  PackedGemmB() = default;

  /// Storage for B (n, k) with output segments `segment` columns wide (0: one segment),
  /// laid out for `isa`'s micro-panels (`group_cols` wide) and depth blocks.
  PackedGemmB(Index n, Index k, Index segment, Isa isa, Index group_cols, Index depth_block)
      : n_(n),
        k_(k),
        segment_(segment > 0 ? segment : std::max<Index>(n, 1)),
        group_cols_(group_cols),
        depth_block_(depth_block),
        isa_(isa) {
    if (!empty()) data_.reserve(static_cast<std::size_t>(n * k));
  }

  PackedGemmB(const PackedGemmB& other)
      : n_(other.n_),
        k_(other.k_),
        segment_(other.segment_),
        group_cols_(other.group_cols_),
        depth_block_(other.depth_block_),
        isa_(other.isa_) {
    if (other.empty()) return;
    data_.reserve(static_cast<std::size_t>(n_ * k_));
    std::copy(other.data_.data(), other.data_.data() + n_ * k_, data_.data());
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
    return *this;
  }
  ~PackedGemmB() = default;

  bool empty() const noexcept { return n_ <= 0 || k_ <= 0; }
  Index rows() const noexcept { return n_; }
  Index depth() const noexcept { return k_; }
  Index segment() const noexcept { return segment_; }
  Index depth_block() const noexcept { return depth_block_; }
  Isa isa() const noexcept { return isa_; }

  /// First column of the group holding column j, and that group's width.
  Index group_start(Index j) const noexcept {
    const Index s0 = j - j % segment_;
    return s0 + (j - s0) / group_cols_ * group_cols_;
  }
  Index group_width(Index g) const noexcept {
    return std::min({group_cols_, segment_ - g % segment_, n_ - g});
  }
  /// The micro-panel of the group starting at column g, in the depth block starting at p0
  /// (depth x group_width(g), row stride group_width(g)).
  const Scalar* panel(Index p0, Index g, Index depth) const noexcept {
    return data_.data() + p0 * n_ + g * depth;
  }
  Scalar* mutable_panel(Index p0, Index g, Index depth) noexcept {
    return data_.data() + p0 * n_ + g * depth;
  }

 private:
  AlignedBuffer<Scalar> data_;
  Index n_ = 0, k_ = 0, segment_ = 1, group_cols_ = 1, depth_block_ = 1;
  Isa isa_ = Isa::kScalar;
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
/// this set) and streams row blocks of op(A) past it.
///  - A: row-major (a, lda), op(A) = A (m, k) or, `a_transposed`, A^T with A stored (k, m);
///    or, `a_pack`, any GemmOutput layout (a head-major (B, P*H, T, hd) gradient) in
///    `a_layout`, copied row block by row block into the task's buffer first.
///  - B: (b, ldb) row-major, stored (n, k) (op(B) = B^T: y = x W^T, the forward) unless
///    `b_kn`, stored (k, n) (op(B) = B: dX = dY W, dW = dY^T X).
///  - `accumulate`: C += the product (the backward passes add into gradients); else C =.
template <class Scalar>
struct GemmPlan {
  Index m = 0, n = 0, k = 0;
  const Scalar* a = nullptr;  // A row-major, leading dimension lda
  Index lda = 0;
  bool a_transposed = false;
  bool a_pack = false;
  GemmOutput<const Scalar> a_layout;  // with a_pack: A's memory, any layout
  Index a_segment = 0;                // a_layout's segment width (its columns when 0)
  const Scalar* b = nullptr;          // B row-major, leading dimension ldb
  Index ldb = 0;
  bool b_kn = false;
  bool accumulate = false;
  GemmOutput<Scalar> out;
  const Scalar* bias = nullptr;
  const PackedGemmB<Scalar>* pre = nullptr;  // B packed for this kernel set, or null
  Index pre_offset = 0;
  Index segment = 0;  // output segment width (n when the output has one segment)
  Index depth_block = 0, tile_cols = 0, col_tiles = 0, chunk_rows = 0;
};

/// One attention call's operands, (B, H, T, d) views: query, key, value, output and (for
/// the materialised path, optional) weights; the score scale and dropout probability. k and
/// v may have fewer heads than q (grouped-query attention: query head h reads key/value head
/// h / (H / H_kv)). With `ring` > 0 the keys live in a ring of that many rows (a
/// sliding-window KVCache): logical key j is row j % ring of k and v (streaming path only).
/// `lse`, when not empty, (B, H, T_q) receives each query's logsumexp of its masked, scaled
/// scores (before dropout; +inf for a query its masks hide every key from): what the
/// streaming backward recomputes the probabilities from.
template <class Scalar>
struct AttentionArgs {
  TensorView<const Scalar, 4> q, k, v;
  TensorView<Scalar, 4> out, weights;
  Scalar scale = 1;
  double dropout = 0.0;
  Index ring = 0;
  TensorView<Scalar, 3> lse;
};

/// One attention backward call's operands: the forward's inputs, output and logsumexp
/// (B, H, T_q), the output's gradient, and the gradients the backward adds into.
template <class Scalar>
struct AttentionBackwardArgs {
  TensorView<const Scalar, 4> q, k, v, out, grad_out;
  TensorView<const Scalar, 3> lse;
  TensorView<Scalar, 4> grad_q, grad_k, grad_v;
  Scalar scale = 1;
  double dropout = 0.0;
};

/// What one attention backward task computes: dK and dV of a key tile (streaming), dQ of a
/// query tile (streaming), or a whole head (materialised).
enum class BackwardTask { kKeys, kQueries, kMaterialized };

/// One streaming task: query rows [i0, i1) of the heads h0 .. h0 + heads - 1, which share
/// key/value head kv_head, stacked head by head (row r is query i0 + r % (i1 - i0) of head
/// h0 + r / (i1 - i0); heads * (i1 - i0) <= kQueryBlock), over the keys [j_begin, j_end).
/// With `partial` null the task owns all of its rows' keys and writes their output; else it
/// writes each row's unnormalised state there, kPartialExtra + d_v values per row (see
/// partial_row_size) for merge_partials() to combine the key chunks in order.
template <class Scalar>
struct StreamTask {
  Index b = 0, kv_head = 0, h0 = 0, heads = 1, i0 = 0, i1 = 0;
  Index j_begin = 0, j_end = std::numeric_limits<Index>::max();
  Scalar* partial = nullptr;
};

/// Values a partial row holds before its d_v accumulator: the running max m, the sum l and
/// a flag, 1 when the row saw a key its element-wise masks allow.
inline constexpr Index kPartialExtra = 3;
constexpr Index partial_row_size(Index value_dim) noexcept { return value_dim + kPartialExtra; }

/// The mask of one (batch, head), resolved to pointers and per-row visible bounds: row i
/// sees keys j in [row_begin(i), row_end(i)) that the element-wise parts do not hide.
template <class Scalar>
struct HeadMask {
  Index key_limit = 0;  // keys j >= key_limit are invisible (lengths, T_k)
  Index key_first = 0;  // keys j < key_first are invisible (a ring's overwritten positions)
  bool causal = false;
  Index causal_offset = 0;  // row i sees j <= i + causal_offset
  Index window = 0;         // with causal: row i sees j > i + causal_offset - window (0: none)
  const bool* bool_row0 = nullptr;
  Index bool_rs = 0, bool_cs = 0;
  bool bool_allows = false;
  const bool* pad = nullptr;  // key padding, true = blocked
  Index pad_cs = 0;
  const Scalar* add_row0 = nullptr;
  Index add_rs = 0, add_cs = 0;

  /// One past the last key row i may see (the loop bound).
  Index row_end(Index i) const noexcept {
    Index end = key_limit;
    if (causal) end = std::min(end, i + causal_offset + 1);
    return std::max<Index>(end, 0);
  }
  /// The first key row i may see (a sliding window's lower bound).
  Index row_begin(Index i) const noexcept {
    Index begin = key_first;
    if (causal && window > 0) begin = std::max(begin, i + causal_offset - window + 1);
    return std::max<Index>(begin, 0);
  }
  bool elementwise() const noexcept {
    return bool_row0 != nullptr || pad != nullptr || add_row0 != nullptr;
  }
  /// Whether the element-wise parts hide key j from row i: a blocked boolean entry, key
  /// padding, or an additive -inf.
  bool hides(Index i, Index j) const noexcept {
    return (bool_row0 != nullptr && bool_row0[i * bool_rs + j * bool_cs] != bool_allows) ||
           (pad != nullptr && pad[j * pad_cs]) ||
           (add_row0 != nullptr &&
            add_row0[i * add_rs + j * add_cs] == -std::numeric_limits<Scalar>::infinity());
  }
  /// Whether row i sees key j: inside the loop bounds and not hidden.
  bool sees(Index i, Index j) const noexcept {
    return j < row_end(i) && j >= row_begin(i) && !hides(i, j);
  }
  /// Applies the element-wise parts to scores s[0..n) of row i, columns j0..j0+n: a hidden
  /// score becomes -inf (whatever it was: a NaN score the row cannot see must not reach it),
  /// the additive mask is added to the others. Returns how many it left visible.
  Index apply(Index i, Index j0, Scalar* s, Index n) const noexcept {
    constexpr Scalar kNegInf = -std::numeric_limits<Scalar>::infinity();
    Index visible = 0;
    for (Index j = 0; j < n; ++j) {
      if (hides(i, j0 + j)) {
        s[j] = kNegInf;
      } else {
        if (add_row0 != nullptr) s[j] += add_row0[i * add_rs + (j0 + j) * add_cs];
        ++visible;
      }
    }
    return visible;
  }
};

}  // namespace detail
ATTN_NAMESPACE_END
