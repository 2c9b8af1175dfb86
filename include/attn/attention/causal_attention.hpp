// SPDX-License-Identifier: MIT
// attn/attention/causal_attention.hpp: single-head causal self-attention with dropout.
#pragma once

#include <string>
#include <type_traits>

#include "attn/attention/module_core.hpp"
#include "attn/attention/self_attention.hpp"
#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/nn/parameter.hpp"

ATTN_NAMESPACE_BEGIN

/// Single-head causal self-attention with dropout on the attention weights: notebook 003's
/// CausalAttention(d_in, d_out, context_length, dropout, qkv_bias). Token i attends to
/// tokens j <= i; the mask is a loop bound in the kernel, not a stored triangle.
/// A further AttentionMask passed to forward() combines with the causal bound.
/// Its parameters are W_query.weight, W_key.weight, W_value.weight (+ .bias); its state_dict
/// also holds the notebook's `mask` buffer (named_buffers()).
///
/// Shapes: x (B, T, d_in) -> (B, T, d_out) with T <= context_length; unbatched (T, d_in)
/// -> (T, d_out).
/// @tparam Scalar float, double, bfloat16 or float16 (as SelfAttention<bfloat16>, <float16>).
/// @throws ConfigError from the constructor on non-positive sizes or dropout outside
///         [0, 1); from forward() when T > context_length. ShapeError from forward() on
///         wrong shapes.
template <class Scalar = float>
class CausalAttention : public SelfAttention<Scalar> {
  using Base = SelfAttention<Scalar>;

 public:
  /// Draws W_query, W_key, W_value (in that order) like nn.Linear from the global generator.
  /// `variants`: as MultiHeadAttentionOptions's, for its one head (ALiBi's distances from
  /// query i's own position i; the sink a parameter `sinks` of shape (1)).
  CausalAttention(Index d_in, Index d_out, Index context_length, double dropout,
                  bool qkv_bias = false, const AttentionVariants& variants = {})
      : Base(config(d_in, d_out, context_length, dropout, qkv_bias, variants)) {}

  /// `other` with its weights converted to Scalar (see SelfAttention's converting constructor).
  template <class Other, class = std::enable_if_t<!std::is_same_v<Other, Scalar>>>
  explicit CausalAttention(const CausalAttention<Other>& other) : Base(other) {}

 private:
  static detail::CoreConfig config(Index d_in, Index d_out, Index context_length, double dropout,
                                   bool qkv_bias, const AttentionVariants& variants) {
    detail::require_config(context_length > 0, "CausalAttention", [&] {
      return "context_length=" + std::to_string(context_length) + " must be positive";
    });
    detail::CoreConfig c = Base::config(d_in, d_out, qkv_bias, InitScheme::kLinear,
                                        ParameterNames::kNotebook, variants);
    c.name = "CausalAttention";
    c.forward_name = "CausalAttention::forward";
    c.context_length = context_length;
    c.dropout = dropout;
    c.causal = true;
    return c;
  }
};

/// `module` with its weights converted to `To`: convert<bfloat16>(float_module).
template <class To, class From>
CausalAttention<To> convert(const CausalAttention<From>& module) {
  return CausalAttention<To>(module);
}

ATTN_NAMESPACE_END
