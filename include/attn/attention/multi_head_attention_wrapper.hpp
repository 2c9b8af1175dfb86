// SPDX-License-Identifier: MIT
// attn/attention/multi_head_attention_wrapper.hpp: independent causal heads, concatenated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/attention/causal_attention.hpp"
#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/nn/random.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"
#include "attn/workspace.hpp"

namespace attn {

/// A stack of independent CausalAttention heads whose outputs are concatenated along the
/// last axis: notebook 003's MultiHeadAttentionWrapper(d_in, d_out, context_length,
/// dropout, num_heads, qkv_bias). Each head writes straight into its slice of the output.
/// MultiHeadAttention computes the same kind of layer with one fused projection.
///
/// Shapes: x (B, T, d_in) -> (B, T, num_heads * d_out).
/// @tparam Scalar float or double.
/// @throws std::invalid_argument from the constructor if num_heads <= 0 (and as
///         CausalAttention does); ShapeError / std::invalid_argument from forward() as
///         CausalAttention::forward.
template <class Scalar = float>
class MultiHeadAttentionWrapper {
 public:
  /// Draws each head's W_query, W_key, W_value in head order from the global generator.
  MultiHeadAttentionWrapper(Index d_in, Index d_out, Index context_length, double dropout,
                            Index num_heads = 2, bool qkv_bias = false) {
    detail::require_arg(num_heads > 0 && d_in > 0 && d_out > 0 && context_length > 0,
                        "MultiHeadAttentionWrapper", [&] {
                          return "d_in=" + std::to_string(d_in) + ", d_out=" +
                                 std::to_string(d_out) + ", context_length=" +
                                 std::to_string(context_length) + ", num_heads=" +
                                 std::to_string(num_heads) + ": sizes must be positive";
                        });
    detail::check_dropout(dropout, "MultiHeadAttentionWrapper");
    heads_.reserve(static_cast<std::size_t>(num_heads));
    for (Index h = 0; h < num_heads; ++h) {
      heads_.emplace_back(d_in, d_out, context_length, dropout, qkv_bias);
    }
    seed(kDefaultDropoutSeed);
  }

  /// (B, T, num_heads * d_out).
  Tensor<Scalar, 3> forward(TensorView<const Scalar, 3> x) const {
    Tensor<Scalar, 3> out({x.extent(0), x.extent(1), d_out()});
    Workspace ws;
    forward(x, out.view(), ws);
    return out;
  }

  /// Into a preallocated `out` (B, T, num_heads * d_out), reusing `ws`.
  /// @throws ShapeError if out's shape is wrong.
  void forward(TensorView<const Scalar, 3> x, TensorView<Scalar, 3> out, Workspace& ws) const {
    const Shape<3> expected{x.extent(0), x.extent(1), d_out()};
    detail::require(out.shape() == expected, "MultiHeadAttentionWrapper::forward", [&] {
      return "out has shape " + detail::to_string(out.shape()) + ", expected " +
             detail::to_string(expected);
    });
    const Index width = heads_.front().d_out();
    for (std::size_t h = 0; h < heads_.size(); ++h) {
      const Index begin = static_cast<Index>(h) * width;
      heads_[h].forward(x, slice(out, 2, begin, begin + width), ws);
    }
  }

  Index num_heads() const noexcept { return static_cast<Index>(heads_.size()); }
  /// Output width: num_heads * (each head's d_out).
  Index d_out() const noexcept { return num_heads() * heads_.front().d_out(); }
  CausalAttention<Scalar>& head(Index h) { return heads_.at(static_cast<std::size_t>(h)); }
  const CausalAttention<Scalar>& head(Index h) const {
    return heads_.at(static_cast<std::size_t>(h));
  }

  void train(bool on = true) noexcept {
    for (auto& head : heads_) head.train(on);
  }
  void eval() noexcept { train(false); }
  bool is_training() const noexcept { return heads_.front().is_training(); }
  /// Seeds every head's dropout (head h gets a distinct stream derived from `value`).
  void seed(std::uint64_t value) noexcept {
    for (std::size_t h = 0; h < heads_.size(); ++h) heads_[h].seed(detail::mix64(value + h));
  }

 private:
  std::vector<CausalAttention<Scalar>> heads_;
};

}  // namespace attn
