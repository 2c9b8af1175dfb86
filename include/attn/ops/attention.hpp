// SPDX-License-Identifier: MIT
// attn/ops/attention.hpp: the attention forward's plan and driver. plan_attention() picks,
// from the AttentionCall alone, the path (materialised, streaming, split-keys decode), how
// grouped-query heads stack and how the work is cut into tasks; run_attention() runs them on
// the one task runner, each task on the active kernel set (attn/kernels/generic/
// attention.inl holds both paths, key_chunks.inl the split-keys merge).
// Glossary: B = batch, H = heads, H_kv = key/value heads, T_q / T_k = query / key tokens,
// d = head dim, d_v = value head dim.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>

#include "attn/config.hpp"
#include "attn/detail/dropout_hash.hpp"
#include "attn/kernels/attention_args.hpp"
#include "attn/kernels/dispatch.hpp"
#include "attn/kernels/head_mask.hpp"
#include "attn/ops/attention_call.hpp"
#include "attn/ops/decode.hpp"
#include "attn/parallel.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// Keys whose rows of one head span more than this many bytes are copied head-major
/// before the streaming kernel walks them: every query tile re-reads all of a head's K and
/// V, and rows scattered over tens of MiB (a (B, T, 3D) fused projection split into heads)
/// cost a TLB miss and a poorly associated cache set per row on each pass. The copy is
/// O(T_k * d) per head against O(T_q * T_k * d) of work and changes no arithmetic.
inline constexpr std::size_t kKeyValueCopyBytes = std::size_t(8) << 20;

template <class Scalar>
bool wants_head_major_copy(const TensorView<const Scalar, 4>& x) {
  const Index rows = x.extent(2), width = x.extent(3), rs = x.stride(2);
  if (x.stride(3) != 1 || rs == width || rows < 2) return false;
  return static_cast<std::size_t>(rows) * static_cast<std::size_t>(rs) * sizeof(Scalar) >
         kKeyValueCopyBytes;
}

/// The path of an attention call.
enum class AttentionRoute {
  kMaterialized,  ///< one task per (batch, head, query tile of kQueryBlock): whole score rows
  kStreaming,     ///< one task per (batch, key/value head, group heads, query tile)
  kSplitKeys,     ///< streaming tasks also split by key chunk, merged in chunk order
};

/// How one call is cut into tasks.
/// - streaming: query tiles of `rows_per_head` rows; `group_heads` query heads of a
///   key/value group stacked in one task (short queries: each K/V row loaded serves them
///   all); split keys: the keys in `chunks` chunks of kKeyChunk from chunk `first_chunk`.
///   Task = (((b * H_kv + kv_head) * head_chunks + head chunk) * tiles + tile) * chunks + c.
/// - materialised: task = (b * H + h) * tiles + tile, tiles of kQueryBlock.
struct AttentionPlan {
  AttentionRoute route = AttentionRoute::kStreaming;
  Index rows_per_head = 0, tiles = 0, group_heads = 1, head_chunks = 1;
  Index first_chunk = 0, chunks = 1;
  Index tasks = 0;    ///< tasks of the first phase
  Index merges = 0;   ///< split keys: one merge per task of rows, after every chunk ran
  Index scratch = 0;  ///< elements of each thread's scratch
  bool copy_k = false, copy_v = false;  ///< K, V copied head-major first (streaming)
};

/// The one place an attention call's path and tasks are chosen.
template <class Scalar>
AttentionPlan plan_attention(const AttentionCall<Scalar>& call) {
  const AttentionArgs<Scalar>& a = call.args;
  const Index batch = call.batch(), tq = call.queries(), kv_heads = call.kv_heads();
  const Index group = call.heads() / kv_heads, d = call.head_dim(), dv = call.value_dim();
  AttentionPlan plan;
  // 1. The path: materialised when the weights are wanted or asked for; streaming otherwise,
  //    its keys split in chunks for few queries (a decode step). Stored keys and values (a
  //    quantised cache) are only read by the streaming path (their front end never asks for
  //    weights).
  if (call.materialize && !a.stored.active()) {
    plan.route = AttentionRoute::kMaterialized;
    plan.tiles = (tq + kQueryBlock - 1) / kQueryBlock;
    plan.tasks = batch * call.heads() * plan.tiles;
    plan.scratch = materialized_scratch_size(d, dv, call.keys());
    return plan;
  }
  plan.route = splits_keys(call) ? AttentionRoute::kSplitKeys : AttentionRoute::kStreaming;
  // 2. Query tiles, and grouped-query heads stacked up to kQueryBlock rows per task (a full
  //    tile of one head already has kQueryBlock rows per K/V tile).
  plan.rows_per_head = std::min(tq, kQueryBlock);
  plan.tiles = (tq + plan.rows_per_head - 1) / plan.rows_per_head;
  plan.group_heads = std::min(group, std::max<Index>(1, kQueryBlock / plan.rows_per_head));
  plan.head_chunks = (group + plan.group_heads - 1) / plan.group_heads;
  // 3. Split keys: the chunks some query sees.
  if (plan.route == AttentionRoute::kSplitKeys) {
    const KeyChunks chunks = key_chunks(call);
    plan.first_chunk = chunks.first;
    plan.chunks = chunks.count;
  }
  plan.tasks = batch * kv_heads * plan.head_chunks * plan.tiles * plan.chunks;
  plan.merges = plan.route == AttentionRoute::kSplitKeys ? plan.tasks / plan.chunks : 0;
  plan.scratch = stream_scratch_size(d, dv);
  if (a.stored.active()) plan.scratch += stored_tile_scratch_size(d, dv);
  // 4. Long, strided K or V (not a ring's, nor stored rows): copied head-major once.
  plan.copy_k = a.ring == 0 && !a.stored.active() && wants_head_major_copy(a.k);
  plan.copy_v = a.ring == 0 && !a.stored.active() && wants_head_major_copy(a.v);
  return plan;
}

