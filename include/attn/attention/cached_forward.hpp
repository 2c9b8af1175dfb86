// SPDX-License-Identifier: MIT
// attn/attention/cached_forward.hpp: the incremental (generation) forward of every module
// built on one AttentionCore: new tokens through a KVCache, written once for all of them.
// Glossary: B = batch, T = new tokens, H = heads, H_kv = key/value heads, hd = head dim,
// hd_v = value head dim, A = H * hd_v, L_b = item b's cache length (the position of its next
// token), W = window, S = sink tokens.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "attn/attention/detail/call.hpp"
#include "attn/attention/detail/module_support.hpp"
#include "attn/attention/kv_cache.hpp"
#include "attn/attention/module_core.hpp"
#include "attn/attention/qkv_projection.hpp"
#include "attn/attention/scaled_dot_product.hpp"
#include "attn/config.hpp"
#include "attn/detail/checked.hpp"
#include "attn/error.hpp"
#include "attn/kernels/gemm_args.hpp"
#include "attn/nn/mask.hpp"
#include "attn/parallel.hpp"
#include "attn/tensor/overlap.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// What the incremental forward records in a KVCache: the module that owns its keys.
struct KVCacheAccess {
  template <class Scalar>
  static void set_owner(KVCache<Scalar>& cache, std::uint64_t owner) noexcept {
    cache.owner_ = owner;
  }
  /// Writes one key (part 0) or value (part 1) row of item b, head h at `position`,
  /// quantised to the cache's element type (the caller checked the indices).
  template <class Scalar>
  static void store_row(KVCache<Scalar>& cache, const Scalar* row, Index b, int part, Index h,
                        Index position) noexcept {
    cache.store_row(row, 1, b, part, h, position);
  }
  /// Item b's key (part 0) or value (part 1) row of head h at a stored `position`, as
  /// Scalars (`wide`: a row of floats, the dequantising scratch).
  template <class Scalar>
  static void load_row(const KVCache<Scalar>& cache, Index b, int part, Index h, Index position,
                       Scalar* to, float* wide) noexcept {
    cache.load_row(b, part, h, position, to, wide);
  }
};

/// The attention call over a cache's keys (after the new tokens were appended): q (B, H, T,
/// hd), query i of item b at position L_b - T + i (per-item bottom-right causal bound, the
/// window), a ring's keys read in place, quantised rows read through their descriptor.
/// `item` >= 0: over that item of the cache alone (q and out of batch 1; the packed prefill).
/// A 16-bit storage type's cache (KVCache<bfloat16>, KVCache<float16>: rows of that type)
/// gives a call on those operands, computed in float.
template <class Scalar>
AttentionCall<compute_type_t<Scalar>, Scalar> cache_call(
    const char* where, TensorView<const Scalar, 4> q, const KVCache<Scalar>& cache,
    TensorView<Scalar, 4> out, const AttentionOptions& options, Index window, Index item = -1) {
  const Index first = item < 0 ? 0 : item, batch = item < 0 ? cache.batch() : 1;
  const Index kv_heads = cache.num_kv_heads(), cap = cache.capacity();
  CacheKeys keys;
  keys.lengths = TensorView<const Index, 1>(cache.lengths() + first, {batch});
  keys.key_first = cache.first_positions() + first;
  keys.ring = cache.window() > 0 ? cap : 0;
  const bool stored = cache.element() != KVElement::kScalar;
  // Quantised rows have no Scalar view: k and v give the shapes only (the kernel reads
  // call.args.stored), as broadcasts of q's first row, memory the checks already accept.
  const auto shape_only = [&](Index width) {
    return TensorView<const Scalar, 4>(q.data(), {batch, kv_heads, cap, width}, {0, 0, 0, 1});
  };
  const auto items = [&](TensorView<const Scalar, 4> all) {
    return slice(all, 0, first, first + batch);
  };
  const TensorView<const Scalar, 4> k =
      stored ? shape_only(cache.head_dim()) : items(cache.k_storage());
  const TensorView<const Scalar, 4> v =
      stored ? shape_only(cache.value_head_dim()) : items(cache.v_storage());
  AttentionCall<compute_type_t<Scalar>, Scalar> call = make_call<compute_type_t<Scalar>, Scalar>(
      where, q, k, v, out, {}, {}, {}, options,
      {true, CausalAlignment::kBottomRightPerItem, window}, keys);
  call.args.stored = cache.stored();
  if (stored) {
    for (StoredRows* rows : {&call.args.stored.k, &call.args.stored.v}) {
      rows->data += first * rows->item_stride;
      if (rows->scales != nullptr) rows->scales += first * rows->scale_item_stride;
    }
  }
  // Stored rows and a ring's are read by the streaming kernel only (no weights are asked for).
  if (stored || keys.ring > 0) call.materialize = false;
  return call;
}

