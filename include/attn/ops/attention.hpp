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
#include <type_traits>

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
#include "attn/types/element.hpp"
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

/// The one place an attention call's path and tasks are chosen. Storage-type operands
/// (Operand bfloat16 or float16) always stream, their keys never split.
template <class Scalar, class Operand>
AttentionPlan plan_attention(const AttentionCall<Scalar, Operand>& call) {
  constexpr bool kReduced = !std::is_same_v<Scalar, Operand>;
  const AttentionArgs<Scalar, Operand>& a = call.args;
  const Index batch = call.batch(), tq = call.queries(), kv_heads = call.kv_heads();
  const Index group = call.heads() / kv_heads, d = call.head_dim(), dv = call.value_dim();
  // Stored rows of storage-type operands are a paged cache's rows of that type.
  ATTN_ASSERT(!kReduced ||
              (a.stored.k.element == KVElement::kScalar && a.stored.k.table != nullptr) ||
              !a.stored.active());
  AttentionPlan plan;
  // 1. The path: materialised when the weights are wanted or asked for; streaming otherwise,
  //    its keys split in chunks for few queries (a decode step). Stored keys and values (a
  //    quantised or paged cache) are only read by the streaming path (their front end never asks
  //    for weights).
  if (call.materialize && !kReduced && !a.stored.active()) {
    plan.route = AttentionRoute::kMaterialized;
    plan.tiles = (tq + kQueryBlock - 1) / kQueryBlock;
    plan.tasks = batch * call.heads() * plan.tiles;
    plan.scratch = materialized_scratch_size(d, dv, call.keys());
    return plan;
  }
  if constexpr (!kReduced) {
    if (splits_keys(call)) plan.route = AttentionRoute::kSplitKeys;
  }
  // 2. Query tiles, and grouped-query heads stacked up to kQueryBlock rows per task (a full
  //    tile of one head already has kQueryBlock rows per K/V tile).
  plan.rows_per_head = std::min(tq, kQueryBlock);
  plan.tiles = (tq + plan.rows_per_head - 1) / plan.rows_per_head;
  plan.group_heads = std::min(group, std::max<Index>(1, kQueryBlock / plan.rows_per_head));
  plan.head_chunks = (group + plan.group_heads - 1) / plan.group_heads;
  // 3. Split keys: the chunks some query sees.
  if constexpr (!kReduced) {
    if (plan.route == AttentionRoute::kSplitKeys) {
      const KeyChunks chunks = key_chunks(call);
      plan.first_chunk = chunks.first;
      plan.chunks = chunks.count;
    }
  }
  plan.tasks = batch * kv_heads * plan.head_chunks * plan.tiles * plan.chunks;
  plan.merges = plan.route == AttentionRoute::kSplitKeys ? plan.tasks / plan.chunks : 0;
  plan.scratch = stream_scratch_size(d, dv) + (kReduced ? reduced_stream_scratch_size(d, dv) : 0);
  if (a.stored.active()) plan.scratch += stored_tile_scratch_size(d, dv);
  // 4. Long, strided K or V (not a ring's, nor stored rows): copied head-major once.
  plan.copy_k = a.ring == 0 && !a.stored.active() && wants_head_major_copy(a.k);
  plan.copy_v = a.ring == 0 && !a.stored.active() && wants_head_major_copy(a.v);
  return plan;
}

