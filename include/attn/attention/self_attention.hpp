// SPDX-License-Identifier: MIT
// attn/attention/self_attention.hpp: single-head self-attention with trainable W_query,
// W_key, W_value (the notebooks' SelfAttention_v1 / SelfAttention_v2 / SingleHeadAttention).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "attn/attention/detail/module_support.hpp"
#include "attn/attention/scaled_dot_product.hpp"
#include "attn/config.hpp"
#include "attn/detail/gemm.hpp"
#include "attn/error.hpp"
#include "attn/nn/dropout.hpp"
#include "attn/nn/linear.hpp"
#include "attn/nn/mask.hpp"
#include "attn/nn/random.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"
#include "attn/workspace.hpp"

namespace attn {

/// Tag: initialise the projections as `nn.Parameter(torch.rand(d_in, d_out))`, the raw
/// parameter form of the notebook's SelfAttention_v1, instead of nn.Linear's init.
struct RandInit {};
inline constexpr RandInit kRandInit{};

/// Single-head self-attention with trainable projections:
/// softmax(q k^T * scale + mask) v with q = x W_q^T + b_q (and k, v alike).
/// Notebook 003's SelfAttention_v1 (raw `rand` parameters, x @ W), SelfAttention_v2
/// (nn.Linear, optional bias) and notebook 001's SingleHeadAttention (bias, no scaling).
///
/// The weights are stored in nn.Linear's layout (d_out, d_in). The raw form's (d_in, d_out)
/// matrices, applied as x @ W, are their transposes: from_parameters() takes them as they
/// are. Scaling by 1/sqrt(d_out) is on by default; set_scaled(false) gives notebook 001's
/// unscaled SingleHeadAttention.
///
/// Shapes: x (B, T, d_in) -> (B, T, d_out); unbatched x (T, d_in) -> (T, d_out).
/// @tparam Scalar float or double.
/// @throws std::invalid_argument from the constructors on non-positive sizes.
template <class Scalar = float>
class SelfAttention {
  static_assert(std::is_floating_point_v<Scalar>,
                "attn::SelfAttention: Scalar must be float or double");

 public:
  /// SelfAttention_v2: three nn.Linear(d_in, d_out, bias=qkv_bias), drawn in the order
  /// W_query, W_key, W_value from the global generator.
  SelfAttention(Index d_in, Index d_out, bool qkv_bias = false)
      : SelfAttention(d_in, d_out, qkv_bias, 0, 0.0, false, "SelfAttention",
                      "SelfAttention::forward", Init::kLinear) {}

  /// SelfAttention_v1: three torch.rand(d_in, d_out) parameters (no bias), drawn in the
  /// order W_query, W_key, W_value from the global generator.
  SelfAttention(Index d_in, Index d_out, RandInit)
      : SelfAttention(d_in, d_out, false, 0, 0.0, false, "SelfAttention",
                      "SelfAttention::forward", Init::kRand) {}

  /// The raw form with given (d_in, d_out) matrices, applied as x @ W (no bias).
  /// @throws ShapeError if the three shapes differ or are empty.
  static SelfAttention from_parameters(TensorView<const Scalar, 2> w_query,
                                       TensorView<const Scalar, 2> w_key,
                                       TensorView<const Scalar, 2> w_value) {
    detail::require(w_query.shape() == w_key.shape() && w_key.shape() == w_value.shape() &&
                        !w_query.empty(),
                    "SelfAttention::from_parameters", [&] {
                      return "W_query " + detail::to_string(w_query.shape()) + ", W_key " +
                             detail::to_string(w_key.shape()) + ", W_value " +
                             detail::to_string(w_value.shape()) +
                             " must share one non-empty (d_in, d_out) shape";
                    });
    SelfAttention module(w_query.extent(0), w_query.extent(1), false, 0, 0.0, false,
                         "SelfAttention", "SelfAttention::forward", Init::kNone);
    module.w_query_.set_weight(transpose(w_query));
    module.w_key_.set_weight(transpose(w_key));
    module.w_value_.set_weight(transpose(w_value));
    return module;
  }

  /// Context vectors (B, T, d_out).
  Tensor<Scalar, 3> forward(TensorView<const Scalar, 3> x,
                            const AttentionMask<Scalar>& mask = {}) const {
    Tensor<Scalar, 3> out({x.extent(0), x.extent(1), d_out()});
    Workspace ws;
    forward_impl(x, out.view(), mask, ws, {});
    return out;
  }
  /// Unbatched: (T, d_in) -> (T, d_out).
  Tensor<Scalar, 2> forward(TensorView<const Scalar, 2> x,
                            const AttentionMask<Scalar>& mask = {}) const {
    Tensor<Scalar, 2> out({x.extent(0), d_out()});
    Workspace ws;
    forward_impl(unsqueeze(x, 0), unsqueeze(out.view(), 0), mask, ws, {});
    return out;
  }
  /// Into a preallocated `out` (B, T, d_out), reusing `ws` (no allocation once warm).
  void forward(TensorView<const Scalar, 3> x, TensorView<Scalar, 3> out, Workspace& ws,
               const AttentionMask<Scalar>& mask = {}) const {
    forward_impl(x, out, mask, ws, {});
  }