/// The checks of an incremental forward of `core` into `cache` for `items` items (the
/// packed prefill: at least `items`) that do not depend on the tokens: a causal
/// self-attention module, a cache holding no other module's keys, of its heads and head
/// size, whose ring (if any) holds the module's window.
/// @throws ConfigError, or ShapeError for a cache of another batch or head shape.
template <class Scalar>
void check_cache_use(const AttentionCore<Scalar>& core, const KVCache<Scalar>& cache, Index items,
                     bool packed) {
  const CoreConfig& c = core.config();
  const char* where = c.forward_name;
  require_config(c.causal, where, [] {
    return std::string(
        "the incremental forward is causal (each token attends to the cached keys up to its own "
        "position), but this module was built with causal=false: its whole-sequence forward "
        "lets every token see later tokens, which no cache holds yet; build it with "
        "causal=true to generate with it");
  });
  require_config(cache.empty() || cache.owner() == 0 || cache.owner() == core.id(), where, [] {
    return std::string(
        "the cache holds the keys and values of another module (or of this one before it "
        "was assigned over): they mean nothing to this module's projections; reset() the "
        "cache, or give each module its own");
  });
  require_config(core.projection().fused(), where, [&] {
    return "the incremental forward is self-attention and needs kdim == vdim == d_in (got "
           "d_in=" +
           std::to_string(core.d_in()) + ", kdim=" + std::to_string(core.kdim()) +
           ", vdim=" + std::to_string(core.vdim()) + ")";
  });
  require_config(!packed || cache.batch() >= items, where, [&] {
    return "a packed batch of " + std::to_string(items) +
           " sequences fills one cache item each, but the cache holds B=" +
           std::to_string(cache.batch()) + " items";
  });
  require((packed || cache.batch() == items) && cache.num_kv_heads() == core.num_kv_heads() &&
              cache.head_dim() == core.head_dim() &&
              cache.value_head_dim() == core.value_head_dim(),
          where, [&] {
            return "the cache holds B=" + std::to_string(cache.batch()) +
                   ", H_kv=" + std::to_string(cache.num_kv_heads()) +
                   ", head_dim=" + std::to_string(cache.head_dim()) +
                   ", value_head_dim=" + std::to_string(cache.value_head_dim()) +
                   "; the call needs B=" + std::to_string(items) +
                   ", H_kv=" + std::to_string(core.num_kv_heads()) +
                   ", head_dim=" + std::to_string(core.head_dim()) +
                   ", value_head_dim=" + std::to_string(core.value_head_dim());
          });
  const Index window = core.sliding_window();
  if (cache.sink_tokens() > 0) {
    require_config(window == 0 && !packed, where, [&] {
      return "the cache keeps sink_tokens=" + std::to_string(cache.sink_tokens()) +
             " beside a window of " + std::to_string(cache.window()) +
             " tokens, its own sliding window" +
             (packed ? std::string(", and takes no packed batch: run the sequences as a padded "
                                   "batch")
                     : ", but the module has sliding_window=" + std::to_string(window) +
                           ": build it without one");
    });
    return;
  }
  require_config(cache.window() == 0 || (window > 0 && window <= cache.window()), where, [&] {
    return "the cache is a ring for a window of " + std::to_string(cache.window()) +
           " keys, but the module's sliding_window is " + std::to_string(window) +
           " (0: none): it would read keys the ring no longer holds";
  });
}