/// The path of a bfloat16 call's products: bf16_path(), except that vdpbf16ps (kDot) gives way
/// to widening when a task has from 5 to few query rows (group_heads * rows_per_head, the same
/// for every task of the call: so the choice, and the bits, do not depend on the thread
/// count), when rows (d + 128) < 32 d: below 16 rows at d 128, 11 at d 64. The dot path's score
/// pass runs micro-tiles of kMicroRows keys by 64 query rows whatever the task's rows, so such
/// rows leave most of its vdpbf16ps idle, while widening then takes one dot product per (key,
/// row), about rows (d / 16 + 8) instructions per key against the dot path's d * 2 (perf,
/// bench/decode_timer decode 4 4096 1 --dtype bf16 --bf16-path dot: B 4, H 32, H_kv 8, d 128,
/// L 4096, one thread: that pass 38 % of the samples; the step 47 ms, 27 ms widened, against
/// 34 ms with the projections widened too: docs/benchmarks.md). Tasks of at most 4 rows (a
/// decode step's grouped heads) keep kDot: the kernel then runs vdpbf16ps 4 keys x 4 rows at a
/// time (dot_rows_bf16 in streaming_tile()).
template <class Scalar, class Operand>
Bf16Path attention_bf16_path(const AttentionCall<Scalar, Operand>& call,
                             const AttentionPlan& plan) {
  const Bf16Path path = bf16_path();
  const Index rows = plan.group_heads * plan.rows_per_head, d = call.head_dim();
  if (path == Bf16Path::kDot && rows > 4 && rows * (d + 128) < 32 * d) return Bf16Path::kWiden;
  return path;
}

/// One call of a run: its plan, its operands (K and V possibly copied head-major), and
/// where its tasks, merges and partial states start among the run's.
template <class Scalar, class Operand = Scalar>
struct CallRun {
  AttentionPlan plan;
  AttentionArgs<Scalar, Operand> args;
  Index first_task = 0, first_merge = 0;
  Index partial_size = 0;  ///< split keys: elements of its tasks' partial states
  Scalar* partials = nullptr;
  /// bfloat16 on the k-pair paths: its V tiles' packing jobs among the run's, one per (item,
  /// key/value head), and where they write (args.value_pairs and value_pairs_dirty).
  Index first_pair_job = 0, pair_jobs = 0;
  float* value_pairs = nullptr;
  unsigned char* value_pairs_dirty = nullptr;
};

/// A streaming task's rows, and (c, when not null) its key chunk (see AttentionPlan).
template <class Scalar, class Operand>
StreamTask<Scalar> stream_task(const AttentionCall<Scalar, Operand>& call,
                               const AttentionPlan& plan, Index task, Index* c) {
  const Index kv_heads = call.kv_heads(), group = call.heads() / kv_heads;
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
  t.i1 = std::min(call.queries(), t.i0 + plan.rows_per_head);
  return t;
}

/// The dropout stream of item b, head h of a call (its item offset added to b).
template <class Scalar, class Operand>
DropoutStream call_dropout(const AttentionCall<Scalar, Operand>& call, Index b, Index h) {
  return make_dropout_stream(call.args.dropout, call.dropout_seed, call.dropout_call,
                             b + call.dropout_item, h);
}

