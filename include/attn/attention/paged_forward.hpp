// SPDX-License-Identifier: MIT
// attn/attention/paged_forward.hpp: attention over the sequences of a PagedKVCache, read
// through their block tables (no copy of the cache), and the incremental forward of a module
// on a batch of its sequences (ragged lengths: each sequence at its own position).
// Glossary: B = sequences of the call, T = new tokens per sequence, H = heads, H_kv =
// key/value heads, hd = head dim, A = H * hd, L_b = sequence b's length, W = window.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "attn/attention/detail/call.hpp"
#include "attn/attention/detail/module_support.hpp"
#include "attn/attention/module_core.hpp"
#include "attn/attention/paged_kv_cache.hpp"
#include "attn/attention/qkv_projection.hpp"
#include "attn/attention/scaled_dot_product.hpp"
#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/kernels/gemm_args.hpp"
#include "attn/nn/mask.hpp"
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
template <class Scalar>
AttentionCall<Scalar> paged_call(const char* where, TensorView<const Scalar, 4> q,
                                 const PagedKVCache<Scalar>& cache, const Index* seqs,
                                 TensorView<Scalar, 4> out, const AttentionOptions& options,
                                 Index window) {
  const PagedBatch batch = cache.batch(seqs, q.extent(0));
  CacheKeys keys;
  keys.lengths = TensorView<const Index, 1>(batch.lengths, {batch.batch});
  // k and v give the shapes only (the kernel reads call.args.stored), as broadcasts of q's
  // first row, memory the checks already accept.
  const auto shape_only = [&](Index width) {
    return TensorView<const Scalar, 4>(q.data(), {batch.batch, cache.num_kv_heads(), batch.slots, width},
                                       {0, 0, 0, 1});
  };
  AttentionCall<Scalar> call = make_call<Scalar>(
      where, q, shape_only(cache.head_dim()), shape_only(cache.value_head_dim()), out, {}, {}, {},
      options, {true, CausalAlignment::kBottomRightPerItem, window}, keys);
  call.args.stored = batch.stored;
  call.materialize = false;  // stored rows: the streaming kernel only
  return call;
}

}  // namespace detail

/// Attention of q (B, H, T, hd) over sequences seqs[0 .. B-1] of `cache` (H_kv dividing H;
/// distinct or not), as the incremental forward runs it once the T new tokens are appended:
/// query i of item b sits at position L_b - T + i and sees the stored keys up to it, within
/// `window` (0: none). out: (B, H, T, hd_v). The kernel reads the rows through the block
/// tables, dequantising quantised ones tile by tile: the same bits as cached_attention() over
/// a KVCache holding the same tokens, for any thread count. Allocation-free with a warm
/// workspace and cache.
/// @throws IndexError for an entry of seqs that is not a sequence; ShapeError on shapes that
///         do not fit (seqs must have B entries) or an `out` sharing memory with q or the
///         cache; ConfigError for T past a sequence's length, a negative window, or options
///         scaled_dot_product_attention refuses.
template <class Scalar>
void paged_attention(typename std::enable_if_t<true, TensorView<const Scalar, 4>> q,
                     const PagedKVCache<Scalar>& cache, const std::vector<Index>& seqs,
                     typename std::enable_if_t<true, TensorView<Scalar, 4>> out, Workspace& ws,
                     const AttentionOptions& options = {}, Index window = 0) {
  const char* where = "paged_attention";
  detail::require(q.extent(0) == static_cast<Index>(seqs.size()) &&
                      q.extent(3) == cache.head_dim(),
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
  detail::require_disjoint(where, "out", out, "the cache's keys and values", cache.memory());
  detail::run_attention(detail::paged_call(where, q, cache, seqs.data(), out, options, window), ws);
}

ATTN_NAMESPACE_END