/// Room in item b of `cache` for `tokens` more tokens of `core`: positions that do not
/// overflow, within the capacity (without a ring), context_length and the rotary tables
/// (with sinks: the cache positions, below S + W).
/// @throws ConfigError naming the item and the values.
template <class Scalar>
void check_cache_room(const AttentionCore<Scalar>& core, const KVCache<Scalar>& cache, Index b,
                      Index tokens) {
  const CoreConfig& c = core.config();
  const char* where = c.forward_name;
  Index end = 0;
  require_config(checked_add(cache.length(b), tokens, end), where, [&] {
    return "item " + std::to_string(b) + " is at position " + std::to_string(cache.length(b)) +
           "; " + std::to_string(tokens) + " more tokens overflow the position counter";
  });
  require_config(cache.window() > 0 || end <= cache.capacity(), where, [&] {
    return "item " + std::to_string(b) + " has " + std::to_string(cache.length(b)) +
           " cached tokens; " + std::to_string(tokens) +
           " more exceed the cache's capacity=" + std::to_string(cache.capacity());
  });
  // The positions the module sees: the stream's, or with sinks those within the cache.
  if (cache.sink_tokens() > 0) end = std::min(end, cache.sink_tokens() + cache.window());
  require_config(c.context_length <= 0 || end <= c.context_length, where, [&] {
    return "item " + std::to_string(b) + " would reach " + std::to_string(end) +
           " tokens, more than context_length=" + std::to_string(c.context_length);
  });
  require_config(!core.has_rope() || end <= core.rope().max_positions(), where, [&] {
    return "item " + std::to_string(b) + " would reach position " + std::to_string(end - 1) +
           ", outside the rotary tables [0, " + std::to_string(core.rope().max_positions()) +
           ") (set rope.max_positions)";
  });
}

/// The checks of forward_cached(), all before anything is written (the cache included).
/// @throws ShapeError on shapes that do not fit, or an `out` that shares memory with the
///         cache; ConfigError for a module that is not causal self-attention, a mask, a
///         cache without room or holding another module's keys, a window the cache cannot
///         hold, positions past context_length or the rotary tables.
template <class Scalar>
void check_cached(const AttentionCore<Scalar>& core, TensorView<const Scalar, 3> x,
                  TensorView<Scalar, 3> out, const KVCache<Scalar>& cache,
                  const AttentionMask<compute_type_t<Scalar>>& mask) {
  const CoreConfig& c = core.config();
  const char* where = c.forward_name;
  const char* name = c.input_name != nullptr ? c.input_name : "query";
  check_input(where, name, x, core.d_in(), "d_in");
  const Index batch = x.extent(0), tokens = x.extent(1);
  check_cache_use(core, cache, batch, false);
  require_config(mask.empty(), where, [] {
    return std::string(
        "the incremental forward takes no mask: the cache's lengths, the causal "
        "bound and the module's window are its mask");
  });
  check_output(where, out, {batch, tokens, core.d_out()});
  for (Index b = 0; b < batch; ++b) check_cache_room(core, cache, b, tokens);
  check_output_memory(where, out, {}, mask);
  // The kernel reads the cache after out is written (chunk by chunk with a ring).
  require_disjoint(where, "out", out, "the cache's keys and values", cache.memory());
}

/// K and V of `rows` (B T rows of d_in features, T = `tokens`) head-major into `kv`: per batch
/// item a block of T H_kv (hd + hd_v) Scalars, its H_kv key heads (T, hd) then its H_kv value
/// heads (T, hd_v): (B, 2 H_kv, T, hd) when hd_v = hd (one GEMM with the stacked [W_k; W_v];
/// else two, one per head size).
template <class Scalar>
void project_key_value(const QkvProjection<Scalar>& proj, const RowsRef<const Scalar>& rows,
                       Index tokens, Scalar* kv, Workspace& ws) {
  using P = QkvProjection<Scalar>;
  const Index kw = proj.width(P::kKey), vw = proj.width(P::kValue);
  if (proj.value_head_dim() == proj.head_dim()) {
    proj.project_rows(rows, P::kKey, 2,
                      GemmOutput<Scalar>::head_major(kv, tokens, kw + vw, proj.head_dim()), ws);
    return;
  }
  GemmOutput<Scalar> k = GemmOutput<Scalar>::head_major(kv, tokens, kw, proj.head_dim());
  GemmOutput<Scalar> v =
      GemmOutput<Scalar>::head_major(kv + tokens * kw, tokens, vw, proj.value_head_dim());
  k.batch_stride = v.batch_stride = tokens * (kw + vw);
  proj.project_rows(rows, P::kKey, 1, k, ws);
  proj.project_rows(rows, P::kValue, 1, v, ws);
}

