// SPDX-License-Identifier: MIT
// attn/attention/paged_forward.hpp: attention over the sequences of a PagedKVCache, read
// through their block tables (no copy of the cache), and the incremental forward of a module
// on a batch of its sequences (ragged lengths: each sequence at its own position).
// Glossary: B = sequences of the call, T = new tokens per sequence, H = heads, H_kv =
// key/value heads, hd = head dim, hd_v = value head dim, A = H * hd_v, L_b = sequence b's
// length, W = window.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "attn/attention/cached_forward.hpp"
#include "attn/attention/detail/call.hpp"
#include "attn/attention/detail/module_support.hpp"
#include "attn/attention/module_core.hpp"
#include "attn/attention/packed_prefill.hpp"
#include "attn/attention/paged_kv_cache.hpp"
#include "attn/attention/qkv_projection.hpp"
#include "attn/attention/scaled_dot_product.hpp"
#include "attn/attention/varlen.hpp"
#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/kernels/gemm_args.hpp"
#include "attn/nn/mask.hpp"
#include "attn/ops/attention.hpp"
#include "attn/tensor/overlap.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// The attention call of q (B, H, T, hd) over sequences seqs[0 .. B-1] of `cache` (their new
/// tokens appended): query i of item b at position L_b - T + i (per-item bottom-right causal
/// bound, the window), the rows read through the block tables. As cache_call() for a
/// KVCache: the same tiles over the same positions, so the same bits for the same rows.
/// With `table` and `lengths` (PagedKVCache::batch_into()'s memory), the batch is gathered
/// there instead of into the cache: several calls over one cache in one parallel region. A
/// 16-bit storage type's cache (rows of that type) gives a call on those operands, computed
/// in float, as cache_call().
template <class Scalar>
AttentionCall<compute_type_t<Scalar>, Scalar> paged_call(
    const char* where, TensorView<const Scalar, 4> q, const PagedKVCache<Scalar>& cache,
    const Index* seqs, TensorView<Scalar, 4> out, const AttentionOptions& options, Index window,
    Index* table = nullptr, Index* lengths = nullptr) {
  const PagedBatch batch = table != nullptr ? cache.batch_into(seqs, q.extent(0), table, lengths)
                                            : cache.batch(seqs, q.extent(0));
  CacheKeys keys;
  keys.lengths = TensorView<const Index, 1>(batch.lengths, {batch.batch});
  // k and v give the shapes only (the kernel reads call.args.stored), as broadcasts of q's
  // first row, memory the checks already accept.
  const auto shape_only = [&](Index width) {
    return TensorView<const Scalar, 4>(
        q.data(), {batch.batch, cache.num_kv_heads(), batch.slots, width}, {0, 0, 0, 1});
  };
  AttentionCall<compute_type_t<Scalar>, Scalar> call = make_call<compute_type_t<Scalar>, Scalar>(
      where, q, shape_only(cache.head_dim()), shape_only(cache.value_head_dim()), out, {}, {}, {},
      options, {true, CausalAlignment::kBottomRightPerItem, window}, keys);
  call.args.stored = batch.stored;
  call.materialize = false;  // stored rows: the streaming kernel only
  return call;
}

/// Sequence s of `cache` still holds every key its first query, at position `first_query`,
/// sees with `window` (0: from position 0).
/// @throws ConfigError naming the positions when released blocks hold some.
template <class Scalar>
void check_window_held(const char* where, const PagedKVCache<Scalar>& cache, Index s,
                       Index first_query, Index window) {
  const Index first_key = window > 0 ? std::max<Index>(first_query - window + 1, 0) : 0;
  require_config(cache.first_position(s) <= first_key, where, [&] {
    return "sequence " + std::to_string(s) + " holds positions from " +
           std::to_string(cache.first_position(s)) + " (the blocks before were released), but " +
           "its query at position " + std::to_string(first_query) + " sees keys from " +
           std::to_string(first_key) +
           (window > 0 ? " with window=" + std::to_string(window) : " without a window");
  });
}

