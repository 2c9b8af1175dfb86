// SPDX-License-Identifier: MIT
// attn/ops/attention_backward.hpp: the attention backward's plan and driver: the tasks of
// each path, run on the one task runner, each by the active kernel set
// (attn/kernels/generic/attention_backward.inl).
// Glossary: B = batch, H = heads, H_kv = key/value heads, T_q / T_k = query / key tokens,
// d = head dim, d_v = value head dim.
#pragma once

#include <algorithm>

#include "attn/config.hpp"
#include "attn/detail/dropout_hash.hpp"
#include "attn/kernels/attention_args.hpp"
#include "attn/kernels/dispatch.hpp"
#include "attn/ops/attention_call.hpp"
#include "attn/parallel.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// The backward of the attention call `call` (the forward's, with its output in args.out and
/// its logsumexp in args.lse, both read only), adding into the gradients of `grads`.
/// - streaming: first one task per (batch, key/value head, key tile of kKeyBlock) computes
///   dK and dV of its keys over the query tiles that see them (causal: from the diagonal
///   on), then one task per (batch, head, query tile of kQueryBlock) computes dQ over the
///   key tiles its queries see (causal: up to the diagonal). Both recompute P =
///   exp(S - lse) by tiles: O(T (d + d_v)) memory, no atomics, each gradient row owned by
///   one task.
/// - materialised: one task per (batch, key/value head), whole (T_q, T_k) score rows.
/// Grouped-query attention (H_kv < H): a task that writes dK and dV (a key tile, or a whole
/// head materialised) covers one key/value head and runs the group's query heads one after
/// the other, in head order, each adding its share: every gradient row still has one owner,
/// and the result does not depend on the thread count.
/// With sinks and grads.grad_sinks: each dQ task (materialised: each head) writes its rows'
/// share of dL/dsink_h into a buffer, summed per head in (batch, tile) order at the end.
template <class Scalar>
void run_attention_backward(const AttentionCall<Scalar>& call,
                            const AttentionGradients<Scalar>& grads, Workspace& ws) {
  AttentionBackwardArgs<Scalar> args;
  static_cast<AttentionArgs<Scalar>&>(args) = call.args;
  static_cast<AttentionGradients<Scalar>&>(args) = grads;
  const Index batch = call.batch(), heads = call.heads(), tq = call.queries();
  const Index kv_heads = call.kv_heads(), group = heads / kv_heads, tk = call.keys();
  const Index d = call.head_dim(), dv = call.value_dim();
  const Index q_tiles = (tq + kQueryBlock - 1) / kQueryBlock;
  const Index k_tiles = (tk + kKeyBlock - 1) / kKeyBlock;
  const bool materialize = call.materialize;
  // 1. The tasks of each phase, and each thread's scratch.
  const Index key_tasks = materialize ? batch * kv_heads : batch * kv_heads * k_tiles;
  const Index query_tasks = materialize ? 0 : batch * heads * q_tiles;
  const Index scratch =
      materialize ? materialized_backward_scratch_size(tq, d, dv, tk, args.softcap != Scalar(0))
                  : stream_backward_scratch_size(d, dv);
  // The sink gradient's shares: one per (b, h, query tile) (materialised: per (b, h)).
  const Index sink_tiles = materialize ? 1 : q_tiles;
  const bool sink_grad = args.sinks != nullptr && grads.grad_sinks.data() != nullptr;
  if (sink_grad) {
    const Index n = batch * heads * sink_tiles;
    args.sink_partials = workspace_get<Scalar>(ws, WorkspaceSlot::kKernelPartials, n);
    std::fill(args.sink_partials, args.sink_partials + n, Scalar(0));
  }
  const int threads = task_threads(std::max(key_tasks, query_tasks));
  for (int t = 0; t < threads; ++t) workspace_get<Scalar>(ws, WorkspaceSlot::kThread, scratch, t);
  const auto stream = [&](Index b, Index h) {
    return make_dropout_stream(args.dropout, call.dropout_seed, call.dropout_call, b, h);
  };
  // 2. dK and dV (materialised: everything) per key/value head, then dQ per query tile.
  with_kernels(kernel_isa(), [&](auto set) {
    const auto keys = [&](Index task, int thread) {
      Scalar* buffer = workspace_peek<Scalar>(ws, WorkspaceSlot::kThread, thread);
      const Index tile = materialize ? 0 : task % k_tiles;
      const Index bh = materialize ? task : task / k_tiles, b = bh / kv_heads;
      const Index kvh = bh % kv_heads;
      const Index j0 = tile * kKeyBlock, j1 = std::min(tk, j0 + kKeyBlock);
      const BackwardTask kind = materialize ? BackwardTask::kMaterialized : BackwardTask::kKeys;
      for (Index h = kvh * group; h < (kvh + 1) * group; ++h) {
        set.attention_backward_task(args, call.head_mask(b, h), stream(b, h), kind, b, h, j0, j1,
                                    buffer);
      }
    };
    const auto queries = [&](Index task, int thread) {
      Scalar* buffer = workspace_peek<Scalar>(ws, WorkspaceSlot::kThread, thread);
      const Index tile = task % q_tiles, bh = task / q_tiles, b = bh / heads, h = bh % heads;
      const Index i0 = tile * kQueryBlock, i1 = std::min(tq, i0 + kQueryBlock);
      set.attention_backward_task(args, call.head_mask(b, h), stream(b, h), BackwardTask::kQueries,
                                  b, h, i0, i1, buffer);
    };
    run_tasks(threads, key_tasks, keys, query_tasks, queries);
  });
  // 3. dL/dsink_h: the shares summed in (batch, tile) order.
  if (sink_grad) {
    for (Index h = 0; h < heads; ++h) {
      Scalar total = 0;
      for (Index b = 0; b < batch; ++b) {
        const Scalar* share = args.sink_partials + (b * heads + h) * sink_tiles;
        for (Index t = 0; t < sink_tiles; ++t) total += share[t];
      }
      grads.grad_sinks(h) += total;
    }
  }
}

}  // namespace detail
ATTN_NAMESPACE_END
