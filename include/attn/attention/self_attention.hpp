// SPDX-License-Identifier: MIT
// attn/attention/self_attention.hpp: single-head self-attention with trainable W_query,
// W_key, W_value (the notebooks' SelfAttention_v1 / SelfAttention_v2 / SingleHeadAttention).
#pragma once

#include <type_traits>

#include "attn/attention/module.hpp"
#include "attn/attention/module_core.hpp"
#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/nn/parameter.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"

ATTN_NAMESPACE_BEGIN

/// Tag: initialise the projections as `nn.Parameter(torch.rand(d_in, d_out))`, the raw
/// parameter form of the notebook's SelfAttention_v1, instead of nn.Linear's init.
struct RandInit {};
inline constexpr RandInit kRandInit{};

/// Single-head self-attention with trainable projections:
/// softmax(q k^T * scale + mask) v with q = x W_q^T + b_q (and k, v alike); with the
/// variants (AttentionVariants: softcap, ALiBi, a learned sink; docs/variants.md) as every
/// module with weights runs them.
/// Notebook 003's SelfAttention_v1 (raw `rand` parameters, x @ W), SelfAttention_v2
/// (nn.Linear, optional bias) and notebook 001's SingleHeadAttention (bias, no scaling).
///
/// The weights are stored in nn.Linear's layout (d_out, d_in), one (3 d_out, d_in) block,
/// so the three projections are one GEMM. The raw form's (d_in, d_out) matrices, applied as
/// x @ W, are their transposes: from_parameters() takes them as they are, and a module
/// built as SelfAttention_v1 names its parameters W_query, W_key, W_value (d_in, d_out)
/// like the notebook (ParameterNames::kNotebookRaw); SelfAttention_v2 names them
/// W_query.weight, ... (kNotebook). Scaling by 1/sqrt(d_out) is on by default;
/// set_scaled(false) gives notebook 001's unscaled SingleHeadAttention.
///
/// The module API (forward, forward_with_weights, unbatched forms, masks, train/eval, seed,
/// freeze, named_parameters) is every module's: see detail::ModuleForwards and
/// detail::CoreModule.
///
/// Shapes: x (B, T, d_in) -> (B, T, d_out); unbatched x (T, d_in) -> (T, d_out); weights
/// (B, T, T).
///
/// bfloat16 and float16: SelfAttention<bfloat16> runs MultiHeadAttention<bfloat16>'s core
/// (bfloat16 weights and biases, float sums and softmax, docs/precision.md) with the same
/// limits: whole-sequence forwards (inference and training) and backward, masks in float;
/// convert<bfloat16>(module) rounds a float module's weights once. float16 the same.
/// @tparam Scalar float, double, bfloat16 or float16.
/// @throws ConfigError from the constructors on non-positive sizes.
template <class Scalar = float>
class SelfAttention
    : public detail::CoreModule<Scalar>,
      public detail::ModuleForwards<SelfAttention<Scalar>, Scalar, 3, detail::InputX> {
  static_assert(std::is_floating_point_v<Scalar> || detail::is_gemm_storage_v<Scalar>,
                "attn::SelfAttention: Scalar must be float, double, bfloat16 or float16 "
                "(inference)");

 public:
  /// SelfAttention_v2: three nn.Linear(d_in, d_out, bias=qkv_bias), drawn in the order
  /// W_query, W_key, W_value from the global generator; `variants` as
  /// MultiHeadAttentionOptions's, for its one head (one ALiBi slope, one sink).
  SelfAttention(Index d_in, Index d_out, bool qkv_bias = false,
                const AttentionVariants& variants = {})
      : SelfAttention(config(d_in, d_out, qkv_bias, InitScheme::kLinear, ParameterNames::kNotebook,
                             variants)) {}

  /// SelfAttention_v1: three torch.rand(d_in, d_out) parameters (no bias), drawn in the
  /// order W_query, W_key, W_value from the global generator.
  SelfAttention(Index d_in, Index d_out, RandInit)
      : SelfAttention(config(d_in, d_out, false, InitScheme::kRand, ParameterNames::kNotebookRaw)) {
  }

  /// `other` with its weights converted to Scalar (each rounded once to nearest even when
  /// narrowing, widened exactly otherwise); modes, dropout seed and scaling kept.
  /// attn::convert<To>(module) says the same.
  template <class Other, class = std::enable_if_t<!std::is_same_v<Other, Scalar>>>
  explicit SelfAttention(const SelfAttention<Other>& other) : detail::CoreModule<Scalar>(other) {}

  /// The raw form with given (d_in, d_out) matrices, applied as x @ W (no bias).
  /// @throws ShapeError if the three shapes differ or are empty.
  static SelfAttention from_parameters(TensorView<const Scalar, 2> w_query,
                                       TensorView<const Scalar, 2> w_key,
                                       TensorView<const Scalar, 2> w_value) {
    detail::require(
        w_query.shape() == w_key.shape() && w_key.shape() == w_value.shape() && !w_query.empty(),
        "SelfAttention::from_parameters", [&] {
          return "W_query " + detail::to_string(w_query.shape()) + ", W_key " +
                 detail::to_string(w_key.shape()) + ", W_value " +
                 detail::to_string(w_value.shape()) +
                 " must share one non-empty (d_in, d_out) shape";
        });
    SelfAttention module(config(w_query.extent(0), w_query.extent(1), false, InitScheme::kNone,
                                ParameterNames::kNotebookRaw));
    module.w_query().set_weight(transpose(w_query));
    module.w_key().set_weight(transpose(w_key));
    module.w_value().set_weight(transpose(w_value));
    return module;
  }

 protected:
  explicit SelfAttention(const detail::CoreConfig& config)
      : detail::CoreModule<Scalar>(config, nullptr) {}

  /// The configuration of a single-head module without output projection; CausalAttention
  /// adds its causal bound, context_length and dropout.
  static detail::CoreConfig config(Index d_in, Index d_out, bool qkv_bias, InitScheme init,
                                   ParameterNames names, const AttentionVariants& variants = {}) {
    detail::CoreConfig c;
    static_cast<AttentionVariants&>(c) = variants;
    c.name = "SelfAttention";
    c.forward_name = "SelfAttention::forward";
    c.input_name = "x";
    c.d_in = d_in;
    c.d_out = d_out;
    c.qkv_bias = qkv_bias;
    c.init = init;
    c.names = names;
    return c;
  }

 private:
  friend class detail::ModuleForwards<SelfAttention, Scalar, 3, detail::InputX>;
};

/// `module` with its weights converted to `To`: convert<bfloat16>(float_module).
template <class To, class From>
SelfAttention<To> convert(const SelfAttention<From>& module) {
  return SelfAttention<To>(module);
}

ATTN_NAMESPACE_END