/// The checks of the paged forwards that do not depend on the input's layout: a causal
/// self-attention module of the cache's heads and head sizes, sequences seqs[0 .. B-1]
/// distinct sequences of the cache that take tokens[b * t_stride] more tokens each within
/// context_length and the rotary tables, still holding the keys their window sees, and blocks
/// enough in the pool.
template <class Scalar>
void check_paged_sequences(const AttentionCore<Scalar>& core, const PagedKVCache<Scalar>& cache,
                           const std::vector<Index>& seqs, Index batch, const Index* tokens,
                           Index t_stride) {
  const CoreConfig& c = core.config();
  const char* where = c.forward_name;
  require_config(c.causal && core.projection().fused(), where, [] {
    return std::string(
        "the incremental forward is causal self-attention (each token attends to the cached "
        "keys up to its own position): build the module with causal=true and kdim == vdim "
        "== d_in");
  });
  require(batch == static_cast<Index>(seqs.size()) && cache.num_kv_heads() == core.num_kv_heads() &&
              cache.head_dim() == core.head_dim() &&
              cache.value_head_dim() == core.value_head_dim(),
          where, [&] {
            return "x of B=" + std::to_string(batch) + " for " + std::to_string(seqs.size()) +
                   " sequences of a paged cache of H_kv=" + std::to_string(cache.num_kv_heads()) +
                   ", head_dim=" + std::to_string(cache.head_dim()) +
                   ", value_head_dim=" + std::to_string(cache.value_head_dim()) +
                   "; the module needs one sequence per item and H_kv=" +
                   std::to_string(core.num_kv_heads()) +
                   ", head_dim=" + std::to_string(core.head_dim()) +
                   ", value_head_dim=" + std::to_string(core.value_head_dim());
          });
  const Index need = cache.needed(where, seqs.data(), batch, tokens, t_stride);  // ids, repeats
  for (Index b = 0; b < batch; ++b) {
    const Index t = tokens[b * t_stride];
    const Index end = cache.length(seqs[static_cast<std::size_t>(b)]) + t;  // no overflow
    check_window_held(where, cache, seqs[static_cast<std::size_t>(b)], end - t,
                      core.sliding_window());
    require_config(c.context_length <= 0 || end <= c.context_length, where, [&] {
      return "sequence " + std::to_string(seqs[static_cast<std::size_t>(b)]) + " would reach " +
             std::to_string(end) +
             " tokens, more than context_length=" + std::to_string(c.context_length);
    });
    require_config(!core.has_rope() || end <= core.rope().max_positions(), where, [&] {
      return "sequence " + std::to_string(seqs[static_cast<std::size_t>(b)]) +
             " would reach position " + std::to_string(end - 1) +
             ", outside the rotary tables [0, " + std::to_string(core.rope().max_positions()) +
             ") (set rope.max_positions)";
    });
  }
  require_config(need <= cache.free_blocks(), where, [&] {
    Index total = 0;
    for (Index b = 0; b < batch; ++b) total += tokens[b * t_stride];
    return "the block pool is exhausted: " + std::to_string(total) + " more tokens for " +
           std::to_string(batch) + " sequences need " + std::to_string(need) + " blocks, " +
           std::to_string(cache.free_blocks()) + " of N=" + std::to_string(cache.num_blocks()) +
           " are free (free or preempt sequences, or build a larger pool)";
  });
}

