// SPDX-License-Identifier: MIT
// attn/attention/detail/kernel.hpp: the attention kernel's driver: each (batch, head)'s mask
// and dropout stream, the head-major K/V copy, and the parallel loop over (batch, head, query
// tile) tasks, each run by the active kernel set (attn/kernels/generic/attention.inl holds
// both paths).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "attn/config.hpp"
#include "attn/detail/dropout_hash.hpp"
#include "attn/kernels/dispatch.hpp"
#include "attn/kernels/types.hpp"
#include "attn/nn/mask.hpp"
#include "attn/parallel.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

template <class Scalar>
struct KernelParams {
  TensorView<const Scalar, 4> q, k, v;  // k, v: H_kv heads, H_kv dividing q's H
  TensorView<Scalar, 4> out, weights;
  TensorView<Scalar, 3> lse;  // optional: each query's logsumexp (the backward's input)
  const AttentionMask<Scalar>* mask = nullptr;
  bool module_causal = false;  // a module's own causal flag, combined with `mask`
  CausalAlignment module_alignment = CausalAlignment::kSquare;
  Index module_window = 0;           // a module's own sliding window (0: none)
  Index ring = 0;                    // keys in a ring of this many rows (see AttentionArgs)
  const Index* key_first = nullptr;  // per item: keys before it are gone (a ring), or null
  Scalar scale = 1;
  double dropout = 0.0;
  std::uint64_t dropout_seed = 0, dropout_call = 0;
};

/// Head (b, h)'s mask: loop bounds (key lengths, causal diagonal, sliding window) and
/// pointers to the element-wise parts. The bounds do not depend on h.
template <class Scalar>
HeadMask<Scalar> resolve_mask(const KernelParams<Scalar>& p, Index b, Index h) {
  const AttentionMask<Scalar>& mask = *p.mask;
  const Index tq = p.q.extent(2), tk = p.k.extent(2);
  HeadMask<Scalar> m;
  m.key_limit = mask.has_key_lengths() ? mask.key_lengths_view()(b) : tk;
  if (p.key_first != nullptr) m.key_first = p.key_first[b];
  const auto offset = [&](CausalAlignment a) {
    if (a == CausalAlignment::kBottomRight) return tk - tq;
    return a == CausalAlignment::kBottomRightPerItem ? m.key_limit - tq : Index{0};
  };
  if (mask.is_causal() || p.module_causal) {
    m.causal = true;
    m.causal_offset = std::numeric_limits<Index>::max() / 2;
    if (mask.is_causal()) m.causal_offset = std::min(m.causal_offset, offset(mask.alignment()));
    if (p.module_causal) m.causal_offset = std::min(m.causal_offset, offset(p.module_alignment));
    for (const Index w : {mask.window(), p.module_window}) {
      if (w > 0) m.window = m.window > 0 ? std::min(m.window, w) : w;
    }
  }
  if (const auto& bm = mask.bool_mask(); bm.data() != nullptr) {
    m.bool_row0 = bm.data() + (bm.extent(0) == 1 ? 0 : b * bm.stride(0)) +
                  (bm.extent(1) == 1 ? 0 : h * bm.stride(1));
    m.bool_rs = bm.stride(2);
    m.bool_cs = bm.stride(3);
    m.bool_allows = mask.bool_allows();
  }
  if (mask.has_key_padding()) {
    const auto& pm = mask.padding_mask();
    m.pad = pm.data() + b * pm.stride(0);
    m.pad_cs = pm.stride(3);
  }
  if (const auto& am = mask.additive_mask(); am.data() != nullptr) {
    m.add_row0 = am.data() + (am.extent(0) == 1 ? 0 : b * am.stride(0)) +
                 (am.extent(1) == 1 ? 0 : h * am.stride(1));
    m.add_rs = am.stride(2);
    m.add_cs = am.stride(3);
  }
  return m;
}

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

/// How one streaming call is cut into tasks (see StreamTask): query tiles of `rows_per_head`
/// rows, `group_heads` heads of a key/value group per task, and, for short queries, the keys
/// in `chunks` chunks of kKeyChunk from chunk `first_chunk` of the logical key index on.
struct StreamPlan {
  Index rows_per_head = 0, tiles = 0, group_heads = 1, head_chunks = 1;
  Index first_chunk = 0, chunks = 1;
  bool split = false;
  Index tasks(Index batch, Index kv_heads) const noexcept {
    return batch * kv_heads * head_chunks * tiles * chunks;
  }
};