/// The attention of the t newest tokens of every item of a cache with sinks (3. of
/// cached_step()), one token after another so that each sees its own keys (the result does
/// not depend on the split into steps): the keys token i of item b sees, n_b =
/// visible_keys(p) of them (p = L_b - t + i), rotated at their cache positions 0 .. n_b - 1,
/// and their values, are read into the workspace, (B, H_kv, S + W, hd) and (B, H_kv, S + W,
/// hd_v), and the kernel runs the token's query (rotated at n_b - 1 by the caller) over item
/// b's first n_b rows. q: (B, H, t, hd) rows; ctx: (B, H, t, hd_v) with the given strides.
template <class Scalar>
void sink_attention(const AttentionCore<Scalar>& core, const Scalar* q, Index t, Scalar* ctx,
                    const Shape<3>& ctx_strides, Workspace& ws, const KVCache<Scalar>& cache) {
  const Index batch = cache.batch(), heads = core.num_heads(), kv_heads = cache.num_kv_heads();
  const Index hd = core.head_dim(), hd_v = core.value_head_dim(), qa = heads * hd;
  const Index rows = cache.sink_tokens() + cache.window(), block = batch * kv_heads * rows * hd;
  const Index v_block = batch * kv_heads * rows * hd_v, widest = std::max(hd, hd_v);
  // The reads run as B H_kv tasks, each writing its own rows (the same bits for any thread
  // count). Scratch (bytes, each part 64-byte aligned): K (B, H_kv, S + W, hd) and V (B, H_kv,
  // S + W, hd_v), the lengths n_b (B Index), a float row per thread for dequantising.
  const Index tasks = batch * kv_heads;
  const int threads = task_threads(tasks);
  const auto aligned = [](Index bytes) { return (bytes + 63) / 64 * 64; };
  const Index kv_bytes = aligned((block + v_block) * static_cast<Index>(sizeof(Scalar)));
  const Index len_bytes = aligned(batch * static_cast<Index>(sizeof(Index)));
  unsigned char* scratch =
      workspace_get<unsigned char>(ws, WorkspaceSlot::kCacheRows,
                                   kv_bytes + len_bytes + threads * widest * Index(sizeof(float)));
  Scalar* k = reinterpret_cast<Scalar*>(scratch);
  Scalar* v = k + block;
  Index* lengths = reinterpret_cast<Index*>(scratch + kv_bytes);
  float* wide = reinterpret_cast<float*>(scratch + kv_bytes + len_bytes);
  const Shape<4> k_shape{batch, kv_heads, rows, hd},
      k_strides{kv_heads * rows * hd, rows * hd, hd, 1};
  const Shape<4> v_shape{batch, kv_heads, rows, hd_v},
      v_strides{kv_heads * rows * hd_v, rows * hd_v, hd_v, 1};
  const AttentionOptions options = core.kernel_options({}, ws);
  for (Index i = 0; i < t; ++i) {
    for (Index b = 0; b < batch; ++b) lengths[b] = cache.visible_keys(cache.length(b) - t + i);
    run_tasks(threads, tasks, [&](Index task, int thread) {
      const Index b = task / kv_heads, h = task % kv_heads, p = cache.length(b) - t + i;
      for (Index r = 0; r < lengths[b]; ++r) {
        const Index position = cache.visible_position(p, r), row = task * rows + r;
        KVCacheAccess::load_row(cache, b, 0, h, position, k + row * hd, wide + thread * widest);
        KVCacheAccess::load_row(cache, b, 1, h, position, v + row * hd_v, wide + thread * widest);
        if (core.has_rope()) core.rope().apply(k + row * hd, 1, hd, r);
      }
    });
    run_attention(
        make_call<compute_type_t<Scalar>, Scalar>(
            core.config().forward_name,
            TensorView<const Scalar, 4>(q + i * hd, {batch, heads, 1, hd}, {t * qa, t * hd, hd, 1}),
            TensorView<const Scalar, 4>(k, k_shape, k_strides),
            TensorView<const Scalar, 4>(v, v_shape, v_strides),
            TensorView<Scalar, 4>(ctx + i * ctx_strides[1], {batch, heads, 1, hd_v},
                                  {ctx_strides[0], hd_v, ctx_strides[1], 1}),
            {}, {}, {}, options, {true, CausalAlignment::kBottomRightPerItem, 0},
            CacheKeys{TensorView<const Index, 1>(lengths, {batch}), nullptr, 0}),
        ws);
  }
}

