// SPDX-License-Identifier: MIT
// attn/attention/packed_prefill.hpp: the packed prefill of every module built on one
// AttentionCore: the tokens of N sequences back to back (a packed batch, PackedSequences),
// sequence s appended to item s of a KVCache, the attention of every sequence in one parallel
// region.
// Glossary: N = sequences, T(s) = sequence s's tokens, total = their sum, H = heads, H_kv =
// key/value heads, hd = head dim, hd_v = value head dim, A = H * hd_v, L_s = item s's cache
// length, C = largest chunk.
#pragma once

#include <algorithm>
#include <new>
#include <string>
#include <tuple>
#include <vector>

#include "attn/attention/cached_forward.hpp"
#include "attn/attention/detail/call.hpp"
#include "attn/attention/detail/module_support.hpp"
#include "attn/attention/kv_cache.hpp"
#include "attn/attention/module_core.hpp"
#include "attn/attention/qkv_projection.hpp"
#include "attn/attention/varlen.hpp"
#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/kernels/gemm_args.hpp"
#include "attn/nn/mask.hpp"
#include "attn/ops/attention.hpp"
#include "attn/tensor/overlap.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// Pass 1's checks of a packed prefill that do not depend on the cache: x (1, total, d_in),
/// one set of offsets (self-attention) over its rows. Returns the offsets.
template <class Scalar>
const SequenceOffsets& packed_prefill_offsets(const AttentionCore<Scalar>& core,
                                              TensorView<const Scalar, 3> x,
                                              const PackedSequences& seqs) {
  const CoreConfig& c = core.config();
  const char* where = c.forward_name;
  const char* name = c.input_name != nullptr ? c.input_name : "query";
  check_input(where, name, x, core.d_in(), "d_in");
  const Index total = x.extent(1);
  require(seqs.key.empty(), where, [] {
    return std::string(
        "the packed prefill is self-attention: give one set of offsets (the keys are the "
        "sequences' own tokens)");
  });
  check_offsets(where, "cu_seqlens", seqs.query, name, Shape<2>{total, x.extent(2)});
  return seqs.query;
}

/// The rows of a packed prefill, the sequences' back to back in the workspace: Q (1, H, total,
/// hd), K (1, H_kv, total, hd), V (1, H_kv, total, hd_v), head-major, and where the attention
/// writes the context (1, total, A).
template <class Scalar>
struct PackedPrefillRows {
  const AttentionCore<Scalar>* core = nullptr;
  Index total = 0;
  Scalar* q = nullptr;
  Scalar* k = nullptr;
  Scalar* v = nullptr;
  StepContext<Scalar> ctx;

  /// Rows r0 .. r0 + t of Q as (1, H, t, hd).
  TensorView<const Scalar, 4> query(Index r0, Index t) const {
    const Index heads = core->num_heads(), hd = core->head_dim();
    return TensorView<const Scalar, 4>(q + r0 * hd, {1, heads, t, hd},
                                       {heads * hd, total * hd, hd, 1});
  }
  /// Rows r0 .. r0 + t of the context as (1, H, t, hd_v).
  TensorView<Scalar, 4> context(Index r0, Index t) const {
    const Index heads = core->num_heads(), hd_v = core->value_head_dim();
    return TensorView<Scalar, 4>(ctx.data + r0 * ctx.strides[1], {1, heads, t, hd_v},
                                 {ctx.strides[0], hd_v, ctx.strides[1], 1});
  }
  /// Rows r0 .. r0 + t of Q and K rotated at positions first .. (with rotary embeddings), then
  /// store(part, h, i, row) for each of those K (part 0, hd wide) and V (part 1, hd_v) rows.
  template <class Store>
  void rotate_and_store(Index r0, Index t, Index first, Store&& store) const {
    const Index heads = core->num_heads(), kv_heads = core->num_kv_heads(), hd = core->head_dim();
    if (core->has_rope()) {
      const auto& rope = core->rope();  // in Scalar's compute type
      for (Index h = 0; h < heads; ++h) rope.apply(q + h * total * hd + r0 * hd, t, hd, first);
      for (Index h = 0; h < kv_heads; ++h) rope.apply(k + h * total * hd + r0 * hd, t, hd, first);
    }
    for (int part = 0; part < 2; ++part) {
      const Index width = part == 0 ? hd : core->value_head_dim();
      for (Index h = 0; h < kv_heads; ++h) {
        const Scalar* from = (part == 0 ? k : v) + (h * total + r0) * width;
        for (Index i = 0; i < t; ++i) store(part, h, i, from + i * width);
      }
    }
  }
};