/// Task `task` of one call (numbered within the call) on kernel set `set`. Storage-type
/// operands only stream (plan_attention()).
template <class Set, class Scalar, class Operand>
void run_call_task(Set set, const AttentionCall<Scalar, Operand>& call,
                   const CallRun<Scalar, Operand>& run, Index task, Scalar* scratch) {
  constexpr bool kReduced = !std::is_same_v<Scalar, Operand>;
  const AttentionPlan& plan = run.plan;
  if constexpr (!kReduced) {
    if (plan.route == AttentionRoute::kMaterialized) {
      const Index tile = task % plan.tiles, bh = task / plan.tiles;
      const Index b = bh / call.heads(), h = bh % call.heads();
      const Index i0 = tile * kQueryBlock, i1 = std::min(call.queries(), i0 + kQueryBlock);
      set.materialized_task(run.args, call.head_mask(b, h), call_dropout(call, b, h), b, h, i0, i1,
                            scratch);
      return;
    }
  }
  // Split keys over a paged cache: the tasks run item by item within each (head, chunk)
  // (task numbers, and so the partial states and their merge, unchanged: the same bits).
  // Sequences decoded side by side interleave their blocks, and the hardware prefetcher
  // brings in the blocks after a task's, the next items' rows of the same head: they are
  // then read from the cache. (8 sequences in interleaved 16-token blocks, contiguous /
  // paged CPU time of the decode attention: int4 0.46-0.62 to 0.76-0.79, int8 0.62-0.74 to
  // 0.92-0.99, f32 0.82-0.92 to 0.97-0.99.)
  if (plan.route == AttentionRoute::kSplitKeys && run.args.stored.k.table != nullptr) {
    const Index batch = call.batch(), per_item = plan.tasks / batch;
    task = task % batch * per_item + task / batch;
  }
  Index c = 0;
  StreamTask<Scalar> t = stream_task(call, plan, task, &c);
  if (plan.route == AttentionRoute::kSplitKeys) {
    t.j_begin = (plan.first_chunk + c) * kKeyChunk;
    t.j_end = t.j_begin + kKeyChunk;
    t.partial = run.partials +
                task * plan.group_heads * plan.rows_per_head * partial_row_size(call.value_dim());
  }
  HeadMask<Scalar> masks[kQueryBlock];
  DropoutStream drops[kQueryBlock];
  for (Index g = 0; g < t.heads; ++g) {
    masks[g] = call.head_mask(t.b, t.h0 + g);
    drops[g] = call_dropout(call, t.b, t.h0 + g);
  }
  set.streaming_task(run.args, masks, drops, t, scratch);
}

/// Merge `task` of one split-keys call: combines the key chunks of one task's rows, in
/// chunk order. Storage-type operands never split (plan_attention()).
template <class Set, class Scalar, class Operand>
void merge_call_task(Set set, const AttentionCall<Scalar, Operand>& call,
                     const CallRun<Scalar, Operand>& run, Index task) {
  if constexpr (std::is_same_v<Scalar, Operand>) {
    const AttentionPlan& plan = run.plan;
    const AttentionArgs<Scalar>& args = run.args;
    const Index dv = call.value_dim(), row_size = partial_row_size(dv);
    const Index chunk_stride = plan.group_heads * plan.rows_per_head * row_size;
    const double keep = 1.0 - (args.dropout > 0.0 ? args.dropout : 0.0);
    const StreamTask<Scalar> t = stream_task(call, plan, task, nullptr);
    const Index nq = t.i1 - t.i0;
    const Scalar* first = run.partials + task * plan.chunks * chunk_stride;
    for (Index r = 0; r < t.heads * nq; ++r) {
      const Index h = t.h0 + r / nq;
      const Scalar sink =
          args.sinks != nullptr ? args.sinks[h] : -std::numeric_limits<Scalar>::infinity();
      set.merge_partials(first + r * row_size, plan.chunks, chunk_stride, dv, keep,
                         &args.out(t.b, h, t.i0 + r % nq, 0), sink);
    }
  } else {
    static_cast<void>(set), static_cast<void>(call), static_cast<void>(run);
    static_cast<void>(task);
  }
}