/// Where the attention of an incremental step writes its context rows (B, T, A): straight
/// into out when the module has no output projection and out's rows are dense (`direct`),
/// else into the workspace, for finish_step().
template <class Scalar>
struct StepContext {
  bool direct = false;
  Scalar* data = nullptr;
  Shape<3> strides{};  ///< of the (B, T, A) rows
};

template <class Scalar>
StepContext<Scalar> step_context(const AttentionCore<Scalar>& core, TensorView<Scalar, 3> out,
                                 Index batch, Index t, Workspace& ws) {
  const Index a = core.attention_width();
  if (!core.config().out_proj && out.stride(2) == 1) return {true, out.data(), out.strides()};
  return {false, workspace_get<Scalar>(ws, WorkspaceSlot::kContext, batch * t * a),
          Shape<3>{t * a, a, 1}};
}

/// The last pass of an incremental step: the context rows through the output projection (or
/// copied) into out, unless the attention wrote them there.
template <class Scalar>
void finish_step(const AttentionCore<Scalar>& core, const StepContext<Scalar>& ctx, Index batch,
                 Index t, TensorView<Scalar, 3> out, Workspace& ws) {
  if (ctx.direct) return;
  const TensorView<const Scalar, 3> context(ctx.data, {batch, t, core.attention_width()});
  if (core.config().out_proj) {
    core.out_proj().forward(context, out, ws);
  } else {
    copy(context, out);
  }
}