/// Pass 2 of a packed prefill: Q, K and V of all `total` rows of x, one projection GEMM each.
template <class Scalar>
PackedPrefillRows<Scalar> project_packed_prefill(const AttentionCore<Scalar>& core,
                                                 TensorView<const Scalar, 3> x,
                                                 TensorView<Scalar, 3> out, Workspace& ws) {
  const QkvProjection<Scalar>& proj = core.projection();
  const Index total = x.extent(1), heads = core.num_heads(), kv_heads = core.num_kv_heads();
  const Index hd = core.head_dim(), hd_v = core.value_head_dim(), qa = heads * hd;
  const RowsRef<const Scalar> rows = as_rows(x, ws, WorkspaceSlot::kKeyStaging);
  PackedPrefillRows<Scalar> p;
  p.core = &core;
  p.total = total;
  p.q =
      workspace_get<Scalar>(ws, WorkspaceSlot::kProjection, total * (qa + kv_heads * (hd + hd_v)));
  p.k = p.q + total * qa;
  p.v = p.k + total * kv_heads * hd;
  proj.project_rows(rows, QkvProjection<Scalar>::kQuery, 1,
                    GemmOutput<Scalar>::head_major(p.q, total, qa, hd), ws);
  project_key_value(proj, rows, total, p.k, ws);
  p.ctx = step_context(core, out, 1, total, ws);
  return p;
}

/// The packed prefill: x (1, total, d_in) holds N sequences' next tokens (offsets
/// seqs.query); sequence s's keys and values are appended to item s of `cache` and its tokens
/// attend to that item's cached keys as forward_cached() does (the per-item bottom-right
/// causal bound, the module's window, rotary embeddings at positions L_s ..). out (1, total,
/// d_out).
///   1. checks, all before anything is written (check_cache_use(), check_cache_room() per
///      sequence, the offsets, out);
///   2. Q, K, V of all rows: one projection GEMM each, head-major in the workspace;
///   3. rounds of at most C = cache.max_chunk() tokens per sequence (one round without a
///      ring): each sequence's next rows into its item, rotated, the item advanced; then
///      every sequence's attention call of the round in one parallel region (a ring's next
///      round overwrites keys this one reads);
///   4. the output projection over all rows.
/// Each sequence's rows, and its item's keys and values, are bit-identical to
/// forward_cached() on that sequence alone with a cache of one item in the same state (the
/// same projections per row, rotations, chunks and attention tasks).
template <class Scalar>
void forward_packed_prefill(const AttentionCore<Scalar>& core, TensorView<const Scalar, 3> x,
                            const PackedSequences& seqs, TensorView<Scalar, 3> out, Workspace& ws,
                            KVCache<Scalar>& cache) {
  const char* where = core.config().forward_name;
  // 1. Checks.
  const SequenceOffsets& o = packed_prefill_offsets(core, x, seqs);
  const Index total = x.extent(1), n = o.sequences();
  check_cache_use(core, cache, n, true);
  check_output(where, out, {1, total, core.d_out()});
  for (Index s = 0; s < n; ++s) check_cache_room(core, cache, s, o.length(s));
  check_output_memory(where, out, {}, AttentionMask<compute_type_t<Scalar>>());
  require_disjoint(where, "out", out, "the cache's keys and values", cache.memory());
  KVCacheAccess::set_owner(cache, core.id());
  // 2. Projections: Q (1, H, total, hd), then K (1, H_kv, total, hd) and V (1, H_kv, total,
  //    hd_v).
  const PackedPrefillRows<Scalar> rows = project_packed_prefill(core, x, out, ws);
  const AttentionOptions options = core.kernel_options({}, ws);  // one dropout call for the batch
  // 3. Rounds of at most C tokens of each sequence (their calls in the workspace's table).
  using Call = AttentionCall<compute_type_t<Scalar>, Scalar>;
  Call* const calls = std::get<0>(workspace_tables<Call>(ws, WorkspaceSlot::kCallTable, n));
  const Index chunk = cache.max_chunk(), longest = o.max_length();
  for (Index t0 = 0; t0 < longest; t0 += chunk) {
    Index count = 0;
    for (Index s = 0; s < n; ++s) {
      if (o.length(s) <= t0) continue;
      const Index t = std::min(chunk, o.length(s) - t0), r0 = o.begin(s) + t0;
      const Index first = cache.length(s);
      // Keys rotated in the workspace at positions L_s .., then stored (quantised, for a
      // quantised cache) with the values: the same values forward_cached() stores.
      rows.rotate_and_store(r0, t, first, [&](int part, Index h, Index i, const Scalar* row) {
        KVCacheAccess::store_row(cache, row, s, part, h, first + i);
      });
      cache.advance(t, s, 1);
      Call* const call = new (calls + count++) Call(cache_call<Scalar>(
          where, rows.query(r0, t), cache, rows.context(r0, t), options, core.sliding_window(), s));
      call->dropout_item = s;
    }
    run_attention(calls, count, ws);
  }
  // 4. The output projection.
  finish_step(core, rows.ctx, 1, total, out, ws);
}

}  // namespace detail
ATTN_NAMESPACE_END