/// The checks of forward_paged(), all before anything is written (the cache included): a
/// causal self-attention module of the cache's heads and head size, x (B, T, d_in) for B
/// distinct sequences of the cache, out (B, T, d_out) outside the cache, positions within
/// context_length and the rotary tables, and blocks enough in the pool.
/// @throws as forward_paged().
template <class Scalar>
void check_paged(const AttentionCore<Scalar>& core, TensorView<const Scalar, 3> x,
                 TensorView<Scalar, 3> out, const PagedKVCache<Scalar>& cache,
                 const std::vector<Index>& seqs) {
  const CoreConfig& c = core.config();
  const char* where = c.forward_name;
  const char* name = c.input_name != nullptr ? c.input_name : "query";
  check_input(where, name, x, core.d_in(), "d_in");
  const Index batch = x.extent(0), tokens = x.extent(1);
  check_paged_sequences(core, cache, seqs, batch, &tokens, 0);
  check_output(where, out, {batch, tokens, core.d_out()});
  require_disjoint(where, "out", out, "the cache's keys and values", cache.memory());
}

/// The incremental forward over sequences of a paged cache: x (B, T, d_in) holds the next T
/// tokens of sequences seqs[0 .. B-1], each at its own length (a ragged batch). As
/// forward_cached(): their keys and values are appended (rotated, quantised), and each token
/// attends causally (within the module's window) to its sequence's cached keys; the rows
/// equal forward_cached()'s over a KVCache holding the same tokens, bit for bit. With a
/// window W, each sequence's blocks wholly before position length - W + 1 (which no later
/// query sees) are released after the step (PagedKVCache::release_before()).
template <class Scalar>
void forward_paged(const AttentionCore<Scalar>& core, TensorView<const Scalar, 3> x,
                   TensorView<Scalar, 3> out, Workspace& ws, PagedKVCache<Scalar>& cache,
                   const std::vector<Index>& seqs) {
  check_paged(core, x, out, cache, seqs);
  const QkvProjection<Scalar>& proj = core.projection();
  const Index batch = x.extent(0), t = x.extent(1), heads = core.num_heads();
  const Index kv_heads = core.num_kv_heads(), hd = core.head_dim(), hd_v = core.value_head_dim();
  const Index qa = heads * hd;
  // 1. Blocks for the new tokens (copies of shared last blocks first); strong guarantee.
  cache.prepare(core.config().forward_name, seqs.data(), batch, t);
  // 2. Projections into the workspace: Q (B, H, t, hd), then per item its K (H_kv, t, hd) and
  // V (H_kv, t, hd_v) (see project_key_value()).
  const RowsRef<const Scalar> rows = as_rows(x, ws, WorkspaceSlot::kKeyStaging);
  const Index item_kv = t * kv_heads * (hd + hd_v);
  Scalar* q = workspace_get<Scalar>(ws, WorkspaceSlot::kProjection, batch * (t * qa + item_kv));
  Scalar* kv = q + batch * t * qa;
  const auto k_at = [&](Index b, Index h) { return kv + b * item_kv + h * t * hd; };
  const auto v_at = [&](Index b, Index h) {
    return kv + b * item_kv + kv_heads * t * hd + h * t * hd_v;
  };
  proj.project_rows(rows, QkvProjection<Scalar>::kQuery, 1,
                    GemmOutput<Scalar>::head_major(q, t, qa, hd), ws);
  project_key_value(proj, rows, t, kv, ws);
  // 3. RoPE on Q and the new K rows at each sequence's positions L_b .. L_b + t - 1; the
  // rotated keys and the values stored (quantised) there.
  for (Index b = 0; b < batch; ++b) {
    const Index s = seqs[static_cast<std::size_t>(b)], first = cache.length(s);
    if (core.has_rope()) {
      const auto& rope = core.rope();  // in Scalar's compute type
      for (Index h = 0; h < heads; ++h) rope.apply(q + (b * heads + h) * t * hd, t, hd, first);
      for (Index h = 0; h < kv_heads; ++h) rope.apply(k_at(b, h), t, hd, first);
    }
    for (Index part = 0; part < 2; ++part) {
      const Index width = part == 0 ? hd : hd_v;
      for (Index h = 0; h < kv_heads; ++h) {
        const Scalar* from = part == 0 ? k_at(b, h) : v_at(b, h);
        for (Index i = 0; i < t; ++i) {
          cache.store_row(from + i * width, 1, s, static_cast<int>(part), h, first + i);
        }
      }
    }
  }
  for (const Index s : seqs) cache.advance(s, t);
  // 4. The kernel over the cache through the block tables.
  const StepContext<Scalar> ctx = step_context(core, out, batch, t, ws);
  run_attention(paged_call<Scalar>(
                    core.config().forward_name,
                    TensorView<const Scalar, 4>(q, {batch, heads, t, hd}, {t * qa, t * hd, hd, 1}),
                    cache, seqs.data(),
                    TensorView<Scalar, 4>(ctx.data, {batch, heads, t, hd_v},
                                          {ctx.strides[0], hd_v, ctx.strides[1], 1}),
                    core.kernel_options({}, ws), core.sliding_window()),
                ws);
  // 5. The output projection.
  finish_step(core, ctx, batch, t, out, ws);
  // 6. With a window, the blocks no later query sees back to the pool.
  if (core.sliding_window() > 0) {
    for (const Index s : seqs) cache.release_before(s, cache.length(s) - core.sliding_window() + 1);
  }
}

