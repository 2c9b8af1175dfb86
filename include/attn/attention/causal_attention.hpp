// SPDX-License-Identifier: MIT
// attn/attention/causal_attention.hpp: single-head causal self-attention with dropout.
#pragma once

#include <cstdint>
#include <type_traits>

#include "attn/attention/self_attention.hpp"
#include "attn/config.hpp"

namespace attn {

/// Single-head causal self-attention with dropout on the attention weights: notebook 003's
/// CausalAttention(d_in, d_out, context_length, dropout, qkv_bias). Token i attends to
/// tokens j <= i; the mask is a loop bound in the kernel, not a stored triangle.
/// A further AttentionMask passed to forward() combines with the causal bound.
///
/// Shapes: x (B, T, d_in) -> (B, T, d_out) with T <= context_length; unbatched (T, d_in)
/// -> (T, d_out).
/// @tparam Scalar float or double.
/// @throws std::invalid_argument from the constructor on non-positive sizes or dropout
///         outside [0, 1); from forward() when T > context_length. ShapeError from forward()
///         on wrong shapes.
template <class Scalar = float>
class CausalAttention : public SelfAttention<Scalar> {
  using Base = SelfAttention<Scalar>;

 public:
  /// Draws W_query, W_key, W_value (in that order) like nn.Linear from the global generator.
  CausalAttention(Index d_in, Index d_out, Index context_length, double dropout,
                  bool qkv_bias = false)
      : Base(d_in, d_out, qkv_bias, check_context_length(context_length), dropout, true,
             "CausalAttention", "CausalAttention::forward", Base::Init::kLinear) {}

  Index context_length() const noexcept { return this->context_length_; }
  double dropout() const noexcept { return this->dropout_.p(); }

  /// Training mode applies dropout to the attention weights (modules start in training
  /// mode, like PyTorch's); eval() turns it off.
  void train(bool on = true) noexcept { this->dropout_.train(on); }
  void eval() noexcept { train(false); }
  bool is_training() const noexcept { return this->dropout_.is_training(); }
  /// Restarts the dropout stream with a seed.
  void seed(std::uint64_t value) noexcept { this->dropout_.seed(value); }

 private:
  static Index check_context_length(Index context_length) {
    detail::require_arg(context_length > 0, "CausalAttention", [&] {
      return "context_length=" + std::to_string(context_length) + " must be positive";
    });
    return context_length;
  }
};

}  // namespace attn
