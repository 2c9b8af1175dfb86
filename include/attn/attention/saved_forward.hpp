// SPDX-License-Identifier: MIT
// attn/attention/saved_forward.hpp: SavedForward, what a training forward of an attention
// module keeps for its backward (explicit saved state: no tape, no allocation once warm).
// Glossary: B = batch, T_q / T_k = query / key tokens, H = heads, hd = head dim, D = H * hd.
//
// The training API, where each piece lives:
//
//   module.forward(in..., out, saved, ws, mask = {})            records `saved` (module.hpp)
//   module.backward(grad_out, saved, grad_in..., grads, ws)     grad_in: one view per input
//       (x | x_q, x_kv | query, key, value), an empty view skips it; grads: Gradients made
//       from the module's named_parameters(), any naming (found by address, Gradients::of);
//       written once in attention/module_backward.hpp
//   linear.backward(x, grad_y, grad_x, grads, ws)               nn/linear.hpp
//   scaled_dot_product_attention(q, k, v, out, logsumexp, ws, mask, options)
//   scaled_dot_product_attention_backward(q, k, v, out, grad_out, logsumexp,
//       grad_q, grad_k, grad_v, ws, mask, options)              attention/scaled_dot_product_
//                                                               backward.hpp
//
// Every backward ADDS into its gradient outputs, input gradients included (PyTorch's .grad,
// llm.c's backward passes): zero them first. Then self-attention's x (read by Q, K and V),
// key = value, residual connections and the wrapper's heads need no special case.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "attn/attention/core_config.hpp"
#include "attn/attention/detail/module_support.hpp"
#include "attn/attention/scaled_dot_product.hpp"
#include "attn/config.hpp"
#include "attn/nn/mask.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/types/element.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN

/// What `module.forward(inputs..., out, saved, ws, mask)` records for the module's backward
/// pass: the state PyTorch's autograd would keep on its tape, kept here in one object the
/// caller owns and passes back (no tape, no global state). Reuse one per call site across
/// training steps: its buffers only grow, so once warm a training forward allocates nothing.
///
/// It holds
/// - the input rows the projections read: views of the caller's query/key/value when their
///   rows were contiguous (those tensors must then stay alive and unchanged until the
///   backward, as PyTorch requires of saved tensors, and so must the module's weights), else
///   staged copies it owns; an input the forward's output overwrites (in place,
///   forward(x, x, saved, ws)) is always copied first, so in place is exact;
/// - the projections Q, K, V (B, H, T, hd) exactly as the kernel read them, and the
///   kernel's output, the context (B, T_q, D) (out_proj's input, and O in the backward's
///   D = rowsum(dO * O));
/// - a copy of the mask (its tensors must outlive the backward) and the kernel's options
///   with everything resolved: the scale, the dropout probability, seed and call number
///   (the backward redraws the same keep decisions), and which path ran.
/// - the kernel's logsumexp per query, (B, H, T_q), +inf for a query that sees no key: the
///   streaming backward recomputes the probabilities from it.
///
/// - which module filled it: its address, identity and configuration. The backward of any
///   other module (another object, a copy, or this object after it was assigned a new
///   module) refuses it with a ShapeError naming both configurations; a training forward
///   that throws leaves it empty (refused too).
///
/// The members are filled by the module and read by its backward; treat them as read-only,
/// and pass none of its views (or buffers) back as an input or output of a training forward
/// (ShapeError: the forward overwrites them). A SavedForward is movable (the views stay
/// valid) but not copyable.
///
/// @tparam Scalar float or double; or bfloat16 (a bfloat16 module's record: its mask and its
///         logsumexp are float).
template <class Scalar>
struct SavedForward {
  /// What the mask and the logsumexp are in: Scalar, or float for bfloat16.
  using Compute = compute_type_t<Scalar>;
  /// The module part that filled it (an AttentionCore, a SimpleSelfAttention, a
  /// MultiHeadAttentionWrapper); null when empty.
  const void* owner = nullptr;
  /// That part's identity (AttentionCore::id(): another object assigned over it at the same
  /// address has another) and configuration, for an AttentionCore; 0 and empty otherwise. A
  /// backward refuses a record whose owner, identity or configuration is not its own, naming
  /// both configurations: shapes alone cannot tell a module replaced in place.
  std::uint64_t owner_id = 0;
  detail::CoreConfig owner_config{};
  Index batch = 0, query_tokens = 0, key_tokens = 0;
  /// The projections' input rows, (B * T, features) each: query, key, value. Self-attention
  /// has one input (all three are the same rows); key and value may be one input.
  detail::RowsRef<const Scalar> inputs[3];
  bool self_attention = false;  ///< query, key and value were one view
  bool key_is_value = false;    ///< key and value were one view
  /// Q (B, H, T_q, hd), K (B, H, T_k, hd), V (B, H, T_k, hd), as the kernel read them.
  TensorView<const Scalar, 4> query, key, value;
  /// The kernel's output, (B, T_q, D) = (B, T_q, H, hd) merged.
  TensorView<const Scalar, 3> context;
  /// The kernel's logsumexp per query, (B, H, T_q) (float for bfloat16).
  TensorView<const Compute, 3> logsumexp;
  /// The caller's mask (the module's own causal bound is not in it; the module adds it).
  AttentionMask<Compute> mask;
  /// A packed forward's offsets (batch 1; see PackedSequences): the queries' and the keys'.
  /// Empty when the forward was not packed.
  std::vector<Index> query_offsets, key_offsets;
  /// The kernel's options, resolved: scale set, the dropout call number claimed, path
  /// kMaterialized or kStreaming.
  AttentionOptions options;
  /// Owns the staged inputs, the projections and the context.
  Workspace storage;
  /// MultiHeadAttentionWrapper: one record per head.
  std::vector<SavedForward> parts;

