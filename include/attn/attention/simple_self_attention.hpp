// SPDX-License-Identifier: MIT
// attn/attention/simple_self_attention.hpp: self-attention without trainable weights.
#pragma once

#include <type_traits>

#include "attn/attention/scaled_dot_product.hpp"
#include "attn/config.hpp"
#include "attn/nn/mask.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"

namespace attn {

/// Self-attention without trainable weights: scores = x x^T, weights = softmax(scores),
/// context = weights x (notebook 003, "a simple self-attention mechanism without
/// trainable weights"). Unscaled by default, as in the notebook; scaled(true) divides the
/// scores by sqrt(d).
///
/// Shapes: x (T, d) -> (T, d), or x (B, T, d) -> (B, T, d).
/// @tparam Scalar float or double.
template <class Scalar = float>
class SimpleSelfAttention {
  static_assert(std::is_floating_point_v<Scalar>,
                "attn::SimpleSelfAttention: Scalar must be float or double");

 public:
  explicit SimpleSelfAttention(bool scaled = false) : scaled_(scaled) {}

  bool scaled() const noexcept { return scaled_; }
  void set_scaled(bool on) noexcept { scaled_ = on; }

  /// Context vectors. @throws ShapeError on empty input or a misfitting mask.
  template <class XScalar, std::size_t Rank>
  Tensor<Scalar, Rank> forward(TensorView<XScalar, Rank> x,
                               const AttentionMask<Scalar>& mask = {}) const {
    static_assert(std::is_same_v<std::remove_const_t<XScalar>, Scalar>,
                  "attn::SimpleSelfAttention::forward: x must hold the module's Scalar");
    const TensorView<const Scalar, Rank> cx(x);
    return scaled_dot_product_attention(cx, cx, cx, mask, options());
  }
  template <std::size_t Rank>
  Tensor<Scalar, Rank> forward(const Tensor<Scalar, Rank>& x,
                               const AttentionMask<Scalar>& mask = {}) const {
    return forward(x.view(), mask);
  }

  /// Context vectors and the attention weights (T, T) or (B, T, T).
  template <class XScalar, std::size_t Rank>
  AttentionResult<Scalar, Rank> forward_with_weights(TensorView<XScalar, Rank> x,
                                                     const AttentionMask<Scalar>& mask = {}) const {
    static_assert(std::is_same_v<std::remove_const_t<XScalar>, Scalar>,
                  "attn::SimpleSelfAttention::forward_with_weights: x must hold the module's "
                  "Scalar");
    const TensorView<const Scalar, Rank> cx(x);
    return scaled_dot_product_attention_with_weights(cx, cx, cx, mask, options());
  }
  template <std::size_t Rank>
  AttentionResult<Scalar, Rank> forward_with_weights(const Tensor<Scalar, Rank>& x,
                                                     const AttentionMask<Scalar>& mask = {}) const {
    return forward_with_weights(x.view(), mask);
  }

 private:
  AttentionOptions options() const {
    AttentionOptions o;
    if (!scaled_) o.scale = 1.0;
    return o;
  }

  bool scaled_;
};

}  // namespace attn