/// One step of at most cache.max_chunk() tokens (see forward_cached()).
template <class Scalar>
void cached_step(const AttentionCore<Scalar>& core, TensorView<const Scalar, 3> x,
                 TensorView<Scalar, 3> out, Workspace& ws, KVCache<Scalar>& cache) {
  const QkvProjection<Scalar>& proj = core.projection();
  const Index batch = x.extent(0), t = x.extent(1), heads = core.num_heads();
  const Index kv_heads = core.num_kv_heads(), hd = core.head_dim(), hd_v = core.value_head_dim();
  const Index qa = heads * hd;
  // 1. Projections: Q into the workspace; K and V straight into the cache's next rows when
  // they are one strided block (equal lengths, no ring wrap, Scalar rows, hd_v = hd), else
  // through the workspace (quantised rows: rotated there, then stored).
  // Staged (strided rows, e.g. one chunk of a longer x) into the key slot: the query slot may
  // hold x itself, copied there by stage_overlapping() when it overlaps out.
  const RowsRef<const Scalar> rows = as_rows(x, ws, WorkspaceSlot::kKeyStaging);
  const Index item_kv = t * kv_heads * (hd + hd_v);  // one item's staged K and V
  Scalar* q = workspace_get<Scalar>(ws, WorkspaceSlot::kProjection, batch * (t * qa + item_kv));
  proj.project_rows(rows, QkvProjection<Scalar>::kQuery, 1,
                    GemmOutput<Scalar>::head_major(q, t, qa, hd), ws);
  const Index cap = cache.capacity();
  const bool sinks = cache.sink_tokens() > 0;
  // Quantised rows, and a cache with sinks (whose rows keep un-rotated keys), are written
  // from the workspace.
  const bool stored = cache.element() != KVElement::kScalar || sinks;
  Scalar* kv = q + batch * t * qa;  // staged: see project_key_value()
  const auto k_at = [&](Index b, Index h) { return kv + b * item_kv + h * t * hd; };
  const auto v_at = [&](Index b, Index h) {
    return kv + b * item_kv + kv_heads * t * hd + h * t * hd_v;
  };
  if (!stored && hd_v == hd && cache.uniform() && cache.length(0) % cap + t <= cap) {
    const TensorView<Scalar, 4> next = cache.next_rows(t);
    GemmOutput<Scalar> o;
    o.data = next.data(), o.ldc = next.stride(2), o.rows_per_batch = t;
    o.batch_stride = next.stride(0), o.segment = hd, o.segment_stride = next.stride(1);
    proj.project_rows(rows, QkvProjection<Scalar>::kKey, 2, o, ws);
  } else {
    project_key_value(proj, rows, t, kv, ws);
    for (Index b = 0; b < (stored ? 0 : batch); ++b) {
      for (Index h = 0; h < kv_heads; ++h) {
        const Scalar* k_rows = k_at(b, h);
        const Scalar* v_rows = v_at(b, h);
        for (Index i = 0; i < t; ++i) {
          std::copy_n(k_rows + i * hd, hd, cache.k_slot(b, h, cache.length(b) + i));
          std::copy_n(v_rows + i * hd_v, hd_v, cache.v_slot(b, h, cache.length(b) + i));
        }
      }
    }
  }
  // 2. RoPE on Q and the new K rows at each item's positions L_b .. L_b + t - 1. With sinks:
  // on Q alone, query i at its cache position visible_keys(L_b + i) - 1 (the keys are
  // rotated when read, in sink_attention()).
  if (core.has_rope()) {
    const auto& rope = core.rope();  // in Scalar's compute type
    for (Index b = 0; b < batch; ++b) {
      const Index first = cache.length(b);
      for (Index h = 0; h < heads; ++h) {
        Scalar* q_rows = q + (b * heads + h) * t * hd;
        if (!sinks) rope.apply(q_rows, t, hd, first);
        for (Index i = 0; i < (sinks ? t : 0); ++i) {
          rope.apply(q_rows + i * hd, 1, hd, cache.visible_keys(first + i) - 1);
        }
      }
      for (Index h = 0; h < (sinks ? 0 : kv_heads); ++h) {
        for (Index i = 0; i < t; ++i) {
          Scalar* k_row = stored ? k_at(b, h) + i * hd : cache.k_slot(b, h, first + i);
          rope.apply(k_row, 1, hd, first + i);
        }
      }
    }
  }
  // 2b. Staged rows (quantised, or with sinks): the keys (rotated without sinks) and the
  // values stored at L_b + i.
  for (Index b = 0; b < (stored ? batch : 0); ++b) {
    for (Index part = 0; part < 2; ++part) {
      const Index width = part == 0 ? hd : hd_v;
      for (Index h = 0; h < kv_heads; ++h) {
        const Scalar* from = part == 0 ? k_at(b, h) : v_at(b, h);
        for (Index i = 0; i < t; ++i) {
          KVCacheAccess::store_row(cache, from + i * width, b, static_cast<int>(part), h,
                                   cache.length(b) + i);
        }
      }
    }
  }
  cache.advance(t);
  // 3. The kernel over the cache: query i of item b at position L_b - t + i sees the keys of
  // (L_b - t + i - W, L_b - t + i] (per-item bottom-right causal bound, the window), the
  // keys of a ring read in place; with sinks, see sink_attention().
  const StepContext<Scalar> ctx = step_context(core, out, batch, t, ws);
  if (sinks) {
    sink_attention(core, q, t, ctx.data, ctx.strides, ws, cache);
  } else {
    run_attention(
        cache_call<Scalar>(
            core.config().forward_name,
            TensorView<const Scalar, 4>(q, {batch, heads, t, hd}, {t * qa, t * hd, hd, 1}), cache,
            TensorView<Scalar, 4>(ctx.data, {batch, heads, t, hd_v},
                                  {ctx.strides[0], hd_v, ctx.strides[1], 1}),
            core.kernel_options({}, ws), core.sliding_window()),
        ws);
  }
  // 4. The output projection.
  finish_step(core, ctx, batch, t, out, ws);
}

