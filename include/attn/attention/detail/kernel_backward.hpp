// SPDX-License-Identifier: MIT
// attn/attention/detail/kernel_backward.hpp: the attention backward's driver: the tasks of
// each path and the parallel loops over them, each task run by the active kernel set
// (attn/kernels/generic/attention_backward.inl).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "attn/attention/detail/kernel.hpp"
#include "attn/config.hpp"
#include "attn/detail/dropout_hash.hpp"
#include "attn/kernels/dispatch.hpp"
#include "attn/kernels/types.hpp"
#include "attn/nn/mask.hpp"
#include "attn/parallel.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// One backward call, resolved: the operands, the mask (plus a module's own causal bound)
/// and the dropout stream's seed and call, as the forward had them.
template <class Scalar>
struct BackwardParams {
  AttentionBackwardArgs<Scalar> args;
  const AttentionMask<Scalar>* mask = nullptr;
  bool module_causal = false;
  CausalAlignment module_alignment = CausalAlignment::kSquare;
  Index module_window = 0;  // a module's own sliding window (0: none)
  std::uint64_t dropout_seed = 0, dropout_call = 0;
};

/// Runs `tasks` tasks, fn(task, thread scratch), over the threads: each writes rows no other
/// task writes, in a fixed order, so the result does not depend on the thread count.
template <class Scalar, class Fn>
void run_backward_tasks(Index tasks, Workspace& ws, Fn&& fn) {
  const int threads = static_cast<int>(std::min<Index>(num_threads(), tasks));
#if ATTN_HAS_OPENMP
  if (threads > 1) {
#pragma omp parallel num_threads(threads)
    {
      Scalar* buffer = workspace_peek<Scalar>(ws, WorkspaceSlot::kThread, thread_id());
#pragma omp for schedule(dynamic, 1)
      for (Index task = 0; task < tasks; ++task) fn(task, buffer);
    }
    return;
  }
#endif
  (void)threads;
  Scalar* buffer = workspace_peek<Scalar>(ws, WorkspaceSlot::kThread);
  for (Index task = 0; task < tasks; ++task) fn(task, buffer);
}

/// The backward of one attention call.
/// - streaming: first one task per (batch, head, key tile of kKeyBlock) computes dK and dV
///   of its keys over the query tiles that see them (causal: from the diagonal on), then
///   one task per (batch, head, query tile of kQueryBlock) computes dQ over the key tiles
///   its queries see (causal: up to the diagonal). Both recompute P = exp(S - lse) by
///   tiles: O(T (d + d_v)) memory, no atomics, each gradient row owned by one task.
/// - materialised: one task per (batch, head), whole (T_q, T_k) score rows.
/// Grouped-query attention (H_kv < H): a task that writes dK and dV (a key tile, or a whole
/// head materialised) covers one key/value head and runs the group's query heads one after
/// the other, in head order, each adding its share: every gradient row still has one owner.
template <class Scalar>
void run_attention_backward(const BackwardParams<Scalar>& p, bool materialize, Workspace& ws) {
  const AttentionBackwardArgs<Scalar>& args = p.args;
  const Index batch = args.q.extent(0), heads = args.q.extent(1), tq = args.q.extent(2);
  const Index kv_heads = args.k.extent(1), group = heads / kv_heads;
  const Index tk = args.k.extent(2), d = args.q.extent(3), dv = args.v.extent(3);
  const Index q_tiles = (tq + kQueryBlock - 1) / kQueryBlock;
  const Index k_tiles = (tk + kKeyBlock - 1) / kKeyBlock;
  const Index scratch = materialize ? materialized_backward_scratch_size(tq, d, dv, tk)
                                    : stream_backward_scratch_size(d, dv);
  const Index most = materialize ? batch * heads : batch * heads * std::max(q_tiles, k_tiles);
  const int threads = static_cast<int>(std::min<Index>(num_threads(), most));
  for (int t = 0; t < threads; ++t) workspace_get<Scalar>(ws, WorkspaceSlot::kThread, scratch, t);
  KernelParams<Scalar> masks;  // what resolve_mask() reads: the forward's masks and shapes
  masks.q = args.q, masks.k = args.k, masks.mask = p.mask;
  masks.module_causal = p.module_causal, masks.module_alignment = p.module_alignment;
  masks.module_window = p.module_window;
  const auto head = [&](Index b, Index h) { return resolve_mask(masks, b, h); };
  const auto stream = [&](Index b, Index h) {
    return make_dropout_stream(args.dropout, p.dropout_seed, p.dropout_call, b, h);
  };
  with_kernels(kernel_isa(), [&](auto set) {
    if (materialize) {
      run_backward_tasks<Scalar>(batch * kv_heads, ws, [&](Index task, Scalar* buffer) {
        const Index b = task / kv_heads, kvh = task % kv_heads;
        for (Index h = kvh * group; h < (kvh + 1) * group; ++h) {
          set.attention_backward_task(args, head(b, h), stream(b, h), BackwardTask::kMaterialized,
                                      b, h, 0, 0, buffer);
        }
      });
      return;
    }
    run_backward_tasks<Scalar>(batch * kv_heads * k_tiles, ws, [&](Index task, Scalar* buffer) {
      const Index tile = task % k_tiles, bh = task / k_tiles, b = bh / kv_heads;
      const Index kvh = bh % kv_heads;
      const Index j0 = tile * kKeyBlock, j1 = std::min(tk, j0 + kKeyBlock);
      for (Index h = kvh * group; h < (kvh + 1) * group; ++h) {
        set.attention_backward_task(args, head(b, h), stream(b, h), BackwardTask::kKeys, b, h, j0,
                                    j1, buffer);
      }
    });
    run_backward_tasks<Scalar>(batch * heads * q_tiles, ws, [&](Index task, Scalar* buffer) {
      const Index tile = task % q_tiles, bh = task / q_tiles, b = bh / heads, h = bh % heads;
      const Index i0 = tile * kQueryBlock, i1 = std::min(tq, i0 + kQueryBlock);
      set.attention_backward_task(args, head(b, h), stream(b, h), BackwardTask::kQueries, b, h, i0,
                                  i1, buffer);
    });
  });
}

}  // namespace detail
ATTN_NAMESPACE_END
