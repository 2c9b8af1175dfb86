// SPDX-License-Identifier: MIT
// attn/kernels/attention_args.hpp: what the attention drivers hand a kernel set: the tile
// sizes, the scratch each task needs, one call's operands (forward and backward) and one
// streaming task. Plain data, compiled with the program's flags; every kernel set reads the
// same.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "attn/config.hpp"
#include "attn/detail/checked.hpp"
#include "attn/isa.hpp"
#include "attn/kernels/kv_storage.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/types/bfloat16.hpp"

ATTN_NAMESPACE_BEGIN

/// What the `weights` output of a materialised attention call holds, (B, H, T_q, T_k): the
/// attention weights (the default), or the scores at one stage before them (the four
/// `qk_matmul_output` modes of ONNX's Attention operator, 0..3).
enum class WeightsStage {
  kWeights,        ///< the softmax's probabilities after dropout: what multiplies V
  kScaled,         ///< q k^T * scale, every key (ONNX mode 0)
  kSoftcapped,     ///< softcap * tanh(scaled / softcap), or the scaled scores without one (1)
  kMasked,         ///< softcapped + ALiBi + the mask: what the softmax reads, -inf where a
                   ///< key is hidden (2)
  kProbabilities,  ///< the softmax's probabilities before dropout, 0 where hidden (3)
};

