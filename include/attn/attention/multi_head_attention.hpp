// SPDX-License-Identifier: MIT
// attn/attention/multi_head_attention.hpp: MultiHeadAttention (self and cross, fused or
// separate Q/K/V, heads as views, out_proj), the notebooks' and nn.MultiheadAttention's.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
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

/// How initial weights are drawn (both from a TorchGenerator, bit-compatible with PyTorch).
enum class InitScheme {
  /// As the notebooks' modules: nn.Linear init for W_query, W_key, W_value, then out_proj.
  kLinear,
  /// As torch.nn.MultiheadAttention: out_proj drawn as nn.Linear, then xavier_uniform_ on
  /// in_proj_weight (or q/k/v_proj_weight), then every bias set to zero.
  kMultiheadAttention,
};

/// Row order of a fused (3 * d_out, d_in) Q/K/V weight.
enum class QkvLayout {
  /// [W_q; W_k; W_v]: torch.nn.MultiheadAttention's in_proj_weight.
  kStacked,
  /// Per head h: [W_q,h; W_k,h; W_v,h] (3 * head_dim rows each): notebook 004's qkv_layer
  /// followed by reshape(B, T, H, 3 * head_dim) and chunk(3, dim=-1).
  kPerHead,
};

/// Configuration of a MultiHeadAttention beyond the notebooks' constructor.
struct MultiHeadAttentionOptions {
  Index d_in = 0;            ///< query features (nn.MultiheadAttention's embed_dim)
  Index d_out = 0;           ///< model width = output features; 0 means d_in
  Index num_heads = 1;
  Index kdim = 0;            ///< key features; 0 means d_in
  Index vdim = 0;            ///< value features; 0 means d_in
  Index context_length = 0;  ///< longest accepted sequence; 0 means unlimited
  double dropout = 0.0;      ///< on the attention weights, training mode only
  bool qkv_bias = false;     ///< bias of the Q/K/V projections
  bool out_bias = true;      ///< bias of out_proj
  bool causal = false;       ///< always apply a causal bound (self-attention decoders)
  CausalAlignment causal_alignment = CausalAlignment::kSquare;
  InitScheme init = InitScheme::kLinear;

  /// The configuration of `torch.nn.MultiheadAttention(embed_dim, num_heads, dropout,
  /// bias, kdim=kdim, vdim=vdim, batch_first=True)`.
  static MultiHeadAttentionOptions pytorch(Index embed_dim, Index num_heads, bool bias = true,
                                           Index kdim = 0, Index vdim = 0, double dropout = 0.0) {
    MultiHeadAttentionOptions o;
    o.d_in = embed_dim;
    o.d_out = embed_dim;
    o.num_heads = num_heads;
    o.kdim = kdim;
    o.vdim = vdim;
    o.dropout = dropout;
    o.qkv_bias = bias;
    o.out_bias = bias;
    o.init = InitScheme::kMultiheadAttention;
    return o;
  }
};

/// Output and per-head attention weights (B, H, T_q, T_k) of forward_with_weights().
template <class Scalar>
struct MultiHeadAttentionOutput {
  Tensor<Scalar, 3> output;
  Tensor<Scalar, 4> weights;
};

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
/// (B, T, D) for out_proj.
/// Cross-attention projects the query with W_q and the key/value with one fused [W_k; W_v]
/// GEMM when key and value are the same tensor.
///
/// Shapes: query (B, T_q, d_in), key (B, T_k, kdim), value (B, T_k, vdim) ->
/// (B, T_q, d_out). Unbatched (T, d_in) inputs give (T, d_out). Weights follow
/// torch.nn.Linear: q_proj_weight() is (d_out, d_in) and y = x W^T + b.
///
/// forward() is const and may be called from several threads at once (dropout's call
/// counter is atomic; give each thread its own Workspace).
///
/// @tparam Scalar float or double.
/// @throws std::invalid_argument from the constructors if d_out % num_heads != 0, a size is
///         not positive or dropout is outside [0, 1); from forward() if a sequence exceeds
///         context_length. ShapeError from forward() on wrong shapes (naming them).
template <class Scalar = float>
class MultiHeadAttention {
  static_assert(std::is_floating_point_v<Scalar>,
                "attn::MultiHeadAttention: Scalar must be float or double");

