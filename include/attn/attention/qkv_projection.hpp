// SPDX-License-Identifier: MIT
// attn/attention/qkv_projection.hpp: QkvProjection, the Q/K/V projections of every attention
// module: their storage (fused, separate, kdim/vdim), init, freezing and GEMMs.
// Glossary: B = batch, T = tokens, H = heads, hd = head dim, D = H * hd (the projection width).
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>

#include "attn/attention/detail/module_support.hpp"
#include "attn/config.hpp"
#include "attn/detail/gemm.hpp"
#include "attn/error.hpp"
#include "attn/nn/linear.hpp"
#include "attn/nn/random.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN

/// Row order of a fused (3 D, d_in) Q/K/V weight.
enum class QkvLayout {
  /// [W_q; W_k; W_v]: torch.nn.MultiheadAttention's in_proj_weight.
  kStacked,
  /// Per head h: [W_q,h; W_k,h; W_v,h] (3 hd rows each): notebook 004's qkv_layer
  /// followed by reshape(B, T, H, 3 hd) and chunk(3, dim=-1).
  kPerHead,
};

/// The query, key and value projections of an attention module, y = x W^T + b each, with
/// W (D, in_features) in nn.Linear's layout. The storage follows the input sizes:
/// - d_in == kdim == vdim: one (3 D, d_in) weight [W_q; W_k; W_v] (nn.MultiheadAttention's
///   in_proj_weight), so self-attention projects with one GEMM;
/// - kdim == vdim != d_in: W_q, and one (2 D, kdim) [W_k; W_v] (one GEMM when key and
///   value are the same tensor);
/// - otherwise three weights.
/// The bias is one (3 D) vector [b_q; b_k; b_v] (nn.MultiheadAttention's in_proj_bias).
///
/// project() writes Q, K and V straight into a head-major (B, P*H, T, hd) buffer of the
/// workspace (P projections per GEMM), so each head's rows are a contiguous (T, hd) block:
/// the kernel's best access pattern, with no split or copy step.
///
/// freeze() packs the weights into the GEMM's layout once; results are bit for bit those
/// of the unfrozen projection. Every non-const weight accessor unfreezes.
///
/// @tparam Scalar float or double.
template <class Scalar>
class QkvProjection {
  static_assert(std::is_floating_point_v<Scalar>,
                "attn::QkvProjection: Scalar must be float or double");

 public:
  /// Projection indices.
  static constexpr int kQuery = 0, kKey = 1, kValue = 2;

  /// Q, K, V as (B, H, T, hd) views into the workspace (valid until its next use), and the
  /// input rows each projection read (the inputs themselves, or staged copies in the
  /// workspace): what a backward needs for the weight gradients.
  struct Heads {
    TensorView<const Scalar, 4> query, key, value;
    detail::RowsRef<const Scalar> rows[3];
  };

  QkvProjection() = default;

  /// Zero weights for inputs of d_in (query), kdim (key) and vdim (value) features, each
  /// projected to num_heads * head_dim features.
  QkvProjection(Index d_in, Index kdim, Index vdim, Index num_heads, Index head_dim, bool bias)
      : in_{d_in, kdim, vdim}, heads_(num_heads), head_dim_(head_dim) {
    const Index d = width();
    storage_ = d_in == kdim && kdim == vdim ? Storage::kFused
               : kdim == vdim               ? Storage::kKeyValueFused
                                            : Storage::kSeparate;
    if (storage_ == Storage::kFused) {
      w_[0] = Tensor<Scalar, 2>({3 * d, d_in});
    } else {
      w_[0] = Tensor<Scalar, 2>({d, d_in});
      if (storage_ == Storage::kKeyValueFused) {
        w_[1] = Tensor<Scalar, 2>({2 * d, kdim});
      } else {
        w_[1] = Tensor<Scalar, 2>({d, kdim});
        w_[2] = Tensor<Scalar, 2>({d, vdim});
      }
    }
    if (bias) bias_ = Tensor<Scalar, 1>({3 * d});
  }

