// SPDX-License-Identifier: MIT
// attn/attention/multi_head_attention.hpp: MultiHeadAttention (self and cross, fused or
// separate Q/K/V, heads as views, out_proj), the notebooks' and nn.MultiheadAttention's.
#pragma once

#include <type_traits>

#include "attn/attention/module.hpp"
#include "attn/attention/module_core.hpp"
#include "attn/attention/qkv_projection.hpp"
#include "attn/config.hpp"
#include "attn/nn/linear.hpp"
#include "attn/nn/mask.hpp"
#include "attn/nn/parameter.hpp"
#include "attn/nn/random.hpp"
#include "attn/nn/rope.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"

ATTN_NAMESPACE_BEGIN

/// What MultiHeadAttention::forward_with_weights() returns: the output (B, T_q, d_out) and
/// the per-head weights (B, H, T_q, T_k); the one AttentionResult every module returns.
template <class Scalar>
using MultiHeadAttentionOutput = AttentionResult<Scalar, 3, 4>;

/// Averages per-head weights (B, H, T_q, T_k) over the heads -> (B, T_q, T_k), as
/// nn.MultiheadAttention does with average_attn_weights=True.
template <class Scalar>
Tensor<std::remove_const_t<Scalar>, 3> average_heads(TensorView<Scalar, 4> weights) {
  using S = std::remove_const_t<Scalar>;
  const Index b = weights.extent(0), h = weights.extent(1), tq = weights.extent(2),
              tk = weights.extent(3);
  Tensor<S, 3> mean({b, tq, tk});
  const S inv = h > 0 ? S(1) / static_cast<S>(h) : S(0);
  for (Index bi = 0; bi < b; ++bi) {
    for (Index i = 0; i < tq; ++i) {
      for (Index j = 0; j < tk; ++j) {
        S sum = 0;
        for (Index hi = 0; hi < h; ++hi) sum += weights(bi, hi, i, j);
        mean(bi, i, j) = sum * inv;
      }
    }
  }
  return mean;
}

