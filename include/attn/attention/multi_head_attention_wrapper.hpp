// SPDX-License-Identifier: MIT
// attn/attention/multi_head_attention_wrapper.hpp: independent causal heads, concatenated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/attention/causal_attention.hpp"
#include "attn/attention/core_config.hpp"
#include "attn/attention/module.hpp"
#include "attn/attention/saved_forward.hpp"
#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/kernels/attention_args.hpp"
#include "attn/nn/gradients.hpp"
#include "attn/nn/mask.hpp"
#include "attn/nn/parameter.hpp"
#include "attn/nn/random.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN

/// A stack of independent CausalAttention heads whose outputs are concatenated along the
/// last axis: notebook 003's MultiHeadAttentionWrapper(d_in, d_out, context_length,
/// dropout, num_heads, qkv_bias), with the variants of every module (AttentionVariants,
/// per head). Each head runs the module core on its own weights and writes straight into
/// its slice of the output. MultiHeadAttention computes the same kind of layer with one
/// fused projection.
///
/// The module API is every module's (detail::ModuleForwards). A mask applies to every
/// head, or per head when its H extent is num_heads; forward_with_weights() gives each
/// head's weights (B, H, T, T). Parameters are heads.<h>.W_query.weight, ... (+ the
/// heads.<h>.mask buffers), as in the notebook's state_dict.
///
/// Shapes: x (B, T, d_in) -> (B, T, num_heads * d_out); unbatched (T, d_in) ->
/// (T, num_heads * d_out).
///
/// In place (forward(x, x, ws) with d_in == num_heads * d_out) is correct: x is copied
/// before the first head writes. Const members are safe from several threads at once (each
/// with its own Workspace); non-const ones (train, eval, seed, freeze, head(h), loading)
/// need exclusive access.
///
/// bfloat16 and float16: every head is a CausalAttention<bfloat16> (<float16>), so the
/// wrapper has its limits: masks in float, no attention weights (forward_with_weights does
/// not compile); it trains (backward into Gradients<bfloat16> or <float16>).
/// convert<bfloat16>(wrapper) rounds each head's weights once.
/// @tparam Scalar float, double, bfloat16 or float16.
/// @throws ConfigError from the constructor if a size is not positive (and as
///         CausalAttention does); ShapeError / ConfigError from forward() as
///         CausalAttention::forward.
template <class Scalar = float>
class MultiHeadAttentionWrapper
    : public detail::ModuleForwards<MultiHeadAttentionWrapper<Scalar>, Scalar, 4, detail::InputX> {
  using Forwards =
      detail::ModuleForwards<MultiHeadAttentionWrapper<Scalar>, Scalar, 4, detail::InputX>;
  using Mask = AttentionMask<compute_type_t<Scalar>>;  // float for bfloat16 and float16
  static constexpr bool kStorage = !std::is_floating_point_v<Scalar>;
  template <class>
  friend class MultiHeadAttentionWrapper;

 public:
  /// Draws each head's W_query, W_key, W_value in head order from the global generator.
  /// `variants` as MultiHeadAttentionOptions's for num_heads heads: head h runs the softcap,
  /// ALiBi with the slope of head h (given, or the standard series of num_heads heads) and,
  /// with sinks, its own parameter heads.<h>.sinks (1): MultiHeadAttention's computation
  /// head by head.
  MultiHeadAttentionWrapper(Index d_in, Index d_out, Index context_length, double dropout,
                            Index num_heads = 2, bool qkv_bias = false,
                            const AttentionVariants& variants = {}) {
    detail::require_config(num_heads > 0, "MultiHeadAttentionWrapper", [&] {
      return "num_heads=" + std::to_string(num_heads) + " must be positive";
    });
    detail::check_dropout(dropout, "MultiHeadAttentionWrapper");
    detail::require_config(
        variants.alibi_slopes.empty() ||
            static_cast<Index>(variants.alibi_slopes.size()) == num_heads,
        "MultiHeadAttentionWrapper", [&] {
          return "alibi_slopes has " + std::to_string(variants.alibi_slopes.size()) +
                 " values, expected one per head: num_heads=" + std::to_string(num_heads);
        });
    heads_.reserve(static_cast<std::size_t>(num_heads));
    for (Index h = 0; h < num_heads; ++h) {
      heads_.emplace_back(d_in, d_out, context_length, dropout, qkv_bias,
                          head_variants(variants, h, num_heads));
    }
    seed(kDefaultDropoutSeed);
  }

  /// `other` with each head's weights converted to Scalar (rounded once to nearest even when
  /// narrowing, widened exactly otherwise); modes and dropout seeds kept.
  /// attn::convert<To>(wrapper) says the same.
  template <class Other, class = std::enable_if_t<!std::is_same_v<Other, Scalar>>>
  explicit MultiHeadAttentionWrapper(const MultiHeadAttentionWrapper<Other>& other) {
    heads_.reserve(other.heads_.size());
    for (const auto& head : other.heads_) heads_.emplace_back(head);
  }

  Index num_heads() const noexcept { return static_cast<Index>(heads_.size()); }
  Index d_in() const noexcept { return heads_.front().d_in(); }
  /// Output width: num_heads * (each head's d_out).
  Index d_out() const noexcept { return num_heads() * heads_.front().d_out(); }
  Index context_length() const noexcept { return heads_.front().context_length(); }
  double dropout() const noexcept { return heads_.front().dropout(); }
  /// Head h. @throws IndexError if h is not in [0, num_heads).
  CausalAttention<Scalar>& head(Index h) { return heads_[checked_head(h)]; }
  const CausalAttention<Scalar>& head(Index h) const { return heads_[checked_head(h)]; }

  void train(bool on = true) noexcept {
    for (auto& head : heads_) head.train(on);
  }
  void eval() noexcept { train(false); }
  bool is_training() const noexcept { return heads_.front().is_training(); }
  /// Seeds every head's dropout (head h gets a distinct stream derived from `value`).
  void seed(std::uint64_t value) noexcept {
    for (std::size_t h = 0; h < heads_.size(); ++h) heads_[h].seed(detail::mix64(value + h));
  }
  void freeze() {
    for (auto& head : heads_) head.freeze();
  }
  void unfreeze() noexcept {
    for (auto& head : heads_) head.unfreeze();
  }
  bool is_frozen() const noexcept {
    for (const auto& head : heads_) {
      if (!head.is_frozen()) return false;
    }
    return true;
  }

  /// heads.<h>.<the head's names>, head by head; the non-const form unfreezes.
  ParameterList<Scalar> named_parameters(ParameterNames names = ParameterNames::kDefault) {
    return parameters_of(*this, names);
  }
  ParameterList<const Scalar> named_parameters(
      ParameterNames names = ParameterNames::kDefault) const {
    return parameters_of(*this, names);
  }
  std::vector<NamedBuffer<Scalar>> named_buffers(
      ParameterNames names = ParameterNames::kDefault) const {
    std::vector<NamedBuffer<Scalar>> buffers;
    for (std::size_t h = 0; h < heads_.size(); ++h) {
      for (auto& buffer : heads_[h].named_buffers(names)) {
        buffers.push_back({prefix(h) + buffer.name, std::move(buffer.value)});
      }
    }
    return buffers;
  }
  std::vector<ParameterNames> parameter_namings() const {
    return heads_.front().parameter_namings();
  }

 private:
  friend Forwards;

  static std::string prefix(std::size_t h) { return "heads." + std::to_string(h) + "."; }
  // The variants of head h of `heads`: the same, with its one ALiBi slope given (a single-head
  // module's standard series would be the first head's slope for every head).
  static AttentionVariants head_variants(const AttentionVariants& all, Index h, Index heads) {
    AttentionVariants own = all;
    if (!all.alibi_slopes.empty() || all.alibi_max_bias > 0.0) {
      own.alibi_slopes = {all.alibi_slopes.empty()
                              ? detail::alibi_slope(h, heads, all.alibi_max_bias)
                              : all.alibi_slopes[static_cast<std::size_t>(h)]};
      own.alibi_max_bias = 0.0;
    }
    return own;
  }
  std::size_t checked_head(Index h) const {
    detail::require_that<IndexError>(
        h >= 0 && h < num_heads(), "MultiHeadAttentionWrapper::head", [&] {
          return "head " + std::to_string(h) +
                 " is outside num_heads=" + std::to_string(num_heads());
        });
    return static_cast<std::size_t>(h);
  }

  template <class Self>
  static auto parameters_of(Self& self, ParameterNames names) {
    decltype(self.heads_.front().named_parameters(names)) list;
    for (std::size_t h = 0; h < self.heads_.size(); ++h) {
      list.append(prefix(h), self.heads_[h].named_parameters(names));
    }
    return list;
  }

  // Head h into columns [h d_out, (h + 1) d_out) of out, its weights into weights[:, h];
  // a training forward records each head in saved->parts[h].
  void run_packed(const detail::ModuleInputs<Scalar>&, const PackedSequences&,
                  TensorView<Scalar, 3>, Workspace&, const Mask&, SavedForward<Scalar>*) const {
    detail::refuse_packed("MultiHeadAttentionWrapper::forward");
  }
  void run_prefill(const detail::ModuleInputs<Scalar>&, const PackedSequences&,
                   TensorView<Scalar, 3>, Workspace&, KVCache<Scalar>&) const {
    detail::refuse_packed("MultiHeadAttentionWrapper::forward");
  }
  void run_paged_prefill(const detail::ModuleInputs<Scalar>&, const PackedSequences&,
                         TensorView<Scalar, 3>, Workspace&, PagedKVCache<Scalar>&,
                         const std::vector<Index>&) const {
    detail::refuse_packed("MultiHeadAttentionWrapper::forward");
  }
  void run_paged(const detail::ModuleInputs<Scalar>&, TensorView<Scalar, 3>, Workspace&,
                 PagedKVCache<Scalar>&, const std::vector<Index>&) const {
    detail::refuse_cached("MultiHeadAttentionWrapper::forward",
                          "it runs num_heads separate single-head modules; use MultiHeadAttention "
                          "(one core, one cache)");
  }
  void run_cached(const detail::ModuleInputs<Scalar>&, TensorView<Scalar, 3>, Workspace&,
                  KVCache<Scalar>&, const Mask&) const {
    detail::refuse_cached("MultiHeadAttentionWrapper::forward",
                          "it runs num_heads separate single-head modules; use MultiHeadAttention "
                          "(one core, one cache)");
  }
  void run(const detail::ModuleInputs<Scalar>& x, TensorView<Scalar, 3> out, Workspace& ws,
           const Mask& mask, TensorView<Scalar, 4> weights,
           SavedForward<Scalar>* saved = nullptr) const {
    const char* where = "MultiHeadAttentionWrapper::forward";
    const Shape<3> expected{x.query.extent(0), x.query.extent(1), d_out()};
    detail::require(out.shape() == expected, where, [&] {
      return "out has shape " + detail::to_string(out.shape()) + ", expected " +
             detail::to_string(expected);
    });
    // Each head checks its own slices; across heads, a later head would read a mask (or
    // write out) over what an earlier one wrote. (Inputs sharing memory with out or weights
    // were copied first by the shared forward, so every head reads the caller's x.)
    detail::check_output_memory(where, out, weights, mask);
    const bool per_head = mask.heads() > 1;
    if (per_head)
      mask.check(where, x.query.extent(0), num_heads(), x.query.extent(1), x.query.extent(1));
    const Index width = heads_.front().d_out();
    if (saved != nullptr) {
      saved->owner = this;  // each head records its own part (identity and configuration)
      saved->owner_id = 0;
      saved->owner_config = {};
      saved->parts.resize(heads_.size());  // allocates on the first training forward only
    }
    for (std::size_t h = 0; h < heads_.size(); ++h) {
      const Index hi = static_cast<Index>(h);
      const Mask own = per_head ? mask.select_head(hi) : Mask();
      const auto out_h = slice(out, 2, hi * width, (hi + 1) * width);
      // (A storage type's wrapper has no weights: the front ends refuse them at compile time.)
      if (saved != nullptr) {
        heads_[h].forward(x.query, out_h, saved->parts[h], ws, per_head ? own : mask);
        continue;
      }
      if constexpr (!kStorage) {
        if (weights.data() != nullptr) {
          heads_[h].forward_with_weights(x.query, out_h, select(weights, 1, hi), ws,
                                         per_head ? own : mask);
          continue;
        }
      }
      heads_[h].forward(x.query, out_h, ws, per_head ? own : mask);
    }
  }
  // Head h's backward from columns [h d_out, (h + 1) d_out) of grad_out, every head adding
  // into the one input gradient.
  void run_backward(TensorView<const Scalar, 3> grad_out, const SavedForward<Scalar>& saved,
                    const TensorView<Scalar, 3> (&grad_in)[3], Gradients<Scalar>& grads,
                    Workspace& ws) const {
    const char* where = "MultiHeadAttentionWrapper::backward";
    detail::require(saved.owner == this && saved.parts.size() == heads_.size(), where, [] {
      return std::string("`saved` was not filled by this module's training forward");
    });
    const Shape<3> expected{saved.parts.front().batch, saved.parts.front().query_tokens, d_out()};
    detail::require(grad_out.shape() == expected, where, [&] {
      return "grad_out has shape " + detail::to_string(grad_out.shape()) + ", expected " +
             detail::to_string(expected);
    });
    const Index width = heads_.front().d_out();
    for (std::size_t h = 0; h < heads_.size(); ++h) {
      const Index hi = static_cast<Index>(h);
      heads_[h].backward(slice(grad_out, 2, hi * width, (hi + 1) * width), saved.parts[h],
                         grad_in[0], grads, ws);
    }
  }
  Index output_features(const detail::ModuleInputs<Scalar>&) const noexcept { return d_out(); }
  Index weight_heads() const noexcept { return num_heads(); }
  const char* forward_where() const noexcept { return "MultiHeadAttentionWrapper::forward"; }

  MultiHeadAttentionWrapper() = default;  // the converting constructor fills heads_

  std::vector<CausalAttention<Scalar>> heads_;
};

/// `module` with each head's weights converted to `To`: convert<bfloat16>(float_wrapper).
template <class To, class From>
MultiHeadAttentionWrapper<To> convert(const MultiHeadAttentionWrapper<From>& module) {
  return MultiHeadAttentionWrapper<To>(module);
}

ATTN_NAMESPACE_END
