// SPDX-License-Identifier: MIT
// attn/attention/cross_attention.hpp: queries from one sequence, keys and values from another.
#pragma once

#include <type_traits>

#include "attn/attention/module.hpp"
#include "attn/attention/multi_head_attention.hpp"
#include "attn/config.hpp"

ATTN_NAMESPACE_BEGIN

/// Multi-head cross-attention for one (query source, key/value source) pair: queries from
/// x_q (B, T_q, d_q), keys and values from x_kv (B, T_kv, d_kv), lengths free to differ.
/// Notebook 000's MultiHeadAttention(num_heads, embed_dim) called with q_input and
/// k_input = v_input (its W_q/W_k/W_v have no bias by default; its output projection has
/// one). It is a MultiHeadAttention (module()) with kdim = vdim = d_kv, called as
/// forward(x_q, x_kv, x_kv): K and V come from one fused GEMM on x_kv. Its parameters are
/// nn.MultiheadAttention's (q_proj_weight, k_proj_weight, ..., out_proj.*).
///
/// Shapes: x_q (B, T_q, d_q), x_kv (B, T_kv, d_kv) -> (B, T_q, d_out), weights
/// (B, H, T_q, T_kv); unbatched (T_q, d_q), (T_kv, d_kv) -> (T_q, d_out).
/// @tparam Scalar float, double, bfloat16 or float16, as MultiHeadAttention<bfloat16> and
///         <float16>.
/// @throws as MultiHeadAttention.
template <class Scalar = float>
class CrossAttention : private MultiHeadAttention<Scalar>,
                       public detail::ModuleForwards<CrossAttention<Scalar>, Scalar, 4,
                                                     detail::InputQuery, detail::InputKeyValue> {
  using Module = MultiHeadAttention<Scalar>;
  using Forwards = detail::ModuleForwards<CrossAttention<Scalar>, Scalar, 4, detail::InputQuery,
                                          detail::InputKeyValue>;

 public:
  /// `variants` as MultiHeadAttentionOptions's. ALiBi measures query i's distance to key j
  /// from position i + T_kv - T_q (the queries aligned with the keys' end, as a causal bound
  /// aligned bottom-right), the SDPA's rule for a call without a causal bound.
  CrossAttention(Index d_q, Index d_kv, Index d_out, Index num_heads, bool qkv_bias = false,
                 double dropout = 0.0, const AttentionVariants& variants = {})
      : Module(options(d_q, d_kv, d_out, num_heads, qkv_bias, dropout, variants)) {}

  /// `other` with its weights converted to Scalar (see MultiHeadAttention's converting
  /// constructor); attn::convert<To>(module) says the same.
  template <class Other, class = std::enable_if_t<!std::is_same_v<Other, Scalar>>>
  explicit CrossAttention(const CrossAttention<Other>& other) : Module(other.module()) {}

  /// forward(x_q, x_kv, ...) and forward_with_weights(x_q, x_kv, ...), as every module's.
  using Forwards::forward;
  using Forwards::forward_with_weights;
  /// backward(grad_out, saved, grad_x_q, grad_x_kv, grads, ws) after a training forward.
  using Forwards::backward;

  using Module::eval;
  using Module::freeze;
  using Module::is_frozen;
  using Module::is_training;
  using Module::named_buffers;
  using Module::named_parameters;
  using Module::parameter_namings;
  using Module::seed;
  using Module::sinks;
  using Module::train;
  using Module::unfreeze;

  /// The underlying module (weights: q_proj_weight(), k_proj_weight(), ..., out_proj()).
  MultiHeadAttention<Scalar>& module() noexcept { return *this; }
  const MultiHeadAttention<Scalar>& module() const noexcept { return *this; }

 private:
  friend Forwards;
  using Module::forward_where;
  using Module::output_features;
  using Module::run;
  using Module::run_backward;
  using Module::run_cached;
  using Module::run_packed;
  using Module::run_paged_prefill;
  using Module::run_prefill;
  using Module::weight_heads;

  // nn.MultiheadAttention's layout with kdim = vdim = d_kv, but the notebook's widths, its
  // nn.Linear init and an out_proj bias whatever qkv_bias says.
  static MultiHeadAttentionOptions options(Index d_q, Index d_kv, Index d_out, Index num_heads,
                                           bool qkv_bias, double dropout,
                                           const AttentionVariants& variants) {
    MultiHeadAttentionOptions o =
        MultiHeadAttentionOptions::pytorch(d_q, num_heads, qkv_bias, d_kv, d_kv, dropout);
    static_cast<AttentionVariants&>(o) = variants;
    o.d_out = d_out;
    o.out_bias = true;
    o.init = InitScheme::kLinear;
    return o;
  }
};

/// `module` with its weights converted to `To`: convert<bfloat16>(float_module).
template <class To, class From>
CrossAttention<To> convert(const CrossAttention<From>& module) {
  return CrossAttention<To>(module);
}

ATTN_NAMESPACE_END