namespace detail {

/// Query rows per attention task, and key columns per streaming tile.
inline constexpr Index kQueryBlock = 64;
inline constexpr Index kKeyBlock = 128;

/// Scratch elements one materialised attention task needs: a (kQueryBlock, T_k) score
/// block and K^T (d, T_k), later V (T_k, d_v) when it must be cleaned.
constexpr Index materialized_scratch_size(Index head_dim, Index value_dim, Index keys) noexcept {
  return kQueryBlock * keys + std::max(head_dim, value_dim) * keys + 64;
}

/// Whether materialized_scratch_size() for these sizes is an object the machine can hold
/// (broadcast views with zero strides can claim 2^60 keys): callers check this first.
template <class Scalar>
constexpr bool materialized_scratch_fits(Index head_dim, Index value_dim, Index keys) noexcept {
  std::size_t count = 0, bytes = 0;
  const auto width = static_cast<std::size_t>(kQueryBlock + std::max(head_dim, value_dim));
  return checked_mul(width, static_cast<std::size_t>(keys), count) && count < kMaxObjectBytes &&
         checked_bytes(count + 64, sizeof(Scalar), bytes);
}

/// Scratch elements one streaming attention task needs: Q^T (d, kQueryBlock), a score tile
/// (kKeyBlock, kQueryBlock), the output accumulator (kQueryBlock, d_v), five statistics per
/// query and a V tile (kKeyBlock, d_v) for values that must be cleaned.
constexpr Index stream_scratch_size(Index head_dim, Index value_dim) noexcept {
  return head_dim * kQueryBlock + kKeyBlock * kQueryBlock + kQueryBlock * value_dim +
         5 * kQueryBlock + kKeyBlock * value_dim + 64;
}

/// Scratch elements a streaming task on bfloat16 or float16 operands needs beyond
/// stream_scratch_size(), in floats: Q widened (kQueryBlock, d); a K tile widened (kKeyBlock,
/// d) or copied into whole AMX tiles (kKeyBlock, d + 32 bfloat16); a V tile widened
/// (kKeyBlock, d_v); Q^T in k-pairs ((d + 1) / 2 + 32 words, kQueryBlock); a V tile in k-pairs
/// (kKeyBlock / 2, d_v words); P transposed and rounded (kQueryBlock, kKeyBlock bfloat16); the
/// next tile's scores (kKeyBlock, kQueryBlock), computed during this tile's exponentials (AMX).
constexpr Index reduced_stream_scratch_size(Index head_dim, Index value_dim) noexcept {
  return kQueryBlock * head_dim + kKeyBlock * (head_dim + 32) + kKeyBlock * value_dim +
         ((head_dim + 1) / 2 + 32) * kQueryBlock + kKeyBlock / 2 * value_dim +
         kQueryBlock * kKeyBlock / 2 + kKeyBlock * kQueryBlock + 64 * 8;
}

/// Scratch elements a streaming task over stored keys and values needs on top: one
/// dequantised K tile (kKeyBlock, d) and V tile (kKeyBlock, d_v); the query rows quantised for
/// int8 keys (kQueryBlock rows of d rounded up to 64 bytes, and a sum and a scale per row).
constexpr Index stored_tile_scratch_size(Index head_dim, Index value_dim) noexcept {
  return kKeyBlock * (head_dim + value_dim) + kQueryBlock * ((head_dim + 63) / 64 * 16 + 2) + 16;
}

/// Scratch elements one streaming backward task needs: Q^T (d, kQueryBlock), dO^T (d_v,
/// kQueryBlock), D and lse per query, P^T, dS^T, the dropout factors and the softcap's
/// derivative (kKeyBlock, kQueryBlock) each, and accumulators for dK and dV (kKeyBlock,
/// d + d_v) or dQ (kQueryBlock, d).
constexpr Index stream_backward_scratch_size(Index head_dim, Index value_dim) noexcept {
  return (head_dim + value_dim + 2) * kQueryBlock + 4 * kKeyBlock * kQueryBlock +
         std::max(kKeyBlock * (head_dim + value_dim), kQueryBlock * head_dim) + 64;
}

/// Scratch elements a streaming backward task with bfloat16 products (AttentionArgs::path
/// kAmx or kDot on float operands) needs beyond stream_backward_scratch_size(), in floats:
/// the query tile's Q and dO rounded (kQueryBlock, d + d_v bfloat16), as k-pairs along d
/// and d_v ((d + d_v) / 2 + 32 words, kQueryBlock) and along the rows (kQueryBlock / 2,
/// d + d_v); a K and a V tile rounded into whole tiles (kKeyBlock, d + d_v + 64 bfloat16), K
/// as k-pairs along its rows (kKeyBlock / 2, d); P^T and dS^T (or dS) rounded (kKeyBlock,
/// kQueryBlock bfloat16 each); 64-byte alignment of each part.
constexpr Index pair_backward_scratch_size(Index head_dim, Index value_dim) noexcept {
  return kQueryBlock * (head_dim + value_dim) / 2 +
         ((head_dim + value_dim) / 2 + 34) * kQueryBlock +
         kQueryBlock / 2 * (head_dim + value_dim) + kKeyBlock * (head_dim + value_dim + 64) / 2 +
         kKeyBlock / 2 * head_dim + kKeyBlock * kQueryBlock + 16 * 12;
}
/// Scratch elements one materialised backward task needs: P (then A) and dA (then dS),
/// (T_q, T_k) each, K^T or V^T (max(d, d_v), T_k) and one value per query; with a softcap,
/// its derivative (T_q, T_k) too.
constexpr Index materialized_backward_scratch_size(Index queries, Index head_dim, Index value_dim,
                                                   Index keys, bool softcap = false) noexcept {
  return (softcap ? 3 : 2) * queries * keys + std::max(head_dim, value_dim) * keys + queries + 64;
}

/// One attention call's operands, (B, H, T, d) views: query, key, value, output and (for
/// the materialised path, optional) weights; the score scale and dropout probability. k and
/// v may have fewer heads than q (grouped-query attention: query head h reads key/value head
/// h / (H / H_kv)). With `ring` > 0 the keys live in a ring of that many rows (a
/// sliding-window KVCache): logical key j is row j % ring of k and v (streaming path only).
/// `lse`, when not empty, (B, H, T_q) receives each query's logsumexp of its masked, scaled
/// scores (before dropout; +inf for a query its masks hide every key from): what the
/// streaming backward recomputes the probabilities from.
/// The variants, each off at its default (docs/variants.md has the formulas):
/// - `softcap` C != 0: the scaled scores s become C tanh(s / C) before anything is added;
/// - `alibi` (H slopes m_h) or, without it, `alibi_max_bias` > 0 (the standard slopes,
///   alibi_slope()): -m_h |i + position - j| added to the scores (HeadMask::position);
/// - `sinks` (H logits): exp(sink_h) joins each row's softmax denominator (its logsumexp too);
/// - `weights_stage`: what `weights` receives (WeightsStage).
/// Operand, bfloat16 or float16 with Scalar float, is the element type of q, k, v and out
/// (streaming path only): the products accumulate in float, on `path` for bfloat16
/// (docs/precision.md).
/// With `stored` active (a quantised KVCache, or a PagedKVCache) the keys and values are read
/// from its rows (through its block tables when paged), dequantised tile by tile, and k and v
/// only give their shapes (streaming path only, Operand == Scalar).
template <class Scalar, class Operand = Scalar>
struct AttentionArgs {
  TensorView<const Operand, 4> q, k, v;
  TensorView<Operand, 4> out;
  TensorView<Scalar, 4> weights;
  Scalar scale = 1;
  double dropout = 0.0;
  Index ring = 0;
  TensorView<Scalar, 3> lse;
  Scalar softcap = 0;
  const Scalar* alibi = nullptr;
  double alibi_max_bias = 0.0;
  const Scalar* sinks = nullptr;
  WeightsStage weights_stage = WeightsStage::kWeights;
  Bf16Path path = Bf16Path::kWiden;
  StoredKeyValues stored;
  /// The k-pair paths (Operand bfloat16, path kAmx or kDot on the avx512 set): V's whole key
  /// tiles [0, T_k / kKeyBlock) as k-pairs, packed once per call by the driver
  /// (value_pairs_task()), or null (each task packs its V tiles). Tile t of item b, key/value
  /// head h: value_tiles_per_head * (b * H_kv + h) + t, at value_pairs + that * kKeyBlock / 2
  /// * d_v words; value_pairs_dirty[that] != 0 where the tile holds a NaN or an infinity.
  /// Float and double operands: the flags alone (no words), set once per call the same way,
  /// so that a task skips its scan of a whole tile that holds none (clean_values()).
  const float* value_pairs = nullptr;
  const unsigned char* value_pairs_dirty = nullptr;
  Index value_tiles_per_head = 0;