  /// Context vectors and the attention weights (B, T, T), after dropout.
  AttentionResult<Scalar, 3> forward_with_weights(TensorView<const Scalar, 3> x,
                                                  const AttentionMask<Scalar>& mask = {}) const {
    AttentionResult<Scalar, 3> result;
    result.output = Tensor<Scalar, 3>({x.extent(0), x.extent(1), d_out()});
    result.weights = Tensor<Scalar, 3>({x.extent(0), x.extent(1), x.extent(1)});
    Workspace ws;
    forward_impl(x, result.output.view(), mask, ws, unsqueeze(result.weights.view(), 1));
    return result;
  }
  /// Unbatched: context (T, d_out) and weights (T, T).
  AttentionResult<Scalar, 2> forward_with_weights(TensorView<const Scalar, 2> x,
                                                  const AttentionMask<Scalar>& mask = {}) const {
    AttentionResult<Scalar, 3> r = forward_with_weights(unsqueeze(x, 0), mask);
    AttentionResult<Scalar, 2> result;
    result.output = Tensor<Scalar, 2>(select(r.output.view(), 0, 0));
    result.weights = Tensor<Scalar, 2>(select(r.weights.view(), 0, 0));
    return result;
  }

  Index d_in() const noexcept { return w_query_.in_features(); }
  Index d_out() const noexcept { return w_query_.out_features(); }
  bool scaled() const noexcept { return scaled_; }
  /// Scaling by 1/sqrt(d_out) on (default) or off (notebook 001's SingleHeadAttention).
  void set_scaled(bool on) noexcept { scaled_ = on; }

  Linear<Scalar>& w_query() noexcept { return w_query_; }
  Linear<Scalar>& w_key() noexcept { return w_key_; }
  Linear<Scalar>& w_value() noexcept { return w_value_; }
  const Linear<Scalar>& w_query() const noexcept { return w_query_; }
  const Linear<Scalar>& w_key() const noexcept { return w_key_; }
  const Linear<Scalar>& w_value() const noexcept { return w_value_; }

 protected:
  /// How the constructor fills the projections.
  enum class Init { kLinear, kRand, kNone };

  /// Shared by CausalAttention: context_length 0 = unlimited. `name` and `forward_name`
  /// (string literals) prefix error messages.
  SelfAttention(Index d_in, Index d_out, bool qkv_bias, Index context_length, double dropout,
                bool causal, const char* name, const char* forward_name, Init init)
      : forward_name_(forward_name),
        context_length_(context_length),
        causal_(causal),
        dropout_(check(d_in, d_out, context_length, dropout, name)) {
    with_global_generator([&](TorchGenerator& gen) {
      TorchGenerator unused;
      make_layers(d_in, d_out, qkv_bias, init == Init::kLinear ? gen : unused);
      if (init == Init::kRand) {
        for (Linear<Scalar>* layer : {&w_query_, &w_key_, &w_value_}) {
          const Tensor<Scalar, 2> w = rand<Scalar>(Shape<2>{d_in, d_out}, gen);
          layer->set_weight(transpose(w.view()));
        }
      }
    });
  }

  const char* forward_name_;
  Index context_length_;
  bool causal_;
  Dropout<Scalar> dropout_;

 private:
  static Dropout<Scalar> check(Index d_in, Index d_out, Index context_length, double dropout,
                               const char* name) {
    detail::require_arg(d_in > 0 && d_out > 0 && context_length >= 0, name, [&] {
      return "d_in=" + std::to_string(d_in) + ", d_out=" + std::to_string(d_out) +
             ", context_length=" + std::to_string(context_length) + ": sizes must be positive";
    });
    detail::check_dropout(dropout, name);
    return Dropout<Scalar>(dropout);
  }

  void make_layers(Index d_in, Index d_out, bool qkv_bias, TorchGenerator& gen) {
    w_query_ = Linear<Scalar>(d_in, d_out, qkv_bias, gen);
    w_key_ = Linear<Scalar>(d_in, d_out, qkv_bias, gen);
    w_value_ = Linear<Scalar>(d_in, d_out, qkv_bias, gen);
  }

  void forward_impl(TensorView<const Scalar, 3> x, TensorView<Scalar, 3> out,
                    const AttentionMask<Scalar>& mask, Workspace& ws,
                    TensorView<Scalar, 4> weights) const {
    const char* where = forward_name_;
    detail::check_input(where, "x", x, d_in(), "d_in");
    const Index batch = x.extent(0), tokens = x.extent(1), d = d_out();
    detail::check_output(where, out, {batch, tokens, d});
    detail::check_context(where, "x", tokens, context_length_);
    const auto rows = detail::as_rows(x, ws, Workspace::kStaging);
    Scalar* q = ws.get<Scalar>(Workspace::kProjection, 3 * rows.rows * d);
    Scalar* k = q + rows.rows * d;
    Scalar* v = k + rows.rows * d;
    const Linear<Scalar>* layers[3] = {&w_query_, &w_key_, &w_value_};
    Scalar* dst[3] = {q, k, v};
    for (int p = 0; p < 3; ++p) {
      detail::gemm_nt(rows.rows, d, d_in(), rows.data, rows.ld, layers[p]->weight().data(),
                      d_in(), dst[p], d,
                      layers[p]->has_bias() ? layers[p]->bias().data() : nullptr);
    }
    const Shape<4> shape{batch, 1, tokens, d}, strides{tokens * d, tokens * d, d, 1};
    AttentionOptions options;
    if (!scaled_) options.scale = 1.0;
    if (dropout_.active()) {
      options.dropout = dropout_.p();
      options.dropout_seed = dropout_.seed_value();
      options.dropout_call = dropout_.next_call();
    }
    const TensorView<Scalar, 4> out4(out.data(), {batch, 1, tokens, d},
                                     {out.stride(0), out.stride(0), out.stride(1), out.stride(2)});
    detail::attend(where, TensorView<const Scalar, 4>(q, shape, strides),
                   TensorView<const Scalar, 4>(k, shape, strides),
                   TensorView<const Scalar, 4>(v, shape, strides), out4, mask, options, weights,
                   ws, causal_);
  }

  Linear<Scalar> w_query_, w_key_, w_value_;
  bool scaled_ = true;
};

}  // namespace attn
