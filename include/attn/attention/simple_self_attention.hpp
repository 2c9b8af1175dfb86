// SPDX-License-Identifier: MIT
// attn/attention/simple_self_attention.hpp: self-attention without trainable weights.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "attn/attention/detail/module_support.hpp"
#include "attn/attention/kv_cache.hpp"
#include "attn/attention/module.hpp"
#include "attn/attention/saved_forward.hpp"
#include "attn/attention/scaled_dot_product.hpp"
#include "attn/attention/scaled_dot_product_backward.hpp"
#include "attn/config.hpp"
#include "attn/nn/gradients.hpp"
#include "attn/nn/mask.hpp"
#include "attn/nn/parameter.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN

/// Self-attention without trainable weights: scores = x x^T, weights = softmax(scores),
/// context = weights x (notebook 003, "a simple self-attention mechanism without
/// trainable weights"). Unscaled by default, as in the notebook; scaled(true) divides the
/// scores by sqrt(d).
///
/// It has the API of every module (see detail::ModuleForwards): forward into a new tensor
/// or into `out` with a Workspace, a mask, unbatched (T, d) inputs, forward_with_weights().
/// It has no parameters and no dropout: train()/eval() only record the mode, and
/// freeze()/unfreeze() do nothing. Nor has it the attention variants of the modules with
/// weights (AttentionVariants): a learned sink is a trainable parameter, which this module
/// by definition lacks, and a softcap or ALiBi on its x x^T scores is one
/// scaled_dot_product_attention() call on x as a single head (B, 1, T, d), whose
/// AttentionOptions take them (docs/variants.md).
///
/// Shapes: x (B, T, d) -> (B, T, d), or x (T, d) -> (T, d); weights (B, T, T) or (T, T).
/// @tparam Scalar float or double.
template <class Scalar = float>
class SimpleSelfAttention
    : public detail::ModuleForwards<SimpleSelfAttention<Scalar>, Scalar, 3, detail::InputX> {
  static_assert(std::is_floating_point_v<Scalar>,
                "attn::SimpleSelfAttention: Scalar must be float or double");

 public:
  explicit SimpleSelfAttention(bool scaled = false) : scaled_(scaled) {}

  bool scaled() const noexcept { return scaled_; }
  void set_scaled(bool on) noexcept { scaled_ = on; }

  void train(bool on = true) noexcept { training_ = on; }
  void eval() noexcept { train(false); }
  bool is_training() const noexcept { return training_; }
  void seed(std::uint64_t) noexcept {}
  void freeze() noexcept {}
  void unfreeze() noexcept {}
  bool is_frozen() const noexcept { return true; }
  /// No parameters and no buffers.
  ParameterList<Scalar> named_parameters(ParameterNames = ParameterNames::kDefault) { return {}; }
  ParameterList<const Scalar> named_parameters(ParameterNames = ParameterNames::kDefault) const {
    return {};
  }
  std::vector<NamedBuffer<Scalar>> named_buffers(ParameterNames = ParameterNames::kDefault) const {
    return {};
  }
  std::vector<ParameterNames> parameter_namings() const { return {ParameterNames::kNotebook}; }

 private:
  friend class detail::ModuleForwards<SimpleSelfAttention, Scalar, 3, detail::InputX>;

  // The kernel on x as one head: q = k = v = x (B, 1, T, d). A training forward reads x
  // from its rows (staged into saved->storage if strided) and keeps the kernel's output.
  void run_packed(const detail::ModuleInputs<Scalar>&, const PackedSequences&,
                  TensorView<Scalar, 3>, Workspace&, const AttentionMask<Scalar>&,
                  SavedForward<Scalar>*) const {
    detail::refuse_packed("SimpleSelfAttention::forward");
  }
  void run_prefill(const detail::ModuleInputs<Scalar>&, const PackedSequences&,
                   TensorView<Scalar, 3>, Workspace&, KVCache<Scalar>&) const {
    detail::refuse_packed("SimpleSelfAttention::forward");
  }
  void run_paged_prefill(const detail::ModuleInputs<Scalar>&, const PackedSequences&,
                         TensorView<Scalar, 3>, Workspace&, PagedKVCache<Scalar>&,
                         const std::vector<Index>&) const {
    detail::refuse_packed("SimpleSelfAttention::forward");
  }
  void run_paged(const detail::ModuleInputs<Scalar>&, TensorView<Scalar, 3>, Workspace&,
                 PagedKVCache<Scalar>&, const std::vector<Index>&) const {
    detail::refuse_cached("SimpleSelfAttention::forward",
                          "the module has no projections whose keys and values a cache could hold");
  }
  void run_cached(const detail::ModuleInputs<Scalar>&, TensorView<Scalar, 3>, Workspace&,
                  KVCache<Scalar>&, const AttentionMask<Scalar>&) const {
    detail::refuse_cached("SimpleSelfAttention::forward",
                          "the module has no projections whose keys and values a cache could hold");
  }
  void run(const detail::ModuleInputs<Scalar>& x, TensorView<Scalar, 3> out, Workspace& ws,
           const AttentionMask<Scalar>& mask, TensorView<Scalar, 4> weights,
           SavedForward<Scalar>* saved = nullptr) const {
    AttentionOptions options;
    options.scale = scaled_ ? 1.0 / std::sqrt(static_cast<double>(x.query.extent(2))) : 1.0;
    options.path =
        weights.data() != nullptr ? AttentionPath::kMaterialized : AttentionPath::kStreaming;
    if (saved == nullptr) {
      const TensorView<const Scalar, 4> x4 = unsqueeze(x.query, 1);
      scaled_dot_product_attention_with_weights<Scalar>(x4, x4, x4, unsqueeze(out, 1), weights, ws,
                                                        mask, options);
      return;
    }
    const Index batch = x.query.extent(0), tokens = x.query.extent(1), d = x.query.extent(2);
    const auto rows =
        detail::as_rows(x.query, saved->storage, detail::WorkspaceSlot::kQueryStaging);
    const TensorView<const Scalar, 4> x4(rows.data, {batch, 1, tokens, d},
                                         {tokens * rows.ld, tokens * rows.ld, rows.ld, 1});
    const TensorView<Scalar, 3> context(
        detail::workspace_get<Scalar>(saved->storage, detail::WorkspaceSlot::kContext,
                                      batch * tokens * d),
        {batch, tokens, d});
    const TensorView<Scalar, 3> lse(
        detail::workspace_get<Scalar>(saved->storage, detail::WorkspaceSlot::kLogsumexp,
                                      batch * tokens),
        {batch, 1, tokens});
    detail::attend("scaled_dot_product_attention", x4, x4, x4, unsqueeze(context, 1), mask, options,
                   weights, ws, {}, lse);
    detail::record_forward<Scalar>(*saved, this, 0, {}, {rows, rows, rows}, true, true, x4, x4, x4,
                                   context, mask, options, lse);
    copy(TensorView<const Scalar, 3>(context), out);
  }
  // The kernel's backward with q = k = v = x: the one input gradient receives dQ + dK + dV.
  void run_backward(TensorView<const Scalar, 3> grad_out, const SavedForward<Scalar>& saved,
                    const TensorView<Scalar, 3> (&grad_in)[3], Gradients<Scalar>&,
                    Workspace& ws) const {
    const char* where = "SimpleSelfAttention::backward";
    detail::require(saved.owner == this, where, [] {
      return std::string("`saved` was not filled by this module's training forward");
    });
    const Shape<3> expected{saved.batch, saved.query_tokens, saved.query.extent(3)};
    detail::require(grad_out.shape() == expected &&
                        (grad_in[0].data() == nullptr || grad_in[0].shape() == expected),
                    where, [&] {
                      return "grad_out has shape " + detail::to_string(grad_out.shape()) +
                             " and grad_x " + detail::to_string(grad_in[0].shape()) +
                             ", expected " + detail::to_string(expected);
                    });
    if (grad_in[0].data() == nullptr) return;  // no parameters: nothing else to compute
    const TensorView<Scalar, 4> g = unsqueeze(grad_in[0], 1);
    detail::attend_backward<Scalar>(
        where, saved.query, saved.key, saved.value, unsqueeze(saved.context, 1), saved.logsumexp,
        {unsqueeze(grad_out, 1), g, g, g}, saved.mask, saved.options, ws);
  }
  Index output_features(const detail::ModuleInputs<Scalar>& x) const noexcept {
    return x.value.extent(2);
  }
  const char* forward_where() const noexcept { return "SimpleSelfAttention::forward"; }

  bool scaled_;
  bool training_ = true;
};

ATTN_NAMESPACE_END