/// The incremental forward: x (B, T, d_in) holds each item's next T tokens; their keys and
/// values are appended to `cache` and every token attends to its item's cached keys, causally
/// (and within the module's window, or the sinks and window of a cache with sink_tokens), with
/// rotary embeddings at the cached positions (with sinks: positions within the cache): out
/// (B, T, d_out) equals the rows of the whole-sequence forward for those tokens (with sinks:
/// the attention KVCache defines), to float rounding, however the sequence is split (prefill,
/// chunks, single tokens). T beyond cache.max_chunk() (a sliding-window ring) runs in chunks
/// of it. Allocation-free with a warm workspace. `x` must not share memory with `out` or the
/// cache (the module stages it if it does); `out` must not share memory with the cache
/// (refused). The cache records the module as the owner of its keys (see KVCache).
///
/// Contract: every token count, position and item index it computes from x and the cache is
/// checked before anything is written (check_cached), so a call that throws leaves the cache
/// as it was.
template <class Scalar>
void forward_cached(const AttentionCore<Scalar>& core, TensorView<const Scalar, 3> x,
                    TensorView<Scalar, 3> out, Workspace& ws, KVCache<Scalar>& cache,
                    const AttentionMask<compute_type_t<Scalar>>& mask) {
  check_cached(core, x, out, cache, mask);
  KVCacheAccess::set_owner(cache, core.id());
  const Index tokens = x.extent(1), chunk = cache.max_chunk();
  for (Index t0 = 0; t0 < tokens; t0 += chunk) {
    const Index t1 = std::min(tokens, t0 + chunk);
    cached_step(core, slice(x, 1, t0, t1), slice(out, 1, t0, t1), ws, cache);
  }
}

}  // namespace detail

/// Attention of q (B, H, T, hd) over the keys and values stored in `cache` (H_kv dividing H),
/// as the incremental forward runs it once the T new tokens are appended: query i of item b
/// sits at position L_b - T + i and sees the stored keys up to it, within `window` (0: none;
/// a ring needs 0 < window <= cache.window()). out: (B, H, T, hd_v). For a layer whose
/// projections are its own (keys of 192 and values of 128 per head, as DeepSeek's
/// decompressed MLA heads; a custom model): append() its keys and values, then call this.
/// Quantised rows are read as they are stored. Allocation-free with a warm workspace.
/// @throws ShapeError on shapes that do not fit or an `out` sharing memory with q or the
///         cache; ConfigError for T past an item's length, a window the ring cannot hold, a
///         cache with sink_tokens, or options scaled_dot_product_attention refuses.
/// (q's and out's types follow the cache's Scalar: mutable views of q convert.)
template <class Scalar>
void cached_attention(typename std::enable_if_t<true, TensorView<const Scalar, 4>> q,
                      const KVCache<Scalar>& cache,
                      typename std::enable_if_t<true, TensorView<Scalar, 4>> out, Workspace& ws,
                      const AttentionOptions& options = {}, Index window = 0) {
  const char* where = "cached_attention";
  detail::require_config(cache.sink_tokens() == 0, where, [&] {
    return "the cache keeps sink_tokens=" + std::to_string(cache.sink_tokens()) +
           " with un-rotated keys, which the modules' incremental forward rotates at their "
           "cache positions; run the module's forward(x, out, ws, cache)";
  });
  detail::require(q.extent(0) == cache.batch() && q.extent(3) == cache.head_dim(), where, [&] {
    return "q " + detail::to_string(q.shape()) +
           " against a cache of B=" + std::to_string(cache.batch()) +
           ", head_dim=" + std::to_string(cache.head_dim());
  });
  for (Index b = 0; b < cache.batch(); ++b) {
    detail::require_config(q.extent(2) <= cache.length(b), where, [&] {
      return "T=" + std::to_string(q.extent(2)) + " queries, but item " + std::to_string(b) +
             " holds " + std::to_string(cache.length(b)) + " tokens (append the new ones first)";
    });
  }
  detail::require_config(
      window >= 0 && (cache.window() == 0 || (window > 0 && window <= cache.window())), where, [&] {
        return "window=" + std::to_string(window) + " over a cache whose ring holds a window of " +
               std::to_string(cache.window()) + " (0: not a ring)";
      });
  detail::require_disjoint(where, "out", out, "the cache's keys and values", cache.memory());
  detail::run_attention(detail::cache_call(where, q, cache, out, options, window), ws);
}

ATTN_NAMESPACE_END
