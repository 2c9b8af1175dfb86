// SPDX-License-Identifier: MIT
// attn/attention/cross_attention.hpp: queries from one sequence, keys and values from another.
#pragma once

#include <cstdint>
#include <type_traits>

#include "attn/attention/multi_head_attention.hpp"
#include "attn/config.hpp"
#include "attn/nn/mask.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/workspace.hpp"

namespace attn {

/// Multi-head cross-attention for one (query source, key/value source) pair: queries from
/// x_q (B, T_q, d_q), keys and values from x_kv (B, T_kv, d_kv), lengths free to differ.
/// Notebook 000's MultiHeadAttention(num_heads, embed_dim) called with q_input and
/// k_input = v_input (its W_q/W_k/W_v have no bias by default; its output projection has
/// one). K and V come from one fused GEMM on x_kv.
///
/// Shapes: x_q (B, T_q, d_q), x_kv (B, T_kv, d_kv) -> (B, T_q, d_out).
/// @tparam Scalar float or double.
/// @throws as MultiHeadAttention.
template <class Scalar = float>
class CrossAttention {
 public:
  CrossAttention(Index d_q, Index d_kv, Index d_out, Index num_heads, bool qkv_bias = false,
                 double dropout = 0.0)
      : mha_(options(d_q, d_kv, d_out, num_heads, qkv_bias, dropout)) {}

  Tensor<Scalar, 3> forward(TensorView<const Scalar, 3> x_q, TensorView<const Scalar, 3> x_kv,
                            const AttentionMask<Scalar>& mask = {}) const {
    return mha_.forward(x_q, x_kv, x_kv, mask);
  }
  void forward(TensorView<const Scalar, 3> x_q, TensorView<const Scalar, 3> x_kv,
               TensorView<Scalar, 3> out, Workspace& ws,
               const AttentionMask<Scalar>& mask = {}) const {
    mha_.forward(x_q, x_kv, x_kv, out, ws, mask);
  }
  MultiHeadAttentionOutput<Scalar> forward_with_weights(TensorView<const Scalar, 3> x_q,
                                                        TensorView<const Scalar, 3> x_kv,
                                                        const AttentionMask<Scalar>& mask = {}) const {
    return mha_.forward_with_weights(x_q, x_kv, x_kv, mask);
  }

  void train(bool on = true) noexcept { mha_.train(on); }
  void eval() noexcept { mha_.eval(); }
  bool is_training() const noexcept { return mha_.is_training(); }
  void seed(std::uint64_t value) noexcept { mha_.seed(value); }
  /// See MultiHeadAttention::freeze(): weights packed once for inference.
  void freeze() { mha_.freeze(); }
  void unfreeze() noexcept { mha_.unfreeze(); }
  bool is_frozen() const noexcept { return mha_.is_frozen(); }

  /// The underlying module (weights: q_proj_weight(), k_proj_weight(), ..., out_proj()).
  MultiHeadAttention<Scalar>& module() noexcept { return mha_; }
  const MultiHeadAttention<Scalar>& module() const noexcept { return mha_; }

 private:
  static MultiHeadAttentionOptions options(Index d_q, Index d_kv, Index d_out, Index num_heads,
                                           bool qkv_bias, double dropout) {
    MultiHeadAttentionOptions o;
    o.d_in = d_q;
    o.d_out = d_out;
    o.num_heads = num_heads;
    o.kdim = d_kv;
    o.vdim = d_kv;
    o.qkv_bias = qkv_bias;
    o.out_bias = true;
    o.dropout = dropout;
    return o;
  }

  MultiHeadAttention<Scalar> mha_;
};

}  // namespace attn