template <class Scalar>
StreamPlan plan_streaming(const KernelParams<Scalar>& p) {
  const Index batch = p.q.extent(0), tq = p.q.extent(2), group = p.q.extent(1) / p.k.extent(1);
  StreamPlan plan;
  // A training forward (lse wanted) never splits: a chunk's partial state has no logsumexp
  // of the whole row, and training shapes are long anyway.
  plan.split = tq <= kSplitKeysQueries && p.lse.data() == nullptr;
  plan.rows_per_head = std::min(tq, kQueryBlock);
  plan.tiles = (tq + plan.rows_per_head - 1) / plan.rows_per_head;
  // Short queries stack the group's heads (up to kQueryBlock rows), so each K/V row loaded
  // serves all of them; a full tile of one head already has kQueryBlock rows per K/V tile.
  plan.group_heads = std::min(group, std::max<Index>(1, kQueryBlock / plan.rows_per_head));
  plan.head_chunks = (group + plan.group_heads - 1) / plan.group_heads;
  if (plan.split) {
    // The keys some item's queries see (the bounds are non-decreasing in the query index
    // and the same for every head).
    Index lo = std::numeric_limits<Index>::max(), hi = 0;
    for (Index b = 0; b < batch; ++b) {
      const HeadMask<Scalar> m = resolve_mask(p, b, 0);
      const Index end = m.row_end(tq - 1), begin = m.row_begin(0);
      if (end > begin) lo = std::min(lo, begin), hi = std::max(hi, end);
    }
    if (hi > 0) {
      plan.first_chunk = lo / kKeyChunk;
      plan.chunks = (hi + kKeyChunk - 1) / kKeyChunk - plan.first_chunk;
    }
  }
  return plan;
}