/// Runs one attention call (see plan_attention()). Each output element is written by
/// exactly one task, or merged from its key chunks in chunk order, so results do not depend
/// on the thread count or the schedule. `ws` holds the threads' scratch, the head-major K/V
/// copy and the split-keys partial states: nothing is allocated once it has served a call
/// as large.
template <class Scalar>
void run_attention(const AttentionCall<Scalar>& call, Workspace& ws) {
  const AttentionPlan plan = plan_attention(call);
  AttentionArgs<Scalar> args = call.args;
  // 1. K, V copied head-major (B, H_kv, T_k, d): each head's rows back to back.
  if (plan.copy_k || plan.copy_v) {
    const Index k_size = plan.copy_k ? args.k.size() : 0, v_size = plan.copy_v ? args.v.size() : 0;
    Scalar* buffer = workspace_get<Scalar>(ws, WorkspaceSlot::kKernelKeyValue, k_size + v_size);
    if (plan.copy_k) {
      const TensorView<Scalar, 4> k(buffer, args.k.shape());
      attn::copy(args.k, k);
      args.k = k;
    }
    if (plan.copy_v) {
      const TensorView<Scalar, 4> v(buffer + k_size, args.v.shape());
      attn::copy(args.v, v);
      args.v = v;
    }
  }
  // 2. Scratch: one buffer per thread; split keys: each task's rows' partial states (partial
  //    row size each), chunk after chunk.
  const int threads = task_threads(plan.tasks);
  for (int t = 0; t < threads; ++t) {
    workspace_get<Scalar>(ws, WorkspaceSlot::kThread, plan.scratch, t);
  }
  const Index tq = call.queries(), heads = call.heads(), kv_heads = call.kv_heads();
  const Index group = heads / kv_heads, dv = call.value_dim();
  const Index row_size = partial_row_size(dv);
  const Index chunk_stride = plan.group_heads * plan.rows_per_head * row_size;
  Scalar* partials = plan.merges > 0 ? workspace_get<Scalar>(ws, WorkspaceSlot::kKernelPartials,
                                                             plan.tasks * chunk_stride)
                                     : nullptr;
  const auto drop_of = [&](Index b, Index h) {
    return make_dropout_stream(args.dropout, call.dropout_seed, call.dropout_call, b, h);
  };
  // A streaming task's rows, and (c, when not null) its key chunk.
  const auto stream_task = [&](Index task, Index* c) {
    StreamTask<Scalar> t;
    Index rest = task;
    if (c != nullptr) *c = rest % plan.chunks, rest /= plan.chunks;
    const Index tile = rest % plan.tiles;
    rest /= plan.tiles;
    const Index hc = rest % plan.head_chunks;
    rest /= plan.head_chunks;
    t.kv_head = rest % kv_heads;
    t.b = rest / kv_heads;
    t.h0 = t.kv_head * group + hc * plan.group_heads;
    t.heads = std::min(plan.group_heads, (t.kv_head + 1) * group - t.h0);
    t.i0 = tile * plan.rows_per_head;
    t.i1 = std::min(tq, t.i0 + plan.rows_per_head);
    return t;
  };
  const double keep = 1.0 - (args.dropout > 0.0 ? args.dropout : 0.0);
  // 3. The tasks, then (split keys) the merges, in one parallel region.
  with_kernels(kernel_isa(), [&](auto set) {
    const auto run_task = [&](Index task, int thread) {
      Scalar* scratch = workspace_peek<Scalar>(ws, WorkspaceSlot::kThread, thread);
      if (plan.route == AttentionRoute::kMaterialized) {
        const Index tile = task % plan.tiles, bh = task / plan.tiles;
        const Index b = bh / heads, h = bh % heads;
        const Index i0 = tile * kQueryBlock, i1 = std::min(tq, i0 + kQueryBlock);
        set.materialized_task(args, call.head_mask(b, h), drop_of(b, h), b, h, i0, i1, scratch);
        return;
      }
      Index c = 0;
      StreamTask<Scalar> t = stream_task(task, &c);
      if (plan.route == AttentionRoute::kSplitKeys) {
        t.j_begin = (plan.first_chunk + c) * kKeyChunk;
        t.j_end = t.j_begin + kKeyChunk;
        t.partial = partials + task * chunk_stride;
      }
      HeadMask<Scalar> masks[kQueryBlock];
      DropoutStream drops[kQueryBlock];
      for (Index g = 0; g < t.heads; ++g) {
        masks[g] = call.head_mask(t.b, t.h0 + g);
        drops[g] = drop_of(t.b, t.h0 + g);
      }
      set.streaming_task(args, masks, drops, t, scratch);
    };
    // Combines the key chunks of one split task's rows, in chunk order.
    const auto merge = [&](Index task, int) {
      const StreamTask<Scalar> t = stream_task(task, nullptr);
      const Index nq = t.i1 - t.i0;
      const Scalar* first = partials + task * plan.chunks * chunk_stride;
      for (Index r = 0; r < t.heads * nq; ++r) {
        const Index h = t.h0 + r / nq;
        const Scalar sink =
            args.sinks != nullptr ? args.sinks[h] : -std::numeric_limits<Scalar>::infinity();
        set.merge_partials(first + r * row_size, plan.chunks, chunk_stride, dv, keep,
                           &args.out(t.b, h, t.i0 + r % nq, 0), sink);
      }
    };
    run_tasks(threads, plan.tasks, run_task, plan.merges, merge);
  });
}

}  // namespace detail
ATTN_NAMESPACE_END