/// The packed prefill into a paged cache: x (1, total, d_in) holds the next tokens of
/// sequences ids[0 .. N-1] of `cache` (distinct) back to back, sequence ids[s] rows
/// offsets.query.begin(s) .. end(s) (a prompt of its own length each); out (1, total,
/// d_out). As forward_packed_prefill() for a KVCache:
///   1. checks, all before anything is written (check_paged_sequences() with each
///      sequence's own length, the offsets, out); blocks for every sequence's tokens;
///   2. Q, K, V of all rows: one projection GEMM each, head-major in the workspace;
///   3. each sequence's keys (rotated at its positions L_s ..) and values stored through its
///      block table, its length advanced; then every sequence's attention call in one
///      parallel region (each reading its own gathered table);
///   4. the output projection over all rows; with a window, the blocks no later query sees
///      released.
/// Each sequence's rows, and its keys and values in the cache, are bit-identical to
/// forward_paged() on that sequence alone (a batch of one).
template <class Scalar>
void forward_paged_prefill(const AttentionCore<Scalar>& core, TensorView<const Scalar, 3> x,
                           const PackedSequences& packed, TensorView<Scalar, 3> out, Workspace& ws,
                           PagedKVCache<Scalar>& cache, const std::vector<Index>& ids) {
  const char* where = core.config().forward_name;
  // 1. Checks. Per sequence, in the workspace (kCallTable): its call, its new tokens and the
  //    length its call reads.
  const SequenceOffsets& o = packed_prefill_offsets(core, x, packed);
  const Index total = x.extent(1), n = o.sequences();
  using Call = AttentionCall<compute_type_t<Scalar>, Scalar>;
  const auto [calls, lengths, read] =
      workspace_tables<Call, Index, Index>(ws, WorkspaceSlot::kCallTable, n);
  for (Index s = 0; s < n; ++s) lengths[s] = o.length(s);
  check_paged_sequences(core, cache, ids, n, lengths, 1);
  check_output(where, out, {1, total, core.d_out()});
  check_output_memory(where, out, {}, AttentionMask<compute_type_t<Scalar>>());
  require_disjoint(where, "out", out, "the cache's keys and values", cache.memory());
  cache.prepare(where, ids.data(), n, lengths, 1);  // strong guarantee
  // 2. Projections: Q (1, H, total, hd), then K (1, H_kv, total, hd) and V (1, H_kv, total,
  //    hd_v).
  const PackedPrefillRows<Scalar> rows = project_packed_prefill(core, x, out, ws);
  const AttentionOptions options = core.kernel_options({}, ws);
  // 3. Each sequence's rows into its blocks; then the attention of all of them, each call
  //    reading its own block table gathered into the workspace (kBlockTables).
  Index entries = 0;
  for (Index s = 0; s < n; ++s) {
    const Index id = ids[static_cast<std::size_t>(s)], t = o.length(s), r0 = o.begin(s);
    const Index first = cache.length(id);
    rows.rotate_and_store(r0, t, first, [&](int part, Index h, Index i, const Scalar* row) {
      cache.store_row(row, 1, id, part, h, first + i);
    });
    cache.advance(id, t);
    entries += cache.batch_table_size(&id, 1);
  }
  Index* table = workspace_get<Index>(ws, WorkspaceSlot::kBlockTables, entries);
  Index count = 0;
  for (Index s = 0; s < n; ++s) {
    const Index* id = &ids[static_cast<std::size_t>(s)];
    const Index t = o.length(s), r0 = o.begin(s);
    if (t == 0) continue;
    new (calls + count)
        Call(paged_call<Scalar>(where, rows.query(r0, t), cache, id, rows.context(r0, t), options,
                                core.sliding_window(), table, read + count));
    table += cache.batch_table_size(id, 1);
    ++count;
  }
  run_attention(calls, count, ws);
  // 4. The output projection; the blocks behind the window back to the pool.
  finish_step(core, rows.ctx, 1, total, out, ws);
  if (core.sliding_window() > 0) {
    for (const Index id : ids)
      cache.release_before(id, cache.length(id) - core.sliding_window() + 1);
  }
}

}  // namespace detail