/// Runs one path over every task, in parallel when OpenMP is on: the materialised path per
/// (batch, head, query tile), the streaming path per StreamPlan task. Each output element is
/// written by exactly one task (or merged from its key chunks in chunk order), so results do
/// not depend on the thread count or schedule.
template <class Scalar>
void run_attention(const KernelParams<Scalar>& params, bool materialize, Workspace& ws) {
  KernelParams<Scalar> copied;
  const bool copy_k = !materialize && params.ring == 0 && wants_head_major_copy(params.k);
  const bool copy_v = !materialize && params.ring == 0 && wants_head_major_copy(params.v);
  if (copy_k || copy_v) {
    copied = params;
    const Index k_size = copy_k ? params.k.size() : 0, v_size = copy_v ? params.v.size() : 0;
    Scalar* buffer = workspace_get<Scalar>(ws, WorkspaceSlot::kKernelKeyValue, k_size + v_size);
    // Contiguous (B, H, T, d) copies: each head's rows back to back.
    if (copy_k) {
      const TensorView<Scalar, 4> k(buffer, params.k.shape());
      attn::copy(params.k, k);
      copied.k = k;
    }
    if (copy_v) {
      const TensorView<Scalar, 4> v(buffer + k_size, params.v.shape());
      attn::copy(params.v, v);
      copied.v = v;
    }
  }
  const KernelParams<Scalar>& p = (copy_k || copy_v) ? copied : params;
  AttentionArgs<Scalar> args;
  args.q = p.q, args.k = p.k, args.v = p.v, args.out = p.out, args.weights = p.weights;
  args.lse = p.lse;
  args.scale = p.scale;
  args.dropout = p.dropout;
  args.ring = p.ring;
  const Index batch = p.q.extent(0), heads = p.q.extent(1), tq = p.q.extent(2);
  const Index kv_heads = p.k.extent(1), group = heads / kv_heads;
  const Index tk = p.k.extent(2), dv = p.v.extent(3);
  const auto drop_of = [&](Index b, Index h) {
    return make_dropout_stream(p.dropout, p.dropout_seed, p.dropout_call, b, h);
  };
  const StreamPlan plan = materialize ? StreamPlan{} : plan_streaming(p);
  const Index mtiles = (tq + kQueryBlock - 1) / kQueryBlock;
  const Index tasks = materialize ? batch * heads * mtiles : plan.tasks(batch, kv_heads);
  const Index scratch = materialize ? materialized_scratch_size(p.q.extent(3), dv, tk)
                                    : stream_scratch_size(p.q.extent(3), dv);
  const int threads = static_cast<int>(std::min<Index>(num_threads(), tasks));
  for (int t = 0; t < threads; ++t) workspace_get<Scalar>(ws, WorkspaceSlot::kThread, scratch, t);
  // Split keys: each task's rows leave their partial state here, chunk after chunk.
  const Index row_size = partial_row_size(dv);
  const Index chunk_stride = plan.group_heads * plan.rows_per_head * row_size;
  Scalar* partials =
      plan.split ? workspace_get<Scalar>(ws, WorkspaceSlot::kKernelPartials, tasks * chunk_stride)
                 : nullptr;
  const double keep = 1.0 - (p.dropout > 0.0 ? p.dropout : 0.0);

  with_kernels(kernel_isa(), [&](auto set) {
    // A streaming task, or (c < 0) the task's rows without their key chunk, for the merge.
    const auto stream_task = [&](Index task, Index& c) {
      // task = (((b * H_kv + kv_head) * head_chunks + head chunk) * tiles + tile) * chunks + c
      StreamTask<Scalar> t;
      Index rest = task;
      if (c >= 0) c = rest % plan.chunks, rest /= plan.chunks;
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
    const auto run_task = [&](Index task, Scalar* buffer) {
      if (materialize) {
        const Index tile = task % mtiles, bh = task / mtiles;
        const Index b = bh / heads, h = bh % heads;
        const Index i0 = tile * kQueryBlock, i1 = std::min(tq, i0 + kQueryBlock);
        set.materialized_task(args, resolve_mask(p, b, h), drop_of(b, h), b, h, i0, i1, buffer);
        return;
      }
      Index c = 0;
      StreamTask<Scalar> t = stream_task(task, c);
      if (plan.split) {
        t.j_begin = (plan.first_chunk + c) * kKeyChunk;
        t.j_end = t.j_begin + kKeyChunk;
        t.partial = partials + task * chunk_stride;
      }
      HeadMask<Scalar> masks[kQueryBlock];
      DropoutStream drops[kQueryBlock];
      for (Index g = 0; g < t.heads; ++g) {
        masks[g] = resolve_mask(p, t.b, t.h0 + g);
        drops[g] = drop_of(t.b, t.h0 + g);
      }
      set.streaming_task(args, masks, drops, t, buffer);
    };
    // Combines the key chunks of one split task's rows, in chunk order.
    const auto merge = [&](Index task) {
      Index none = -1;
      const StreamTask<Scalar> t = stream_task(task, none);
      const Index nq = t.i1 - t.i0;
      const Scalar* first = partials + task * plan.chunks * chunk_stride;
      for (Index r = 0; r < t.heads * nq; ++r) {
        set.merge_partials(first + r * row_size, plan.chunks, chunk_stride, dv, keep,
                           &p.out(t.b, t.h0 + r / nq, t.i0 + r % nq, 0));
      }
    };
    const Index merges = plan.split ? tasks / plan.chunks : 0;
#if ATTN_HAS_OPENMP
    if (threads > 1) {
#pragma omp parallel num_threads(threads)
      {
        Scalar* buffer = workspace_peek<Scalar>(ws, WorkspaceSlot::kThread, thread_id());
#pragma omp for schedule(dynamic, 1)
        for (Index task = 0; task < tasks; ++task) run_task(task, buffer);
#pragma omp for schedule(static)
        for (Index task = 0; task < merges; ++task) merge(task);
      }
      return;
    }
#endif
    Scalar* buffer = workspace_peek<Scalar>(ws, WorkspaceSlot::kThread);
    for (Index task = 0; task < tasks; ++task) run_task(task, buffer);
    for (Index task = 0; task < merges; ++task) merge(task);
  });
}

}  // namespace detail
ATTN_NAMESPACE_END