  /// True once a training forward has filled it.
  bool filled() const noexcept { return owner != nullptr; }
  /// Bytes of the buffers it owns (its parts' included).
  std::size_t bytes() const noexcept {
    std::size_t total = storage.bytes();
    for (const auto& part : parts) total += part.bytes();
    return total;
  }
};

namespace detail {

/// Fills `saved` after a training forward of `owner`: the input rows [query, key, value],
/// the heads the kernel read, its output `context` and logsumexp, the caller's mask and the
/// resolved kernel options. The buffers the views point into belong to saved.storage or the caller.
template <class Scalar>
void record_forward(SavedForward<Scalar>& saved, const void* owner, std::uint64_t owner_id,
                    const CoreConfig& owner_config, const RowsRef<const Scalar> (&rows)[3],
                    bool self_attention, bool key_is_value, TensorView<const Scalar, 4> query,
                    TensorView<const Scalar, 4> key, TensorView<const Scalar, 4> value,
                    TensorView<const Scalar, 3> context,
                    const AttentionMask<compute_type_t<Scalar>>& mask,
                    const AttentionOptions& options,
                    TensorView<const compute_type_t<Scalar>, 3> logsumexp) {
  saved.owner = owner;
  saved.owner_id = owner_id;
  saved.owner_config = owner_config;
  saved.batch = query.extent(0);
  saved.query_tokens = query.extent(2);
  saved.key_tokens = key.extent(2);
  for (int p = 0; p < 3; ++p) saved.inputs[p] = rows[p];
  saved.self_attention = self_attention;
  saved.key_is_value = key_is_value;
  saved.query = query;
  saved.key = key;
  saved.value = value;
  saved.context = context;
  saved.logsumexp = logsumexp;
  saved.mask = mask;  // copy-assigned: no allocation once the key lengths' capacity suffices
  saved.options = options;
  // The scale as the call resolved it (unset means 1/sqrt(head_dim)), so the record says
  // what ran.
  if (!saved.options.scale) {
    saved.options.scale = 1.0 / std::sqrt(static_cast<double>(query.extent(3)));
  }
}

}  // namespace detail
ATTN_NAMESPACE_END
