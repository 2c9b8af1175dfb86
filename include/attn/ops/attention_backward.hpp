// SPDX-License-Identifier: MIT
// attn/ops/attention_backward.hpp: the attention backward's plan and driver: the tasks of
// each path, run on the one task runner, each by the active kernel set
// (attn/kernels/generic/attention_backward.inl).
// Glossary: B = batch, H = heads, H_kv = key/value heads, T_q / T_k = query / key tokens,
// d = head dim, d_v = value head dim.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "attn/config.hpp"
#include "attn/detail/dropout_hash.hpp"
#include "attn/kernels/attention_args.hpp"
#include "attn/kernels/dispatch.hpp"
#include "attn/ops/attention.hpp"
#include "attn/ops/attention_call.hpp"
#include "attn/parallel.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// The tasks of one backward call and where they start among a run's (see
/// run_attention_backward()).
template <class Scalar>
struct BackwardRun {
  AttentionBackwardArgs<Scalar> args;
  Index q_tiles = 0, k_tiles = 0, key_tasks = 0, query_tasks = 0, sink_tiles = 1;
  Index first_key = 0, first_query = 0;
  bool clean = false;  // K holds a NaN or an infinity (args.clean_k: K without them)
};

/// Whether the streaming tasks of `args` (the call's, with its `narrow` operands) take
/// bfloat16 products on the active kernel set: then they read q, k, v and out only through
/// args.narrow (BackwardNarrow), and a NaN or an infinity in K is cleared in the tasks' own
/// k-pairs (no clean_k copy).
template <class Scalar>
bool backward_pairs_taken(const AttentionBackwardArgs<Scalar>& args, bool materialize) {
  if (materialize || args.narrow.q.data() == nullptr || args.narrow.k.data() == nullptr ||
      args.narrow.v.data() == nullptr || args.narrow.out.data() == nullptr) {
    return false;
  }
  return with_kernels(kernel_isa(), [&](auto set) { return set.backward_pairs_active(args); });
}

/// Whether run_attention_backward(call, grads, ws, &narrow) reads the forward's Q, K, V and
/// O only in `narrow` (bfloat16): a caller that holds them in bfloat16 need not widen them
/// into call's float q, k, v and out (which keep their shapes, for the checks, but are not
/// read).
template <class Scalar>
bool backward_reads_narrow(const AttentionCall<Scalar>& call, const BackwardNarrow& narrow) {
  AttentionBackwardArgs<Scalar> args;
  static_cast<AttentionArgs<Scalar>&>(args) = call.args;
  args.narrow = narrow;
  return backward_pairs_taken(args, call.materialize);
}

/// Whether k holds a NaN or an infinity: one read of its rows, on the bits (every exponent
/// bit set), 16 contiguous elements at a time with no branch inside, which compilers vectorise
/// at -O2 for the baseline instruction set. Measured (B 8, H 8, T 512, d 64 floats, one thread,
/// CPU time): 0.55 ms against 1.2-1.7 ms for a running maximum of the magnitudes, about 0.5 %
/// of the causal backward it precedes.
template <class Scalar>
bool has_nonfinite(const TensorView<const Scalar, 4>& k) noexcept {
  using Bits = std::conditional_t<sizeof(Scalar) == 8, std::uint64_t, std::uint32_t>;
  constexpr bool kIeee =
      std::numeric_limits<Scalar>::is_iec559 && (sizeof(Scalar) == 4 || sizeof(Scalar) == 8);
  constexpr Bits kExponent = sizeof(Scalar) == 8 ? Bits(0x7ff0000000000000ull) : Bits(0x7f800000u);
  constexpr Index kChunk = 16;
  const Index d = k.extent(3), ce = k.stride(3);
  for (Index b = 0; b < k.extent(0); ++b) {
    for (Index h = 0; h < k.extent(1); ++h) {
      for (Index j = 0; j < k.extent(2); ++j) {
        const Scalar* row = k.data() + b * k.stride(0) + h * k.stride(1) + j * k.stride(2);
        if constexpr (kIeee) {
          Index e = 0;
          for (; ce == 1 && e + kChunk <= d; e += kChunk) {
            Bits x[kChunk];
            std::memcpy(x, row + e, sizeof x);
            Bits any = 0;
            for (Index i = 0; i < kChunk; ++i) any |= Bits((x[i] & kExponent) == kExponent);
            if (any != 0) return true;
          }
          for (; e < d; ++e) {
            Bits x;
            std::memcpy(&x, row + e * ce, sizeof(Bits));
            if ((x & kExponent) == kExponent) return true;
          }
        } else {
          for (Index e = 0; e < d; ++e) {
            if (!std::isfinite(row[e * ce])) return true;
          }
        }
      }
    }
  }
  return false;
}