 public:
  /// The notebooks' causal self-attention module. As in the notebook (003 In [220]),
  /// out_proj has a bias only if qkv_bias is set; use the options constructor otherwise.
  MultiHeadAttention(Index d_in, Index d_out, Index context_length, double dropout,
                     Index num_heads, bool qkv_bias = false)
      : MultiHeadAttention(notebook_options(d_in, d_out, context_length, dropout, num_heads,
                                            qkv_bias)) {}

  /// Any configuration; weights drawn from the global generator (see attn::manual_seed).
  explicit MultiHeadAttention(const MultiHeadAttentionOptions& options)
      : MultiHeadAttention(options, nullptr) {}

  /// Any configuration; weights drawn from `gen`.
  MultiHeadAttention(const MultiHeadAttentionOptions& options, TorchGenerator& gen)
      : MultiHeadAttention(options, &gen) {}

  // ---- forward ----

  /// Self-attention: x (B, T, d_in) -> (B, T, d_out).
  Tensor<Scalar, 3> forward(TensorView<const Scalar, 3> x,
                            const AttentionMask<Scalar>& mask = {}) const {
    return forward(x, x, x, mask);
  }

  /// Unbatched self-attention: x (T, d_in) -> (T, d_out).
  Tensor<Scalar, 2> forward(TensorView<const Scalar, 2> x,
                            const AttentionMask<Scalar>& mask = {}) const {
    Tensor<Scalar, 3> y = forward(unsqueeze(x, 0), mask);
    Tensor<Scalar, 2> out({y.extent(1), y.extent(2)});
    copy(select(y.view(), 0, 0), out.view());
    return out;
  }

  /// Attention with queries from `query` and keys/values from `key`/`value` (cross-attention
  /// when they differ; T_q and T_k may differ). Allocates the result.
  Tensor<Scalar, 3> forward(TensorView<const Scalar, 3> query, TensorView<const Scalar, 3> key,
                            TensorView<const Scalar, 3> value,
                            const AttentionMask<Scalar>& mask = {}) const {
    Tensor<Scalar, 3> out({query.extent(0), query.extent(1), d_out_});
    Workspace ws;
    forward_impl(query, key, value, out.view(), mask, ws, {});
    return out;
  }

  /// Self-attention into a preallocated `out` (B, T, d_out), reusing `ws`: after the first
  /// call with the largest shape, no heap allocation happens.
  void forward(TensorView<const Scalar, 3> x, TensorView<Scalar, 3> out, Workspace& ws,
               const AttentionMask<Scalar>& mask = {}) const {
    forward_impl(x, x, x, out, mask, ws, {});
  }

  /// Self-attention into a preallocated `out` with a temporary workspace.
  void forward(TensorView<const Scalar, 3> x, TensorView<Scalar, 3> out) const {
    Workspace ws;
    forward_impl(x, x, x, out, {}, ws, {});
  }

  /// Cross- or self-attention into a preallocated `out` (B, T_q, d_out), reusing `ws`.
  void forward(TensorView<const Scalar, 3> query, TensorView<const Scalar, 3> key,
               TensorView<const Scalar, 3> value, TensorView<Scalar, 3> out, Workspace& ws,
               const AttentionMask<Scalar>& mask = {}) const {
    forward_impl(query, key, value, out, mask, ws, {});
  }

  /// Also returns the per-head attention weights (B, H, T_q, T_k), after dropout, computed
  /// on the materialised path. average_heads() gives PyTorch's averaged form.
  MultiHeadAttentionOutput<Scalar> forward_with_weights(TensorView<const Scalar, 3> query,
                                                        TensorView<const Scalar, 3> key,
                                                        TensorView<const Scalar, 3> value,
                                                        const AttentionMask<Scalar>& mask = {}) const {
    MultiHeadAttentionOutput<Scalar> result;
    result.output = Tensor<Scalar, 3>({query.extent(0), query.extent(1), d_out_});
    result.weights =
        Tensor<Scalar, 4>({query.extent(0), num_heads_, query.extent(1), key.extent(1)});
    Workspace ws;
    forward_impl(query, key, value, result.output.view(), mask, ws, result.weights.view());
    return result;
  }
  MultiHeadAttentionOutput<Scalar> forward_with_weights(TensorView<const Scalar, 3> x,
                                                        const AttentionMask<Scalar>& mask = {}) const {
    return forward_with_weights(x, x, x, mask);
  }

  // ---- modes ----