  // ---- sizes ----

  /// Input features of projection `part` (kQuery: d_in, kKey: kdim, kValue: vdim).
  Index in_features(int part) const noexcept { return in_[part]; }
  Index num_heads() const noexcept { return heads_; }
  Index head_dim() const noexcept { return head_dim_; }
  /// Output features of each projection: num_heads * head_dim.
  Index width() const noexcept { return heads_ * head_dim_; }
  bool has_bias() const noexcept { return !bias_.empty(); }
  /// True when Q, K and V share one (3 D, d_in) weight (d_in == kdim == vdim).
  bool fused() const noexcept { return storage_ == Storage::kFused; }

  // ---- weights ----

  /// W of projection `part`, (D, in_features(part)). The non-const form unfreezes.
  TensorView<Scalar, 2> weight(int part) noexcept {
    unfreeze();
    return weight_view(part);
  }
  TensorView<const Scalar, 2> weight(int part) const noexcept {
    return const_cast<QkvProjection*>(this)->weight_view(part);
  }
  /// b of projection `part`, (D); an empty view without bias (biases are read live).
  TensorView<Scalar, 1> bias(int part) noexcept {
    if (!has_bias()) return {};
    return slice(bias_.view(), 0, part * width(), (part + 1) * width());
  }
  TensorView<const Scalar, 1> bias(int part) const noexcept {
    return const_cast<QkvProjection*>(this)->bias(part);
  }
  /// The fused (3 D, d_in) weight [W_q; W_k; W_v]; unfreezes.
  /// @throws ConfigError naming `who` unless fused().
  TensorView<Scalar, 2> fused_weight(const char* who) {
    require_fused(who);
    unfreeze();
    return w_[0].view();
  }
  TensorView<const Scalar, 2> fused_weight(const char* who) const {
    require_fused(who);
    return w_[0].view();
  }
  /// The (3 D) bias [b_q; b_k; b_v]; empty without bias.
  TensorView<Scalar, 1> fused_bias() noexcept { return bias_.view(); }
  TensorView<const Scalar, 1> fused_bias() const noexcept { return bias_.view(); }

  /// Loads a fused (3 D, d_in) weight and optional (3 D) bias (an empty view: none) given
  /// in `layout`'s row order. `who` names the caller in messages.
  /// @throws ConfigError unless fused(); ShapeError on wrong shapes or a bias without qkv_bias.
  void set_fused(TensorView<const Scalar, 2> weight, TensorView<const Scalar, 1> bias,
                 QkvLayout layout, const char* who) {
    require_fused(who);
    const Index d = width(), hd = head_dim_;
    const Shape<2> expected{3 * d, in_[0]};
    detail::require(weight.shape() == expected, who, [&] {
      return "weight has shape " + detail::to_string(weight.shape()) + ", expected " +
             detail::to_string(expected);
    });
    const bool with_bias = bias.data() != nullptr;
    detail::require(!with_bias || (has_bias() && bias.extent(0) == 3 * d), who, [&] {
      return has_bias() ? "bias has shape " + detail::to_string(bias.shape()) + ", expected (" +
                              std::to_string(3 * d) + ")"
                        : std::string("this module was built without qkv_bias");
    });
    unfreeze();
    for (Index row = 0; row < 3 * d; ++row) {
      // destination row in [Q; K; V] order for source row `row`
      Index dst = row;
      if (layout == QkvLayout::kPerHead) {
        const Index h = row / (3 * hd), c = (row % (3 * hd)) / hd, e = row % hd;
        dst = c * d + h * hd + e;
      }
      copy(select(weight, 0, row), select(w_[0].view(), 0, dst));
      if (with_bias) bias_(dst) = bias(row);
    }
  }

  // ---- initialisation (each draws from `gen` in PyTorch's order) ----