/// The backward of `count` attention calls `calls` (each the forward's, with its output in
/// args.out and its logsumexp in args.lse, both read only), adding into the gradients of
/// `grads` (one per call), in one parallel region: every call's key tasks, then every
/// call's query tasks, handed out together (the short calls of a packed batch share the
/// threads). Each call's tasks are exactly those it runs alone.
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
/// With sinks and grad_sinks: each dQ task (materialised: each head) writes its rows' share
/// of dL/dsink_h into a buffer, summed per head in (batch, tile) order at the end, call
/// after call, each call's sum added on its own (as the call alone adds it).
/// A call whose K holds a NaN or an infinity gets a copy with those values +0 for its dQ
/// products (AttentionBackwardArgs::clean_k), in the same buffer after the shares: the
/// products cover keys a query cannot see (dS = 0 there), and what a query cannot see never
/// affects it. A query that sees such a key has dS NaN there already. Finite K: one read.
/// `narrow`, when not null, gives each call's q, k and v in bfloat16 (BackwardNarrow).
template <class Scalar>
void run_attention_backward(const AttentionCall<Scalar>* calls,
                            const AttentionGradients<Scalar>* grads, Index count, Workspace& ws,
                            const BackwardNarrow* narrow = nullptr) {
  if (count <= 0) return;
  BackwardRun<Scalar> one;
  BackwardRun<Scalar>* runs = &one;
  if (count > 1) runs = workspace_objects<BackwardRun<Scalar>>(ws, WorkspaceSlot::kRunTable, count);
  // 1. The tasks of each phase, each thread's scratch and the sink gradient's shares: one
  //    per (b, h, query tile) (materialised: per (b, h)).
  Index key_tasks = 0, query_tasks = 0, scratch = 0, shares = 0, cleaned = 0;
  for (Index c = 0; c < count; ++c) {
    const AttentionCall<Scalar>& call = calls[c];
    BackwardRun<Scalar>& r = runs[c];
    static_cast<AttentionArgs<Scalar>&>(r.args) = call.args;
    static_cast<AttentionGradients<Scalar>&>(r.args) = grads[c];
    if (narrow != nullptr) r.args.narrow = narrow[c];
    const Index batch = call.batch(), heads = call.heads(), tq = call.queries();
    const Index kv_heads = call.kv_heads(), tk = call.keys();
    const Index d = call.head_dim(), dv = call.value_dim();
    r.q_tiles = (tq + kQueryBlock - 1) / kQueryBlock;
    r.k_tiles = (tk + kKeyBlock - 1) / kKeyBlock;
    r.key_tasks = call.materialize ? batch * kv_heads : batch * kv_heads * r.k_tiles;
    r.query_tasks = call.materialize ? 0 : batch * heads * r.q_tiles;
    r.first_key = key_tasks, r.first_query = query_tasks;
    key_tasks += r.key_tasks, query_tasks += r.query_tasks;
    scratch = std::max(
        scratch,
        call.materialize
            ? materialized_backward_scratch_size(tq, d, dv, tk, r.args.softcap != Scalar(0))
            : stream_backward_scratch_size(d, dv) +
                  (r.args.path != Bf16Path::kWiden ? pair_backward_scratch_size(d, dv) : 0));
    r.sink_tiles = call.materialize ? 1 : r.q_tiles;
    if (r.args.sinks != nullptr && grads[c].grad_sinks.data() != nullptr) {
      shares += batch * heads * r.sink_tiles;
    }
    r.clean = !backward_pairs_taken(r.args, call.materialize) && has_nonfinite(call.args.k);
    if (r.clean) cleaned += batch * kv_heads * tk * d;
  }
  Scalar* share = shares + cleaned > 0
                      ? workspace_get<Scalar>(ws, WorkspaceSlot::kKernelPartials, shares + cleaned)
                      : nullptr;
  Scalar* clean = share + shares;
  if (share != nullptr) std::fill(share, share + shares, Scalar(0));
  for (Index c = 0; c < count && share != nullptr; ++c) {
    BackwardRun<Scalar>& r = runs[c];
    if (r.clean) {  // K's rows, non-finite values +0
      const TensorView<const Scalar, 4>& k = calls[c].args.k;
      r.args.clean_k = clean;
      for (Index b = 0; b < k.extent(0); ++b) {
        for (Index h = 0; h < k.extent(1); ++h) {
          for (Index j = 0; j < k.extent(2); ++j) {
            const Scalar* row = k.data() + b * k.stride(0) + h * k.stride(1) + j * k.stride(2);
            for (Index e = 0; e < k.extent(3); ++e, ++clean) {
              const Scalar x = row[e * k.stride(3)];
              *clean = std::isfinite(x) ? x : Scalar(0);
            }
          }
        }
      }
    }
    if (r.args.sinks == nullptr || grads[c].grad_sinks.data() == nullptr) continue;
    r.args.sink_partials = share;
    share += calls[c].batch() * calls[c].heads() * r.sink_tiles;
  }
  const int threads = task_threads(std::max(key_tasks, query_tasks));
  for (int t = 0; t < threads; ++t) workspace_get<Scalar>(ws, WorkspaceSlot::kThread, scratch, t);
  // The call a task of a phase belongs to (every call has tasks of both phases, or, all
  // materialised, none of the second).
  const auto call_of = [&](Index task, bool keys) {
    if (count == 1) return Index(0);
    const BackwardRun<Scalar>* it =
        std::upper_bound(runs, runs + count, task, [keys](Index t, const BackwardRun<Scalar>& r) {
          return t < (keys ? r.first_key : r.first_query);
        });
    return static_cast<Index>(it - runs) - 1;
  };
  // 2. dK and dV (materialised: everything) per key/value head, then dQ per query tile.
  with_kernels(kernel_isa(), [&](auto set) {
    const auto keys = [&](Index global, int thread) {
      const Index c = call_of(global, true);
      const AttentionCall<Scalar>& call = calls[c];
      const BackwardRun<Scalar>& r = runs[c];
      const Index task = global - r.first_key, kv_heads = call.kv_heads();
      const Index group = call.heads() / kv_heads;
      Scalar* buffer = workspace_peek<Scalar>(ws, WorkspaceSlot::kThread, thread);
      const Index tile = call.materialize ? 0 : task % r.k_tiles;
      const Index bh = call.materialize ? task : task / r.k_tiles, b = bh / kv_heads;
      const Index kvh = bh % kv_heads;
      const Index j0 = tile * kKeyBlock, j1 = std::min(call.keys(), j0 + kKeyBlock);
      const BackwardTask kind =
          call.materialize ? BackwardTask::kMaterialized : BackwardTask::kKeys;
      for (Index h = kvh * group; h < (kvh + 1) * group; ++h) {
        set.attention_backward_task(r.args, call.head_mask(b, h), call_dropout(call, b, h), kind, b,
                                    h, j0, j1, buffer);
      }
    };
    const auto queries = [&](Index global, int thread) {
      const Index c = call_of(global, false);
      const AttentionCall<Scalar>& call = calls[c];
      const BackwardRun<Scalar>& r = runs[c];
      const Index task = global - r.first_query;
      Scalar* buffer = workspace_peek<Scalar>(ws, WorkspaceSlot::kThread, thread);
      const Index tile = task % r.q_tiles, bh = task / r.q_tiles;
      const Index b = bh / call.heads(), h = bh % call.heads();
      const Index i0 = tile * kQueryBlock, i1 = std::min(call.queries(), i0 + kQueryBlock);
      set.attention_backward_task(r.args, call.head_mask(b, h), call_dropout(call, b, h),
                                  BackwardTask::kQueries, b, h, i0, i1, buffer);
    };
    run_tasks(threads, key_tasks, keys, query_tasks, queries);
  });
  // 3. dL/dsink_h: each call's shares summed in (batch, tile) order, then added.
  for (Index c = 0; c < count; ++c) {
    const BackwardRun<Scalar>& r = runs[c];
    if (r.args.sink_partials == nullptr) continue;
    const Index batch = calls[c].batch(), heads = calls[c].heads();
    for (Index h = 0; h < heads; ++h) {
      Scalar total = 0;
      for (Index b = 0; b < batch; ++b) {
        const Scalar* part = r.args.sink_partials + (b * heads + h) * r.sink_tiles;
        for (Index t = 0; t < r.sink_tiles; ++t) total += part[t];
      }
      grads[c].grad_sinks(h) += total;
    }
  }
}

/// The backward of one attention call (see the run of several above).
template <class Scalar>
void run_attention_backward(const AttentionCall<Scalar>& call,
                            const AttentionGradients<Scalar>& grads, Workspace& ws,
                            const BackwardNarrow* narrow = nullptr) {
  run_attention_backward(&call, &grads, 1, ws, narrow);
}

}  // namespace detail
ATTN_NAMESPACE_END