  /// Training mode enables dropout on the attention weights. Modules start in training
  /// mode, like PyTorch's.
  void train(bool on = true) noexcept { dropout_.train(on); }
  void eval() noexcept { train(false); }
  bool is_training() const noexcept { return dropout_.is_training(); }
  /// Restarts the dropout stream with a seed.
  void seed(std::uint64_t value) noexcept { dropout_.seed(value); }

  // ---- frozen weights (inference) ----

  /// Packs the projection weights into the GEMM's layout once, so that forward() stops
  /// repacking them on every call: about 9 % of a forward over 128 tokens, most of one over
  /// a few tokens (decoding). Results are bit for bit those of the unfrozen module; the packs
  /// take as much memory as the weights. The packs are a snapshot: every non-const weight
  /// accessor (in_proj_weight(), q/k/v_proj_weight(), w_query/w_key/w_value(), out_proj(),
  /// set_in_proj()) unfreezes the module, so loading or editing weights through them is
  /// safe, but a view or reference taken before freeze() must not be written after it
  /// (freeze() again after changing weights that way). Biases are always read live.
  void freeze() {
    const Index hd = head_dim();
    const auto pack = [&](const Tensor<Scalar, 2>& w) {
      return detail::PackedGemmB<Scalar>(w.extent(0), w.extent(1), w.data(), w.extent(1), hd);
    };
    pack_a_ = pack(w_a_);
    pack_b_ = same_dims_ ? detail::PackedGemmB<Scalar>() : pack(w_b_);
    pack_c_ = same_dims_ || kv_fused_ ? detail::PackedGemmB<Scalar>() : pack(w_c_);
    const TensorView<const Scalar, 2> w_out = out_proj_.weight();
    pack_out_ = detail::PackedGemmB<Scalar>(w_out.extent(0), w_out.extent(1), w_out.data(),
                                            w_out.extent(1), 0);
    frozen_ = true;
  }
  /// Drops the packs (forward() packs per call again).
  void unfreeze() noexcept {
    frozen_ = false;
    pack_a_ = {};
    pack_b_ = {};
    pack_c_ = {};
    pack_out_ = {};
  }
  bool is_frozen() const noexcept { return frozen_; }

  // ---- parameters (PyTorch names) ----

  Index d_in() const noexcept { return d_in_; }
  Index d_out() const noexcept { return d_out_; }
  Index embed_dim() const noexcept { return d_out_; }
  Index kdim() const noexcept { return kdim_; }
  Index vdim() const noexcept { return vdim_; }
  Index num_heads() const noexcept { return num_heads_; }
  Index head_dim() const noexcept { return d_out_ / num_heads_; }
  Index context_length() const noexcept { return context_length_; }
  double dropout() const noexcept { return dropout_.p(); }
  bool is_causal() const noexcept { return causal_; }
  bool has_qkv_bias() const noexcept { return qkv_bias_; }
  /// True when d_in == kdim == vdim, so Q/K/V share one (3 d_out, d_in) weight.
  bool qkv_same_embed_dim() const noexcept { return same_dims_; }

  /// The fused (3 d_out, d_in) weight [W_q; W_k; W_v].
  /// @throws std::logic_error when kdim or vdim differ from d_in (PyTorch has no
  ///         in_proj_weight then; use q/k/v_proj_weight()).
  TensorView<Scalar, 2> in_proj_weight() {
    require_fused("in_proj_weight");
    unfreeze();
    return w_a_.view();
  }
  TensorView<const Scalar, 2> in_proj_weight() const {
    require_fused("in_proj_weight");
    return w_a_.view();
  }
  /// (3 d_out) bias [b_q; b_k; b_v]; empty without qkv_bias.
  TensorView<Scalar, 1> in_proj_bias() noexcept { return b_in_.view(); }
  TensorView<const Scalar, 1> in_proj_bias() const noexcept { return b_in_.view(); }

  TensorView<Scalar, 2> q_proj_weight() noexcept { return unfrozen(proj_weight(0)); }
  TensorView<Scalar, 2> k_proj_weight() noexcept { return unfrozen(proj_weight(1)); }
  TensorView<Scalar, 2> v_proj_weight() noexcept { return unfrozen(proj_weight(2)); }
  TensorView<const Scalar, 2> q_proj_weight() const noexcept { return cproj_weight(0); }
  TensorView<const Scalar, 2> k_proj_weight() const noexcept { return cproj_weight(1); }
  TensorView<const Scalar, 2> v_proj_weight() const noexcept { return cproj_weight(2); }