/// Attention of q (B, H, T, hd) over sequences seqs[0 .. B-1] of `cache` (H_kv dividing H;
/// distinct or not), as the incremental forward runs it once the T new tokens are appended:
/// query i of item b sits at position L_b - T + i and sees the stored keys up to it, within
/// `window` (0: none). out: (B, H, T, hd_v). The kernel reads the rows through the block
/// tables, dequantising quantised ones tile by tile: the same bits as cached_attention() over
/// a KVCache holding the same tokens, for any thread count. Allocation-free with a warm
/// workspace and cache. The sequences' tables are gathered into the cache (batch()): no
/// other call may use the same cache at the same time.
/// @throws IndexError for an entry of seqs that is not a sequence; ShapeError on shapes that
///         do not fit (seqs must have B entries) or an `out` sharing memory with q or the
///         cache; ConfigError for T past a sequence's length, a negative window, keys the
///         window sees in blocks released before (PagedKVCache::release_before()), or
///         options scaled_dot_product_attention refuses.
template <class Scalar>
void paged_attention(typename std::enable_if_t<true, TensorView<const Scalar, 4>> q,
                     const PagedKVCache<Scalar>& cache, const std::vector<Index>& seqs,
                     typename std::enable_if_t<true, TensorView<Scalar, 4>> out, Workspace& ws,
                     const AttentionOptions& options = {}, Index window = 0) {
  const char* where = "paged_attention";
  detail::require(q.extent(0) == static_cast<Index>(seqs.size()) && q.extent(3) == cache.head_dim(),
                  where, [&] {
                    return "q " + detail::to_string(q.shape()) + " over " +
                           std::to_string(seqs.size()) +
                           " sequences of a cache of head_dim=" + std::to_string(cache.head_dim()) +
                           ": expected (B=" + std::to_string(seqs.size()) + ", H, T, " +
                           std::to_string(cache.head_dim()) + ")";
                  });
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    detail::require_config(q.extent(2) <= cache.length(seqs[b]), where, [&] {
      return "T=" + std::to_string(q.extent(2)) + " queries, but sequence " +
             std::to_string(seqs[b]) + " holds " + std::to_string(cache.length(seqs[b])) +
             " tokens (append the new ones first)";
    });
  }
  detail::require_config(window >= 0, where,
                         [&] { return "window=" + std::to_string(window) + " is negative"; });
  for (const Index s : seqs) {
    detail::check_window_held(where, cache, s, cache.length(s) - q.extent(2), window);
  }
  detail::require_disjoint(where, "out", out, "the cache's keys and values", cache.memory());
  detail::run_attention(detail::paged_call(where, q, cache, seqs.data(), out, options, window), ws);
}

ATTN_NAMESPACE_END