/// Multi-head attention with Q/K/V projections and an output projection: the notebooks'
/// MultiHeadAttention / MultiHeadAttentionClass(d_in, d_out, context_length, dropout,
/// num_heads, qkv_bias), and (through MultiHeadAttentionOptions) torch.nn.MultiheadAttention
/// with kdim/vdim. Vaswani et al., "Attention Is All You Need" (2017).
///
/// Self-attention runs one GEMM with the fused [W_q; W_k; W_v] that writes a head-major
/// (B, 3H, T, hd) buffer; Q, K and V are strided views of it (no copies, no split step);
/// the kernel writes each head's context straight into a (B, T, H, hd) buffer, which *is*
/// (B, T, D) for out_proj. Cross-attention projects the query with W_q and the key/value
/// with one fused [W_k; W_v] GEMM when key and value are the same tensor (QkvProjection).
///
/// The module API (forward into a new tensor or into `out` with a Workspace, masks,
/// unbatched forms, forward_with_weights, train/eval, seed, freeze, named_parameters) is
/// every module's: see detail::ModuleForwards and detail::CoreModule. Its parameters are
/// nn.MultiheadAttention's (in_proj_weight or q/k/v_proj_weight, in_proj_bias, out_proj.*)
/// by default, or the notebooks' (ParameterNames::kNotebook: W_query.weight, ...).
///
/// Shapes: query (B, T_q, d_in), key (B, T_k, kdim), value (B, T_k, vdim) ->
/// (B, T_q, d_out); weights (B, H, T_q, T_k). Unbatched (T, d_in) inputs give (T, d_out).
/// Weights follow torch.nn.Linear: q_proj_weight() is (d_out, d_in) and y = x W^T + b.
///
/// Grouped-query and multi-query attention (MultiHeadAttentionOptions::num_kv_heads < num_heads,
/// Llama 2 70B, Llama 3, Mistral, Qwen2): W_k and W_v are (H_kv hd, kdim/vdim) and K, V have
/// H_kv heads; with head_dim set, W_q is (H hd, d_in) and out_proj (d_out, H hd). Query head
/// h reads key/value head h / (H / H_kv) (PyTorch's enable_gqa, Hugging Face's repeat_kv)
/// without copying K or V. Llama-family names: ParameterNames::kLlama (q_proj.weight, ...).
///
/// Value heads of their own size (MultiHeadAttentionOptions::value_head_dim = hd_v, DeepSeek's
/// 128 against queries and keys of 192): W_v is (H_kv hd_v, vdim), the context (B, T_q,
/// H hd_v) and out_proj (d_out, H hd_v); in_proj_weight stacks them, ((H + H_kv) hd + H_kv
/// hd_v, d_in). Every forward, the backward and the incremental forward (a KVCache with the
/// same KVCacheOptions::value_head_dim) follow it.
///
/// forward() is const and may be called from several threads at once (dropout's call
/// counter is atomic; give each thread its own Workspace).
///
/// bfloat16: MultiHeadAttention<bfloat16> holds bfloat16 weights and biases and takes and
/// returns bfloat16 tensors, masks in float; projections with float sums rounded once, the
/// bfloat16 attention kernel (docs/precision.md). Whole-sequence forwards (self and cross,
/// masks, causal, softcap, ALiBi, learned sinks (a bfloat16 parameter), grouped-query heads,
/// dropout, rotary embeddings), inference and training: backward() adds into
/// Gradients<bfloat16> (bfloat16 products, float sums; train it with optim::MixedPrecision),
/// the incremental forward through a KVCache<bfloat16> or a PagedKVCache<bfloat16>, and
/// packed batches (inference, training and the packed prefills). forward_with_weights does
/// not compile for it. Load float weights and convert<bfloat16>(module).
/// MultiHeadAttention<float16> is the same with float16 (IEEE binary16) weights, biases and
/// tensors, training included (Gradients<float16>; scale the loss, optim::MixedPrecision's
/// loss scaling): its products are widened to float on every kernel set.
///
/// @tparam Scalar float, double, bfloat16 or float16.
/// @throws ConfigError from the constructors if d_out % num_heads != 0, a size is not
///         positive or dropout is outside [0, 1); from forward() if a sequence exceeds
///         context_length. ShapeError from forward() on wrong shapes (naming them).
template <class Scalar = float>
class MultiHeadAttention
    : public detail::CoreModule<Scalar>,
      public detail::ModuleForwards<MultiHeadAttention<Scalar>, Scalar, 4, detail::InputX>,
      public detail::ModuleForwards<MultiHeadAttention<Scalar>, Scalar, 4, detail::InputQuery,
                                    detail::InputKey, detail::InputValue> {
  static_assert(std::is_floating_point_v<Scalar> || detail::is_gemm_storage_v<Scalar>,
                "attn::MultiHeadAttention: Scalar must be float, double, bfloat16 or float16 "
                "(inference)");
  using SelfForwards =
      detail::ModuleForwards<MultiHeadAttention<Scalar>, Scalar, 4, detail::InputX>;
  using Forwards = detail::ModuleForwards<MultiHeadAttention<Scalar>, Scalar, 4, detail::InputQuery,
                                          detail::InputKey, detail::InputValue>;
  using Base = detail::CoreModule<Scalar>;

 public:
  /// The notebooks' causal self-attention module. As in the notebook (003 In [220]),
  /// out_proj has a bias only if qkv_bias is set; use the options constructor otherwise.
  MultiHeadAttention(Index d_in, Index d_out, Index context_length, double dropout, Index num_heads,
                     bool qkv_bias = false)
      : MultiHeadAttention(
            notebook_options(d_in, d_out, context_length, dropout, num_heads, qkv_bias)) {}

  /// Any configuration; weights drawn from the global generator (see attn::manual_seed).
  explicit MultiHeadAttention(const MultiHeadAttentionOptions& options)
      : Base(config(options), nullptr) {}

  /// Any configuration; weights drawn from `gen`.
  MultiHeadAttention(const MultiHeadAttentionOptions& options, TorchGenerator& gen)
      : Base(config(options), &gen) {}

  /// `other` with its weights converted to Scalar: a float module's weights rounded once to
  /// bfloat16 or float16 (to nearest even), or widened back. Modes, dropout seed and scaling
  /// are kept; the result is not frozen. attn::convert<To>(module) says the same.
  template <class Other, class = std::enable_if_t<!std::is_same_v<Other, Scalar>>>
  explicit MultiHeadAttention(const MultiHeadAttention<Other>& other) : Base(other) {}

  /// Self-attention forward(x, ...) and forward(query, key, value, ...), each allocating or
  /// into `out` (with a Workspace), batched or unbatched, with an optional mask.
  using Forwards::forward;
  using Forwards::forward_with_weights;
  using SelfForwards::forward;
  using SelfForwards::forward_with_weights;
  /// backward(grad_out, saved, grad_x, grads, ws) after a self-attention training forward,
  /// backward(grad_out, saved, grad_query, grad_key, grad_value, grads, ws) after forward(query,
  /// key, value, ...) (give one view twice where one tensor was given twice).
  using Forwards::backward;
  using SelfForwards::backward;

  // ---- configuration (PyTorch names) ----

  Index embed_dim() const noexcept { return this->d_out(); }
  Index kdim() const noexcept { return this->core_.kdim(); }
  Index vdim() const noexcept { return this->core_.vdim(); }
  bool is_causal() const noexcept { return this->core_.config().causal; }
  bool has_qkv_bias() const noexcept { return this->core_.projection().has_bias(); }
  /// True when d_in == kdim == vdim, so Q/K/V share one (3 d_out, d_in) weight (((H + H_kv)
  /// hd + H_kv hd_v, d_in) with grouped-query attention or value_head_dim).
  bool qkv_same_embed_dim() const noexcept { return this->core_.projection().fused(); }

  // ---- parameters (PyTorch names; w_query() etc. give the notebooks' view) ----

  /// The fused (3 d_out, d_in) weight [W_q; W_k; W_v]; the non-const form unfreezes.
  /// @throws ConfigError when kdim or vdim differ from d_in (PyTorch has no in_proj_weight
  ///         then; use q/k/v_proj_weight()).
  TensorView<Scalar, 2> in_proj_weight() { return proj().fused_weight(kInProjWeight); }
  TensorView<const Scalar, 2> in_proj_weight() const { return proj().fused_weight(kInProjWeight); }
  /// (3 d_out) bias [b_q; b_k; b_v]; empty without qkv_bias.
  TensorView<Scalar, 1> in_proj_bias() noexcept { return proj().fused_bias(); }
  TensorView<const Scalar, 1> in_proj_bias() const noexcept { return proj().fused_bias(); }

  /// W_q (d_out, d_in), W_k (d_out, kdim), W_v (d_out, vdim) (H hd, H_kv hd and H_kv hd_v
  /// rows with head_dim, num_kv_heads or value_head_dim set); the non-const forms unfreeze.
  TensorView<Scalar, 2> q_proj_weight() noexcept { return proj().weight(0); }
  TensorView<Scalar, 2> k_proj_weight() noexcept { return proj().weight(1); }
  TensorView<Scalar, 2> v_proj_weight() noexcept { return proj().weight(2); }
  TensorView<const Scalar, 2> q_proj_weight() const noexcept { return proj().weight(0); }
  TensorView<const Scalar, 2> k_proj_weight() const noexcept { return proj().weight(1); }
  TensorView<const Scalar, 2> v_proj_weight() const noexcept { return proj().weight(2); }

  /// The output projection (d_out, H hd_v), H hd_v = d_out unless head_dim or value_head_dim
  /// is set; a Linear,
  /// which unfreezes itself when its weight is written through it.
  Linear<Scalar>& out_proj() noexcept { return this->core_.out_proj(); }
  const Linear<Scalar>& out_proj() const noexcept { return this->core_.out_proj(); }

  /// Loads a fused Q/K/V weight (3 d_out, d_in) and optional bias (3 d_out, or an empty
  /// view) in the given row layout.
  /// @throws ShapeError on wrong shapes; ConfigError if the dims differ (no fused weight).
  void set_in_proj(TensorView<const Scalar, 2> weight, TensorView<const Scalar, 1> bias = {},
                   QkvLayout layout = QkvLayout::kStacked) {
    proj().set_fused(weight, bias, layout, "MultiHeadAttention::set_in_proj");
  }

 private:
  static constexpr const char* kInProjWeight = "MultiHeadAttention::in_proj_weight";

  QkvProjection<Scalar>& proj() noexcept { return this->core_.projection(); }
  const QkvProjection<Scalar>& proj() const noexcept { return this->core_.projection(); }

  static MultiHeadAttentionOptions notebook_options(Index d_in, Index d_out, Index context_length,
                                                    double dropout, Index num_heads,
                                                    bool qkv_bias) {
    MultiHeadAttentionOptions o =
        MultiHeadAttentionOptions::pytorch(d_in, num_heads, qkv_bias, 0, 0, dropout);
    o.d_out = d_out;
    o.context_length = context_length;
    o.causal = true;
    o.init = InitScheme::kLinear;
    return o;
  }

  static detail::CoreConfig config(const MultiHeadAttentionOptions& o) {
    detail::CoreConfig c(o);
    c.name = "MultiHeadAttention";
    c.forward_name = "MultiHeadAttention::forward";
    if (c.d_out <= 0) c.d_out = o.d_in;
    c.out_proj = true;
    c.names = ParameterNames::kMultiheadAttention;
    return c;
  }

  template <class>
  friend class MultiHeadAttention;
};

/// `module` with its weights converted to `To` (MultiHeadAttention's converting constructor):
/// convert<bfloat16>(float_module) for a bfloat16 module.
template <class To, class From>
MultiHeadAttention<To> convert(const MultiHeadAttention<From>& module) {
  return MultiHeadAttention<To>(module);
}

ATTN_NAMESPACE_END