  /// The notebooks' W_query / W_key / W_value as (weight, bias) views into this module.
  LinearView<Scalar> w_query() noexcept { return {unfrozen(proj_weight(0)), proj_bias(0)}; }
  LinearView<Scalar> w_key() noexcept { return {unfrozen(proj_weight(1)), proj_bias(1)}; }
  LinearView<Scalar> w_value() noexcept { return {unfrozen(proj_weight(2)), proj_bias(2)}; }
  LinearView<const Scalar> w_query() const noexcept { return {cproj_weight(0), cproj_bias(0)}; }
  LinearView<const Scalar> w_key() const noexcept { return {cproj_weight(1), cproj_bias(1)}; }
  LinearView<const Scalar> w_value() const noexcept { return {cproj_weight(2), cproj_bias(2)}; }

  Linear<Scalar>& out_proj() noexcept {
    unfreeze();
    return out_proj_;
  }
  const Linear<Scalar>& out_proj() const noexcept { return out_proj_; }

  /// Loads a fused Q/K/V weight (3 d_out, d_in) and optional bias (3 d_out, or an empty
  /// view) in the given row layout.
  /// @throws ShapeError on wrong shapes; std::logic_error if the dims differ (no fused weight).
  void set_in_proj(TensorView<const Scalar, 2> weight, TensorView<const Scalar, 1> bias = {},
                   QkvLayout layout = QkvLayout::kStacked) {
    require_fused("set_in_proj");
    unfreeze();
    const Shape<2> expected{3 * d_out_, d_in_};
    detail::require(weight.shape() == expected, "MultiHeadAttention::set_in_proj", [&] {
      return "weight has shape " + detail::to_string(weight.shape()) + ", expected " +
             detail::to_string(expected);
    });
    const bool with_bias = bias.data() != nullptr;
    detail::require(!with_bias || (qkv_bias_ && bias.extent(0) == 3 * d_out_),
                    "MultiHeadAttention::set_in_proj", [&] {
                      return qkv_bias_ ? "bias has shape " + detail::to_string(bias.shape()) +
                                             ", expected (" + std::to_string(3 * d_out_) + ")"
                                       : std::string("this module was built without qkv_bias");
                    });
    const Index hd = head_dim();
    for (Index row = 0; row < 3 * d_out_; ++row) {
      // destination row in [Q; K; V] order for source row `row`
      Index dst = row;
      if (layout == QkvLayout::kPerHead) {
        const Index h = row / (3 * hd), c = (row % (3 * hd)) / hd, e = row % hd;
        dst = c * d_out_ + h * hd + e;
      }
      copy(select(weight, 0, row), select(w_a_.view(), 0, dst));
      if (with_bias) b_in_(dst) = bias(row);
    }
  }

 private:
  static MultiHeadAttentionOptions notebook_options(Index d_in, Index d_out, Index context_length,
                                                    double dropout, Index num_heads,
                                                    bool qkv_bias) {
    MultiHeadAttentionOptions o;
    o.d_in = d_in;
    o.d_out = d_out;
    o.num_heads = num_heads;
    o.context_length = context_length;
    o.dropout = dropout;
    o.qkv_bias = qkv_bias;
    o.out_bias = qkv_bias;
    o.causal = true;
    return o;
  }