  /// As three nn.Linear(in_features(p), D, bias): W_q (then b_q), W_k, W_v.
  void init_linear(TorchGenerator& gen) {
    unfreeze();
    for (int p = 0; p < 3; ++p) {
      const double w = detail::linear_weight_bound(in_[p]), b = detail::linear_bias_bound(in_[p]);
      gen.fill_uniform(weight_view(p), -w, w);
      if (has_bias()) gen.fill_uniform(bias(p), -b, b);
    }
  }
  /// As notebook 003's SelfAttention_v1: nn.Parameter(torch.rand(in_features(p), D)) for
  /// W_query, W_key, W_value, stored transposed (they are applied as x @ W).
  void init_rand(TorchGenerator& gen) {
    unfreeze();
    for (int p = 0; p < 3; ++p) {
      const Tensor<Scalar, 2> w = rand<Scalar>(Shape<2>{in_[p], width()}, gen);
      copy(transpose(w.view()), weight_view(p));
    }
  }
  /// As torch.nn.MultiheadAttention: xavier_uniform_ on in_proj_weight (or on each of
  /// q/k/v_proj_weight), biases zero.
  void init_xavier(TorchGenerator& gen) {
    unfreeze();
    const auto xavier = [&](TensorView<Scalar, 2> w) {
      const double bound = detail::xavier_uniform_bound(w.extent(1), w.extent(0));
      gen.fill_uniform(w, -bound, bound);
    };
    if (fused()) {
      xavier(w_[0].view());
    } else {
      for (int p = 0; p < 3; ++p) xavier(weight_view(p));
    }
    bias_.fill(Scalar(0));
  }

  // ---- frozen weights ----

  /// Packs the weights for the GEMM once (as much memory again as the weights).
  void freeze() {
    for (int s = 0; s < 3; ++s) {
      const Tensor<Scalar, 2>& w = w_[s];
      pack_[s] = w.empty() ? detail::PackedGemmB<Scalar>()
                           : detail::pack_gemm_b(w.extent(0), w.extent(1), w.data(),
                                                 w.extent(1), head_dim_);
    }
    frozen_ = true;
  }
  void unfreeze() noexcept {
    frozen_ = false;
    for (auto& pack : pack_) pack = {};
  }
  bool is_frozen() const noexcept { return frozen_; }

  // ---- the projection GEMMs ----

  /// Projects query (B, T_q, d_in), key (B, T_k, kdim) and value (B, T_k, vdim) into the
  /// workspace. One GEMM for self-attention with fused weights (query, key and value the
  /// same view); else one for Q and one for K and V together when key and value are the
  /// same view and their weights are stacked, else one each. Inputs whose rows cannot be
  /// read in place (strided) are staged contiguously first. Shapes are the caller's to check.
  Heads project(TensorView<const Scalar, 3> query, TensorView<const Scalar, 3> key,
                TensorView<const Scalar, 3> value, Workspace& ws) const {
    using detail::WorkspaceSlot;
    const Index batch = query.extent(0), tq = query.extent(1), tk = key.extent(1);
    const Index d = width();
    const bool kv_same = detail::same_view(key, value);
    const auto heads = [&](const Scalar* base, Index tokens, int stacked) {
      return TensorView<const Scalar, 4>(base, {batch, heads_, tokens, head_dim_},
                                         {stacked * tokens * d, tokens * head_dim_, head_dim_, 1});
    };
    const auto xq = detail::as_rows(query, ws, WorkspaceSlot::kQueryStaging);
    if (fused() && kv_same && detail::same_view(query, key)) {
      // x (B*T, d_in) [W_q; W_k; W_v]^T + b -> (B, 3H, T, hd)
      Scalar* qkv = detail::workspace_get<Scalar>(ws, WorkspaceSlot::kProjection, xq.rows * 3 * d);
      gemm_into(xq, tq, kQuery, 3, qkv, ws);
      return {heads(qkv, tq, 3),
              heads(qkv + tq * d, tq, 3),
              heads(qkv + 2 * tq * d, tq, 3),
              {xq, xq, xq}};
    }
    const Index kv_rows = batch * tk;
    Scalar* qbuf = detail::workspace_get<Scalar>(ws, WorkspaceSlot::kProjection,
                                                 xq.rows * d + kv_rows * 2 * d);
    Scalar* kbuf = qbuf + xq.rows * d;
    gemm_into(xq, tq, kQuery, 1, qbuf, ws);  // (B, H, T_q, hd)
    const auto xk = detail::as_rows(key, ws, WorkspaceSlot::kKeyStaging);
    if (kv_same && storage_ != Storage::kSeparate) {
      // key (B*T_k, kdim) [W_k; W_v]^T + b -> (B, 2H, T_k, hd)
      gemm_into(xk, tk, kKey, 2, kbuf, ws);
      return {heads(qbuf, tq, 1), heads(kbuf, tk, 2), heads(kbuf + tk * d, tk, 2), {xq, xk, xk}};
    }
    Scalar* vbuf = kbuf + kv_rows * d;
    gemm_into(xk, tk, kKey, 1, kbuf, ws);
    const auto xv = detail::as_rows(value, ws, WorkspaceSlot::kValueStaging);
    gemm_into(xv, tk, kValue, 1, vbuf, ws);
    return {heads(qbuf, tq, 1), heads(kbuf, tk, 1), heads(vbuf, tk, 1), {xq, xk, xv}};
  }