  /// Whether ALiBi is on.
  bool has_alibi() const noexcept { return alibi != nullptr || alibi_max_bias > 0.0; }
};

/// The ALiBi slope of head h of H with the geometric series of `max_bias` (8: BLOOM's, and
/// ggml's max_bias): with n the largest power of two <= H, m_h = 2^(-max_bias (h + 1) / n)
/// for h < n, and 2^(-max_bias (2 (h - n) + 1) / (2 n)) for the heads past n.
inline double alibi_slope(Index h, Index heads, double max_bias) noexcept {
  Index n = 1;
  while (n * 2 <= heads) n *= 2;
  const double m0 = std::pow(2.0, -max_bias / static_cast<double>(n));
  const double m1 = std::pow(2.0, -max_bias / 2.0 / static_cast<double>(n));
  return h < n ? std::pow(m0, static_cast<double>(h + 1))
               : std::pow(m1, static_cast<double>(2 * (h - n) + 1));
}

/// The ALiBi slope of query head h of a call (alibi given, or the standard series).
template <class Scalar, class Operand>
Scalar alibi_slope(const AttentionArgs<Scalar, Operand>& a, Index h) noexcept {
  if (a.alibi != nullptr) return a.alibi[h];
  return static_cast<Scalar>(alibi_slope(h, a.q.extent(1), a.alibi_max_bias));
}

/// The gradients of one attention backward call: dO, the gradient of the forward's output,
/// and dQ, dK, dV, which the backward adds into.
template <class Scalar>
struct AttentionGradients {
  TensorView<const Scalar, 4> grad_out;
  TensorView<Scalar, 4> grad_q, grad_k, grad_v;
  /// With sinks, (H): dL/dsink_h is added into it (empty: not computed).
  TensorView<Scalar, 1> grad_sinks{};
};

/// One attention backward call's operands: the forward's (its inputs, scale and dropout, its
/// output in `out` and its logsumexp in `lse`, both read only here) and the gradients.
/// `sink_partials`, with sinks and grad_sinks: the driver's buffer where each task writes its
/// share of dL/dsink_h (streaming: one per (b, h, query tile), materialised: one per (b, h)),
/// summed in a fixed order afterwards.
/// q, k, v and out of a backward call as bfloat16, the same shapes with unit inner strides: a
/// bfloat16 module's backward (float operands holding bfloat16 values, `path` kAmx or kDot)
/// gives them for its bfloat16 products to read in place, and D = rowsum(dO * O) reads `out`
/// widened (the same bits as the float out); empty otherwise. When the tasks take bfloat16
/// products (backward_reads_narrow()), they read q, k, v and out only here, not the call's
/// float views.
struct BackwardNarrow {
  TensorView<const bfloat16, 4> q, k, v, out;
};
/// `narrow`: see BackwardNarrow.
/// `clean_k`, when not null: K with its non-finite values +0, contiguous (B, H_kv, T_k, d), the
/// K of the dQ products (the driver's copy when K holds a NaN or an infinity; the scores read
/// k). Those products cover keys a query cannot see, where dS = 0 would meet them as 0 * NaN.
template <class Scalar>
struct AttentionBackwardArgs : AttentionArgs<Scalar>, AttentionGradients<Scalar> {
  Scalar* sink_partials = nullptr;
  BackwardNarrow narrow;
  const Scalar* clean_k = nullptr;
};

/// What one attention backward task computes: dK and dV of a key tile (streaming), dQ of a
/// query tile (streaming), or a whole head (materialised).
enum class BackwardTask { kKeys, kQueries, kMaterialized };

/// One streaming task: query rows [i0, i1) of the heads h0 .. h0 + heads - 1, which share
/// key/value head kv_head, stacked head by head (row r is query i0 + r % (i1 - i0) of head
/// h0 + r / (i1 - i0); heads * (i1 - i0) <= kQueryBlock), over the keys [j_begin, j_end).
/// With `partial` null the task owns all of its rows' keys and writes their output; else it
/// writes each row's unnormalised state there, kPartialExtra + d_v values per row (see
/// partial_row_size) for merge_partials() to combine the key chunks in order.
template <class Scalar>
struct StreamTask {
  Index b = 0, kv_head = 0, h0 = 0, heads = 1, i0 = 0, i1 = 0;
  Index j_begin = 0, j_end = std::numeric_limits<Index>::max();
  Scalar* partial = nullptr;
};

/// Values a partial row holds before its d_v accumulator: the running max m, the sum l and
/// a flag, 1 when the row saw a key its element-wise masks allow.
inline constexpr Index kPartialExtra = 3;
constexpr Index partial_row_size(Index value_dim) noexcept { return value_dim + kPartialExtra; }

}  // namespace detail
ATTN_NAMESPACE_END