  MultiHeadAttention(const MultiHeadAttentionOptions& o, TorchGenerator* gen)
      : d_in_(o.d_in),
        d_out_(o.d_out > 0 ? o.d_out : o.d_in),
        kdim_(o.kdim > 0 ? o.kdim : o.d_in),
        vdim_(o.vdim > 0 ? o.vdim : o.d_in),
        num_heads_(o.num_heads),
        context_length_(o.context_length),
        qkv_bias_(o.qkv_bias),
        causal_(o.causal),
        alignment_(o.causal_alignment),
        dropout_(check_options(o)) {
    same_dims_ = kdim_ == d_in_ && vdim_ == d_in_;
    kv_fused_ = !same_dims_ && kdim_ == vdim_;
    if (same_dims_) {
      w_a_ = Tensor<Scalar, 2>({3 * d_out_, d_in_});
    } else {
      w_a_ = Tensor<Scalar, 2>({d_out_, d_in_});
      if (kv_fused_) {
        w_b_ = Tensor<Scalar, 2>({2 * d_out_, kdim_});
      } else {
        w_b_ = Tensor<Scalar, 2>({d_out_, kdim_});
        w_c_ = Tensor<Scalar, 2>({d_out_, vdim_});
      }
    }
    if (qkv_bias_) b_in_ = Tensor<Scalar, 1>({3 * d_out_});
    const auto init = [&](TorchGenerator& g) {
      if (o.init == InitScheme::kLinear) {
        for (int p = 0; p < 3; ++p) {
          const Index fan_in = proj_weight(p).extent(1);
          g.fill_uniform(proj_weight(p), -detail::linear_weight_bound(fan_in),
                         detail::linear_weight_bound(fan_in));
          if (qkv_bias_) {
            g.fill_uniform(proj_bias(p), -detail::linear_bias_bound(fan_in),
                           detail::linear_bias_bound(fan_in));
          }
        }
        out_proj_ = Linear<Scalar>(d_out_, d_out_, o.out_bias, g);
      } else {
        out_proj_ = Linear<Scalar>(d_out_, d_out_, o.out_bias, g);
        const auto xavier = [&](TensorView<Scalar, 2> w) {
          // torch.nn.init.xavier_uniform_ (gain 1), step by step as PyTorch computes it so
          // the bound matches to the last bit: std = gain * sqrt(2 / (fan_in + fan_out)),
          // bound = sqrt(3) * std.
          const double std_dev =
              1.0 * std::sqrt(2.0 / static_cast<double>(w.extent(0) + w.extent(1)));
          const double bound = std::sqrt(3.0) * std_dev;
          g.fill_uniform(w, -bound, bound);
        };
        if (same_dims_) {
          xavier(w_a_.view());
        } else {
          for (int p = 0; p < 3; ++p) xavier(proj_weight(p));
        }
        if (qkv_bias_) b_in_.fill(Scalar(0));
        if (o.out_bias) fill_zero(out_proj_.bias());
      }
    };
    if (gen != nullptr) {
      init(*gen);
    } else {
      with_global_generator(init);
    }
  }

  static void fill_zero(TensorView<Scalar, 1> v) {
    for (Index i = 0; i < v.extent(0); ++i) v(i) = Scalar(0);
  }

  // Validates the options; returns the dropout layer for the initialiser list.
  static Dropout<Scalar> check_options(const MultiHeadAttentionOptions& o) {
    const char* where = "MultiHeadAttention";
    const Index d_out = o.d_out > 0 ? o.d_out : o.d_in;
    detail::require_arg(o.d_in > 0 && d_out > 0 && o.num_heads > 0 && o.kdim >= 0 &&
                            o.vdim >= 0 && o.context_length >= 0,
                        where, [&] {
                          return "d_in=" + std::to_string(o.d_in) + ", d_out=" +
                                 std::to_string(d_out) + ", num_heads=" +
                                 std::to_string(o.num_heads) + ", kdim=" + std::to_string(o.kdim) +
                                 ", vdim=" + std::to_string(o.vdim) + ", context_length=" +
                                 std::to_string(o.context_length) +
                                 ": sizes must be positive (kdim, vdim, context_length: 0 = default)";
                        });
    detail::require_arg(d_out % o.num_heads == 0, where, [&] {
      return "d_out=" + std::to_string(d_out) + " is not divisible by num_heads=" +
             std::to_string(o.num_heads) + " (d_out % num_heads = " +
             std::to_string(d_out % o.num_heads) + ")";
    });
    detail::check_dropout(o.dropout, where);
    return Dropout<Scalar>(o.dropout);
  }

  void require_fused(const char* what) const {
    if (!same_dims_) {
      throw std::logic_error("attn::MultiHeadAttention::" + std::string(what) +
                             ": kdim=" + std::to_string(kdim_) + " and vdim=" +
                             std::to_string(vdim_) + " differ from d_in=" + std::to_string(d_in_) +
                             ", so Q/K/V have separate weights (q/k/v_proj_weight)");
    }
  }

  // Unfreezes, then returns `view` (for the non-const weight accessors).
  TensorView<Scalar, 2> unfrozen(TensorView<Scalar, 2> view) noexcept {
    unfreeze();
    return view;
  }