 private:
  enum class Storage { kFused, kKeyValueFused, kSeparate };

  // Which storage tensor holds projection `part`, and its first row there.
  struct Location {
    int storage;
    Index row;
  };
  Location locate(int part) const noexcept {
    switch (storage_) {
      case Storage::kFused:
        return {0, part * width()};
      case Storage::kKeyValueFused:
        return {part == 0 ? 0 : 1, part == 0 ? 0 : (part - 1) * width()};
      case Storage::kSeparate:
        break;
    }
    return {part, 0};
  }

  TensorView<Scalar, 2> weight_view(int part) noexcept {
    const Location at = locate(part);
    return slice(w_[at.storage].view(), 0, at.row, at.row + width());
  }

  void require_fused(const char* who) const {
    detail::require_config(fused(), who, [&] {
      return "kdim=" + std::to_string(in_[1]) + " and vdim=" + std::to_string(in_[2]) +
             " differ from d_in=" + std::to_string(in_[0]) +
             ", so Q/K/V have separate weights (q/k/v_proj_weight)";
    });
  }

  // Projections part .. part + count - 1 (stacked in one storage tensor) of the rows `x`
  // of an input with `tokens` tokens per batch item, written head-major into `dst`:
  // (B, count*H, T, hd), each head's rows a contiguous (T, hd) block.
  void gemm_into(const detail::RowsRef<const Scalar>& x, Index tokens, int part, int count,
                 Scalar* dst, Workspace& ws) const {
    const Location at = locate(part);
    const Index d = width(), in = in_[part];
    detail::GemmOutput<Scalar> out;
    out.data = dst;
    out.ldc = head_dim_;
    out.rows_per_batch = tokens;
    out.batch_stride = count * tokens * d;
    out.segment = head_dim_;
    out.segment_stride = tokens * head_dim_;
    const Scalar* bias = has_bias() ? bias_.data() + part * d : nullptr;
    const detail::PackedB<Scalar> packed =
        frozen_ ? detail::PackedB<Scalar>{&pack_[at.storage], at.row} : detail::PackedB<Scalar>{};
    detail::gemm_nt(x.rows, count * d, in, x.data, x.ld, w_[at.storage].data() + at.row * in, in,
                    out, bias, packed, &ws);
  }

  Index in_[3] = {0, 0, 0};
  Index heads_ = 0, head_dim_ = 0;
  Storage storage_ = Storage::kFused;
  Tensor<Scalar, 2> w_[3];  // see locate(): which holds which projection
  Tensor<Scalar, 1> bias_;
  detail::PackedGemmB<Scalar> pack_[3];  // freeze()'s packs of w_ (empty when not frozen)
  bool frozen_ = false;
};

ATTN_NAMESPACE_END