/// Runs `count` attention calls (see plan_attention()) in one parallel region: every call's
/// tasks, then every call's split-keys merges, handed out together, so that the short calls
/// of a packed batch (one per sequence) share the threads instead of each forking its own.
/// Each call's tasks are exactly those it runs alone: each output element is written by
/// exactly one task, or merged from its key chunks in chunk order, so results do not depend
/// on the thread count, the schedule or the other calls. `ws` holds the threads' scratch,
/// the head-major K/V copies and the split-keys partial states: nothing is allocated once it
/// has served a run as large (a run of several calls keeps its table of them there too).
template <class Scalar, class Operand>
void run_attention(const AttentionCall<Scalar, Operand>* calls, Index count, Workspace& ws) {
  using Run = CallRun<Scalar, Operand>;
  if (count <= 0) return;
  Run one;
  Run* runs = &one;
  if (count > 1) runs = workspace_objects<Run>(ws, WorkspaceSlot::kRunTable, count);
  // 1. The plans; the tasks, merges, scratch and buffers of all calls.
  Index tasks = 0, merges = 0, scratch = 0, copies = 0, partial_size = 0;
  for (Index c = 0; c < count; ++c) {
    Run& r = runs[c];
    r.plan = plan_attention(calls[c]);
    r.args = calls[c].args;
    if constexpr (std::is_same_v<Operand, bfloat16>) {
      r.args.path = attention_bf16_path(calls[c], r.plan);
    }
    r.first_task = tasks, r.first_merge = merges;
    tasks += r.plan.tasks, merges += r.plan.merges;
    scratch = std::max(scratch, r.plan.scratch);
    copies += (r.plan.copy_k ? r.args.k.size() : 0) + (r.plan.copy_v ? r.args.v.size() : 0);
    if (r.plan.merges > 0) {
      r.partial_size = r.plan.tasks * r.plan.group_heads * r.plan.rows_per_head *
                       partial_row_size(calls[c].value_dim());
    }
    partial_size += r.partial_size;
  }
  // 2. K, V copied head-major (B, H_kv, T_k, d): each head's rows back to back. When several
  //    tasks read each (item, key/value head) of V in place (not a ring's, not a paged cache's
  //    rows), V's whole key tiles are prepared once, by value_pairs_task() in a first parallel
  //    phase (step 4), instead of once per task, after the copies in the same buffer: bfloat16
  //    on the k-pair paths (AMX, vdpbf16ps: the avx512 set) packed as k-pairs (the same words:
  //    the same bits), then one flag byte per tile saying whether it holds a NaN or an
  //    infinity; float and double operands the flags alone (each streaming task scanned each
  //    tile it read for them: 3.3 % of a causal MultiHeadAttention forward at T 4096, D 768,
  //    H 12 on AVX2, 6 % of its attention; the flags take 0.2 %).
  // (Words of one packed tile of d_v columns: none for the flags alone.)
  const auto tile_words = [](Index dv) {
    return std::is_same_v<Operand, bfloat16> ? (kKeyBlock / 2) * dv : Index(0);
  };
  Index pair_jobs = 0, words = 0, flags = 0;
  for (Index c = 0; c < count; ++c) {
    Run& r = runs[c];
    const TensorView<const Operand, 4>& v = r.args.v;
    r.first_pair_job = pair_jobs;
    bool prepared = std::is_same_v<Operand, Scalar> && r.plan.route == AttentionRoute::kStreaming;
    if constexpr (std::is_same_v<Operand, bfloat16>) {
      // (kDot with at most 4 rows reads V's rows as they are: dot_rows_bf16.)
      prepared = r.args.path != Bf16Path::kWiden && kernel_isa() == Isa::kAvx512 &&
                 !(r.args.path == Bf16Path::kDot && r.plan.group_heads * r.plan.rows_per_head <= 4);
    }
    if (!prepared || r.args.ring != 0 || r.args.stored.active() ||
        r.plan.tiles * r.plan.head_chunks < 2 || v.extent(2) < kKeyBlock) {
      continue;
    }
    r.pair_jobs = v.extent(0) * v.extent(1);
    pair_jobs += r.pair_jobs;
    words += r.pair_jobs * (v.extent(2) / kKeyBlock) * tile_words(v.extent(3));
    flags += r.pair_jobs * (v.extent(2) / kKeyBlock);
  }
  const Index pairs_start = (copies + 31) / 32 * 32;
  Operand* buffer =
      copies > 0 || pair_jobs > 0
          ? workspace_get<Operand>(ws, WorkspaceSlot::kKernelKeyValue,
                                   pair_jobs > 0 ? pairs_start + 2 * words + flags : copies)
          : nullptr;
  Operand* const buffer_start = buffer;
  for (Index c = 0; c < count && copies > 0; ++c) {
    AttentionArgs<Scalar, Operand>& args = runs[c].args;
    if (runs[c].plan.copy_k) {
      const TensorView<Operand, 4> k(buffer, args.k.shape());
      attn::copy(args.k, k);
      args.k = k;
      buffer += k.size();
    }
    if (runs[c].plan.copy_v) {
      const TensorView<Operand, 4> v(buffer, args.v.shape());
      attn::copy(args.v, v);
      args.v = v;
      buffer += v.size();
    }
  }
  if (pair_jobs > 0) {
    auto* pairs = reinterpret_cast<float*>(buffer_start + pairs_start);
    auto* dirty = reinterpret_cast<unsigned char*>(pairs + words);
    for (Index c = 0; c < count; ++c) {
      Run& r = runs[c];
      if (r.pair_jobs == 0) continue;
      const Index tiles = r.args.v.extent(2) / kKeyBlock;
      r.value_pairs = pairs, r.value_pairs_dirty = dirty;
      r.args.value_pairs = pairs, r.args.value_pairs_dirty = dirty;
      r.args.value_tiles_per_head = tiles;
      pairs += r.pair_jobs * tiles * tile_words(r.args.v.extent(3));
      dirty += r.pair_jobs * tiles;
    }
  }
  // 3. Scratch: one buffer per thread; split keys: each task's rows' partial states (partial
  //    row size each), chunk after chunk.
  const int threads = task_threads(tasks);
  for (int t = 0; t < threads; ++t) workspace_get<Scalar>(ws, WorkspaceSlot::kThread, scratch, t);
  Scalar* partials = partial_size > 0
                         ? workspace_get<Scalar>(ws, WorkspaceSlot::kKernelPartials, partial_size)
                         : nullptr;
  for (Index c = 0; c < count && partials != nullptr; ++c) {
    runs[c].partials = runs[c].partial_size > 0 ? partials : nullptr;
    partials += runs[c].partial_size;
  }
  // The call a task (or merge) of the run belongs to.
  const auto call_of = [&](Index task, bool merge) {
    if (count == 1) return Index(0);
    const auto first = [merge](const Run& r) { return merge ? r.first_merge : r.first_task; };
    const Run* it = std::upper_bound(runs, runs + count, task,
                                     [&](Index t, const Run& r) { return t < first(r); });
    // Calls without merges share their first merge with the next: the last one holds it.
    return static_cast<Index>(it - runs) - 1;
  };
  // 4. The tasks, then (split keys) the merges, in one parallel region; before them, V's
  //    tiles packed as k-pairs (step 2), in one of their own.
  with_kernels(kernel_isa(), [&](auto set) {
    const auto run_task = [&](Index task, int thread) {
      const Index c = call_of(task, false);
      run_call_task(set, calls[c], runs[c], task - runs[c].first_task,
                    workspace_peek<Scalar>(ws, WorkspaceSlot::kThread, thread));
    };
    const auto merge = [&](Index task, int) {
      const Index c = call_of(task, true);
      merge_call_task(set, calls[c], runs[c], task - runs[c].first_merge);
    };
    if (pair_jobs > 0) {
      const auto pack = [&](Index job, int) {
        const Run* it = std::upper_bound(
            runs, runs + count, job, [](Index j, const Run& r) { return j < r.first_pair_job; });
        const Run& r = *(it - 1);  // (a call without jobs shares its first with the next)
        const Index k = job - r.first_pair_job, kv_heads = r.args.v.extent(1);
        const Index tiles = r.args.value_tiles_per_head;
        set.value_pairs_task(r.args, k / kv_heads, k % kv_heads,
                             r.value_pairs + k * tiles * tile_words(r.args.v.extent(3)),
                             r.value_pairs_dirty + k * tiles);
      };
      run_tasks(task_threads(pair_jobs), pair_jobs, pack);
    }
    run_tasks(threads, tasks, run_task, merges, merge);
  });
}

/// Runs one attention call (see the run of several above).
template <class Scalar, class Operand>
void run_attention(const AttentionCall<Scalar, Operand>& call, Workspace& ws) {
  run_attention(&call, 1, ws);
}

}  // namespace detail
ATTN_NAMESPACE_END