  // The packed weight of projection p (0 = Q, 1 = K, 2 = V) and of those stacked after it
  // in the same storage, for a product starting at projection p; empty when not frozen.
  detail::PackedB<Scalar> packed_proj(int p) const noexcept {
    if (!frozen_) return {};
    if (same_dims_) return {&pack_a_, p * d_out_};
    if (p == 0) return {&pack_a_, 0};
    if (kv_fused_) return {&pack_b_, (p - 1) * d_out_};
    return {p == 1 ? &pack_b_ : &pack_c_, 0};
  }

  // Projection p (0 = Q, 1 = K, 2 = V) as a view into the storage.
  TensorView<Scalar, 2> proj_weight(int p) noexcept {
    const Index d = d_out_;
    if (same_dims_) return slice(w_a_.view(), 0, p * d, (p + 1) * d);
    if (p == 0) return w_a_.view();
    if (kv_fused_) return slice(w_b_.view(), 0, (p - 1) * d, p * d);
    return p == 1 ? w_b_.view() : w_c_.view();
  }
  TensorView<const Scalar, 2> cproj_weight(int p) const noexcept {
    return const_cast<MultiHeadAttention*>(this)->proj_weight(p);
  }
  TensorView<Scalar, 1> proj_bias(int p) noexcept {
    if (!qkv_bias_) return {};
    return slice(b_in_.view(), 0, p * d_out_, (p + 1) * d_out_);
  }
  TensorView<const Scalar, 1> cproj_bias(int p) const noexcept {
    return const_cast<MultiHeadAttention*>(this)->proj_bias(p);
  }
  const Scalar* bias_ptr(int p) const noexcept {
    return qkv_bias_ ? b_in_.data() + p * d_out_ : nullptr;
  }

