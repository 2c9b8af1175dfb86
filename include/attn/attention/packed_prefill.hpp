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
#include <string>
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
  const CoreConfig& c = core.config();
  const char* where = c.forward_name;
  const char* name = c.input_name != nullptr ? c.input_name : "query";
  // 1. Checks.
  check_input(where, name, x, core.d_in(), "d_in");
  const Index total = x.extent(1);
  require(seqs.key.empty(), where, [] {
    return std::string(
        "the packed prefill is self-attention: give one set of offsets (the keys are the "
        "sequences' own tokens)");
  });
  const SequenceOffsets& o = seqs.query;
  check_offsets(where, "cu_seqlens", o, total,
                std::string(name) + " " + to_string(Shape<2>{total, x.extent(2)}));
  const Index n = o.sequences();
  check_cache_use(core, cache, n, true);
  check_output(where, out, {1, total, core.d_out()});
  for (Index s = 0; s < n; ++s) check_cache_room(core, cache, s, o.length(s));
  check_output_memory(where, out, {}, AttentionMask<Scalar>());
  require_disjoint(where, "out", out, "the cache's keys and values", cache.memory());
  KVCacheAccess::set_owner(cache, core.id());
  // 2. Projections: Q (1, H, total, hd), then K (1, H_kv, total, hd) and V (1, H_kv, total,
  //    hd_v).
  const QkvProjection<Scalar>& proj = core.projection();
  const Index heads = core.num_heads(), kv_heads = core.num_kv_heads(), hd = core.head_dim();
  const Index hd_v = core.value_head_dim(), qa = heads * hd, a = core.attention_width();
  const RowsRef<const Scalar> rows = as_rows(x, ws, WorkspaceSlot::kKeyStaging);
  Scalar* q =
      workspace_get<Scalar>(ws, WorkspaceSlot::kProjection, total * (qa + kv_heads * (hd + hd_v)));
  Scalar* kv = q + total * qa;
  proj.project_rows(rows, QkvProjection<Scalar>::kQuery, 1,
                    GemmOutput<Scalar>::head_major(q, total, qa, hd), ws);
  project_key_value(proj, rows, total, kv, ws);
  Scalar* v = kv + total * kv_heads * hd;
  const bool direct = !c.out_proj && out.stride(2) == 1;
  Scalar* ctx = direct ? out.data() : workspace_get<Scalar>(ws, WorkspaceSlot::kContext, total * a);
  const Index ctx_row = direct ? out.stride(1) : a;
  const AttentionOptions options = core.kernel_options({}, ws);  // one dropout call for the batch
  // 3. Rounds of at most C tokens of each sequence.
  std::vector<AttentionCall<Scalar>> calls;
  const Index chunk = cache.max_chunk(), longest = o.max_length();
  for (Index t0 = 0; t0 < longest; t0 += chunk) {
    calls.clear();
    for (Index s = 0; s < n; ++s) {
      if (o.length(s) <= t0) continue;
      const Index t = std::min(chunk, o.length(s) - t0), r0 = o.begin(s) + t0;
      const Index first = cache.length(s);
      // Keys rotated in the workspace at positions L_s .., then stored (quantised, for a
      // quantised cache) with the values: the same values forward_cached() stores.
      if (core.has_rope()) {
        const RotaryEmbedding<Scalar>& rope = core.rope();
        for (Index h = 0; h < heads; ++h) rope.apply(q + h * total * hd + r0 * hd, t, hd, first);
        for (Index h = 0; h < kv_heads; ++h) {
          rope.apply(kv + h * total * hd + r0 * hd, t, hd, first);
        }
      }
      for (Index part = 0; part < 2; ++part) {
        const Index width = part == 0 ? hd : hd_v;
        for (Index h = 0; h < kv_heads; ++h) {
          const Scalar* from = (part == 0 ? kv : v) + (h * total + r0) * width;
          for (Index i = 0; i < t; ++i) {
            KVCacheAccess::store_row(cache, from + i * width, s, static_cast<int>(part), h,
                                     first + i);
          }
        }
      }
      cache.advance(t, s, 1);
      calls.push_back(cache_call<Scalar>(
          where,
          TensorView<const Scalar, 4>(q + r0 * hd, {1, heads, t, hd}, {qa, total * hd, hd, 1}),
          cache,
          TensorView<Scalar, 4>(ctx + r0 * ctx_row, {1, heads, t, hd_v}, {a, hd_v, ctx_row, 1}),
          options, core.sliding_window(), s));
      calls.back().dropout_item = s;
    }
    run_attention(calls.data(), static_cast<Index>(calls.size()), ws);
  }
  // 4. The output projection.
  if (direct) return;
  const TensorView<const Scalar, 3> context(ctx, {1, total, a});
  if (c.out_proj) {
    core.out_proj().forward(context, out, ws);
  } else {
    copy(context, out);
  }
}

}  // namespace detail
ATTN_NAMESPACE_END