  void forward_impl(TensorView<const Scalar, 3> query, TensorView<const Scalar, 3> key,
                    TensorView<const Scalar, 3> value, TensorView<Scalar, 3> out,
                    const AttentionMask<Scalar>& mask, Workspace& ws,
                    TensorView<Scalar, 4> weights) const {
    const char* where = "MultiHeadAttention::forward";
    detail::check_input(where, "query", query, d_in_, "d_in");
    detail::check_input(where, "key", key, kdim_, "kdim");
    detail::check_input(where, "value", value, vdim_, "vdim");
    const Index batch = query.extent(0), tq = query.extent(1), tk = key.extent(1);
    detail::require(key.extent(0) == batch && value.extent(0) == batch, where, [&] {
      return "batch sizes differ: query " + detail::to_string(query.shape()) + ", key " +
             detail::to_string(key.shape()) + ", value " + detail::to_string(value.shape());
    });
    detail::require(value.extent(1) == tk, where, [&] {
      return "key and value lengths differ: key " + detail::to_string(key.shape()) + ", value " +
             detail::to_string(value.shape());
    });
    detail::check_output(where, out, {batch, tq, d_out_});
    detail::check_context(where, "query", tq, context_length_);
    detail::check_context(where, "key", tk, context_length_);

    const Index d = d_out_, hd = head_dim(), h = num_heads_;
    const bool self = detail::same_view(query, key) && detail::same_view(key, value);
    const bool kv_same = detail::same_view(key, value);
    // Projections write straight into a head-major layout (B, P*H, T, hd) for P stacked
    // projections: every head's Q, K and V rows are then contiguous (T, hd) blocks, the
    // kernel's favourite access pattern; no copy and no separate split step.
    const auto head_major = [&](Scalar* buffer, Index tokens, Index stacked) {
      detail::GemmOutput<Scalar> o;
      o.data = buffer;
      o.ldc = hd;
      o.rows_per_batch = tokens;
      o.batch_stride = stacked * tokens * d;
      o.segment = hd;
      o.segment_stride = tokens * hd;
      return o;
    };
    const auto heads_view = [&](const Scalar* base, Index tokens, Index stacked) {
      return TensorView<const Scalar, 4>(base, {batch, h, tokens, hd},
                                         {stacked * tokens * d, tokens * hd, hd, 1});
    };
    TensorView<const Scalar, 4> q4, k4, v4;
    if (self && same_dims_) {
      // One GEMM: x (B*T, d_in) [W_q; W_k; W_v]^T + b -> (B, 3H, T, hd).
      const auto x = detail::as_rows(query, ws, Workspace::kStaging);
      Scalar* qkv = ws.get<Scalar>(Workspace::kProjection, x.rows * 3 * d);
      detail::gemm_nt(x.rows, 3 * d, d_in_, x.data, x.ld, w_a_.data(), d_in_,
                      head_major(qkv, tq, 3), bias_ptr(0), packed_proj(0));
      q4 = heads_view(qkv, tq, 3);
      k4 = heads_view(qkv + tq * d, tq, 3);
      v4 = heads_view(qkv + 2 * tq * d, tq, 3);
    } else {
      const auto xq = detail::as_rows(query, ws, Workspace::kStaging);
      const Index q_rows = xq.rows, kv_rows = batch * tk;
      Scalar* qbuf = ws.get<Scalar>(Workspace::kProjection, q_rows * d + kv_rows * 2 * d);
      Scalar* kvbuf = qbuf + q_rows * d;
      const TensorView<const Scalar, 2> wq = cproj_weight(0), wk = cproj_weight(1),
                                        wv = cproj_weight(2);
      detail::gemm_nt(q_rows, d, d_in_, xq.data, xq.ld, wq.data(), d_in_, head_major(qbuf, tq, 1),
                      bias_ptr(0), packed_proj(0));
      q4 = heads_view(qbuf, tq, 1);
      const bool kv_contiguous = wv.data() == wk.data() + d * kdim_;
      const auto xk = detail::as_rows(key, ws, Workspace::kKeyValue);
      if (kv_same && kdim_ == vdim_ && kv_contiguous) {
        // One GEMM for K and V: key (B*T_k, kdim) [W_k; W_v]^T + b -> (B, 2H, T_k, hd).
        detail::gemm_nt(kv_rows, 2 * d, kdim_, xk.data, xk.ld, wk.data(), kdim_,
                        head_major(kvbuf, tk, 2), bias_ptr(1), packed_proj(1));
        k4 = heads_view(kvbuf, tk, 2);
        v4 = heads_view(kvbuf + tk * d, tk, 2);
      } else {
        Scalar* vbuf = kvbuf + kv_rows * d;
        detail::gemm_nt(kv_rows, d, kdim_, xk.data, xk.ld, wk.data(), kdim_,
                        head_major(kvbuf, tk, 1), bias_ptr(1), packed_proj(1));
        const auto xv = detail::as_rows(value, ws, Workspace::kWeights);
        detail::gemm_nt(kv_rows, d, vdim_, xv.data, xv.ld, wv.data(), vdim_,
                        head_major(vbuf, tk, 1), bias_ptr(2), packed_proj(2));
        k4 = heads_view(kvbuf, tk, 1);
        v4 = heads_view(vbuf, tk, 1);
      }
    }
    // ---- attention: context written into (B, T_q, H, hd) == (B, T_q, D) ----
    Scalar* ctx = ws.get<Scalar>(Workspace::kContext, batch * tq * d);
    const TensorView<Scalar, 4> ctx4(ctx, {batch, h, tq, hd}, {tq * d, hd, d, 1});
    AttentionOptions options;
    if (dropout_.active()) {
      options.dropout = dropout_.p();
      options.dropout_seed = dropout_.seed_value();
      options.dropout_call = dropout_.next_call();
    }
    detail::attend(where, q4, k4, v4, ctx4, mask, options, weights, ws, causal_, alignment_);
    // ---- output projection straight from the merged buffer ----
    detail::linear_forward<Scalar, 3>(
        "Linear::forward", out_proj_.weight(),
        out_proj_.has_bias() ? out_proj_.bias().data() : nullptr,
        TensorView<const Scalar, 3>(ctx, {batch, tq, d}), out,
        frozen_ ? detail::PackedB<Scalar>{&pack_out_, 0} : detail::PackedB<Scalar>{});
  }

  Index d_in_, d_out_, kdim_, vdim_, num_heads_, context_length_;
  bool qkv_bias_, causal_;
  CausalAlignment alignment_;
  bool same_dims_ = true, kv_fused_ = false;
  Tensor<Scalar, 2> w_a_, w_b_, w_c_;  // see proj_weight() for which holds what
  Tensor<Scalar, 1> b_in_;
  Linear<Scalar> out_proj_;
  Dropout<Scalar> dropout_;
  // freeze()'s packs of w_a_, w_b_, w_c_ and out_proj's weight (empty when not frozen).
  detail::PackedGemmB<Scalar> pack_a_, pack_b_, pack_c_, pack_out_;
  bool frozen_ = false;
};

}  // namespace attn
