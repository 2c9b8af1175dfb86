// SPDX-License-Identifier: MIT
// attn/attention/qkv_projection.hpp: QkvProjection, the Q/K/V projections of every attention
// module: their storage (fused, separate, kdim/vdim), init, freezing and GEMMs.
// Glossary: B = batch, T = tokens, H = query heads, H_kv = key/value heads (H_kv divides H;
// grouped-query attention when H_kv < H), hd = head dim (queries and keys), hd_v = value head
// dim (hd unless set), D = H * hd (the query width).
#pragma once

#include <cstddef>
#include <numeric>
#include <string>
#include <type_traits>

#include "attn/attention/detail/module_support.hpp"
#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/nn/linear.hpp"
#include "attn/nn/random.hpp"
#include "attn/ops/gemm.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN

/// Row order of a fused ((H + H_kv) hd + H_kv hd_v, d_in) Q/K/V weight.
enum class QkvLayout {
  /// [W_q; W_k; W_v]: torch.nn.MultiheadAttention's in_proj_weight.
  kStacked,
  /// Per head h: [W_q,h; W_k,h; W_v,h] (3 hd rows each): notebook 004's qkv_layer
  /// followed by reshape(B, T, H, 3 hd) and chunk(3, dim=-1). Needs H_kv == H and hd_v == hd.
  kPerHead,
};

/// The query, key and value projections of an attention module, y = x W^T + b each, with
/// W in nn.Linear's layout: W_q (H hd, d_in), W_k (H_kv hd, kdim), W_v (H_kv hd_v, vdim).
/// The storage follows the input sizes:
/// - d_in == kdim == vdim: one ((H + H_kv) hd + H_kv hd_v, d_in) weight [W_q; W_k; W_v]
///   (nn.MultiheadAttention's in_proj_weight when H_kv == H and hd_v == hd), so
///   self-attention projects with one GEMM (two when hd_v != hd: [W_q; W_k], then W_v);
/// - kdim == vdim != d_in: W_q, and one (H_kv (hd + hd_v), kdim) [W_k; W_v] (one GEMM when
///   key and value are the same tensor and hd_v == hd);
/// - otherwise three weights.
/// The bias is one ((H + H_kv) hd + H_kv hd_v) vector [b_q; b_k; b_v] (nn.MultiheadAttention's
/// in_proj_bias).
///
/// Grouped-query attention (H_kv < H) keeps the stacked storage: the GEMM writes its output
/// in head-dim-wide segments with one stride between them, so Q's H segments followed by
/// K's and V's H_kv each are one head-major (B, H + 2 H_kv, T, hd) buffer whatever the row
/// counts, and self-attention stays one GEMM reading x once.
///
/// project() writes Q, K and V straight into a head-major (B, P, T, hd) buffer of the
/// workspace (P heads per GEMM), so each head's rows are a contiguous (T, hd) block: the
/// kernel's best access pattern, with no split or copy step. One GEMM writes heads of one
/// size: with hd_v != hd, V has a GEMM (and a (B, H_kv, T, hd_v) buffer) of its own.
///
/// freeze() packs the weights into the GEMM's layout once; results are bit for bit those
/// of the unfrozen projection. Every non-const weight accessor unfreezes.
///
/// @tparam Scalar float or double; or bfloat16 or float16 for inference: project() then rounds each
///         float result once (init_* and project_rows() need float or double).
template <class Scalar>
class QkvProjection {
  static_assert(std::is_floating_point_v<Scalar> || detail::is_gemm_storage_v<Scalar>,
                "attn::QkvProjection: Scalar must be float, double, bfloat16 or float16 "
                "(inference only)");

 public:
  /// Projection indices.
  static constexpr int kQuery = 0, kKey = 1, kValue = 2;

  /// Q (B, H, T_q, hd), K (B, H_kv, T_k, hd) and V (B, H_kv, T_k, hd_v) as views into the
  /// workspace (valid until its next use), and the input rows each projection read (the
  /// inputs themselves, or staged copies in the workspace): what a backward needs for the
  /// weight gradients.
  struct Heads {
    TensorView<const Scalar, 4> query, key, value;
    detail::RowsRef<const Scalar> rows[3];
  };

  QkvProjection() = default;

  /// Zero weights for inputs of d_in (query), kdim (key) and vdim (value) features, the
  /// query projected to num_heads * head_dim features, the key to num_kv_heads * head_dim
  /// (0: num_heads) and the value to num_kv_heads * value_head_dim (0: head_dim). Sizes are
  /// the caller's to check (H_kv divides H).
  QkvProjection(Index d_in, Index kdim, Index vdim, Index num_heads, Index head_dim, bool bias,
                Index num_kv_heads = 0, Index value_head_dim = 0)
      : in_{d_in, kdim, vdim},
        heads_(num_heads),
        kv_heads_(num_kv_heads > 0 ? num_kv_heads : num_heads),
        head_dim_(head_dim),
        value_head_dim_(value_head_dim > 0 ? value_head_dim : head_dim) {
    const Index qw = width(kQuery), kw = width(kKey), vw = width(kValue);
    storage_ = d_in == kdim && kdim == vdim ? Storage::kFused
               : kdim == vdim               ? Storage::kKeyValueFused
                                            : Storage::kSeparate;
    if (storage_ == Storage::kFused) {
      w_[0] = Tensor<Scalar, 2>({qw + kw + vw, d_in});
    } else {
      w_[0] = Tensor<Scalar, 2>({qw, d_in});
      if (storage_ == Storage::kKeyValueFused) {
        w_[1] = Tensor<Scalar, 2>({kw + vw, kdim});
      } else {
        w_[1] = Tensor<Scalar, 2>({kw, kdim});
        w_[2] = Tensor<Scalar, 2>({vw, vdim});
      }
    }
    if (bias) bias_ = Tensor<Scalar, 1>({qw + kw + vw});
  }

  // ---- sizes ----

  /// Input features of projection `part` (kQuery: d_in, kKey: kdim, kValue: vdim).
  Index in_features(int part) const { return in_[checked_part(part)]; }
  Index num_heads() const noexcept { return heads_; }
  /// Heads of the key and value projections (H_kv).
  Index num_kv_heads() const noexcept { return kv_heads_; }
  Index head_dim() const noexcept { return head_dim_; }
  /// The value heads' size hd_v (head_dim unless set).
  Index value_head_dim() const noexcept { return value_head_dim_; }
  /// The head size of projection `part`: hd_v for kValue, hd for the others.
  Index head_dim(int part) const {
    return checked_part(part) == kValue ? value_head_dim_ : head_dim_;
  }
  /// Output features of the query projection: num_heads * head_dim.
  Index width() const noexcept { return heads_ * head_dim_; }
  /// Output features of projection `part`: H hd for kQuery, H_kv hd for kKey, H_kv hd_v for
  /// kValue.
  Index width(int part) const {
    return (checked_part(part) == kQuery ? heads_ : kv_heads_) * head_dim(part);
  }
  bool has_bias() const noexcept { return !bias_.empty(); }
  /// True when Q, K and V share one ((H + H_kv) hd + H_kv hd_v, d_in) weight (d_in == kdim ==
  /// vdim).
  bool fused() const noexcept { return storage_ == Storage::kFused; }

  // ---- weights ----

  /// W of projection `part`, (width(part), in_features(part)). The non-const form unfreezes.
  TensorView<Scalar, 2> weight(int part) {
    checked_part(part);
    unfreeze();
    return weight_view(part);
  }
  TensorView<const Scalar, 2> weight(int part) const {
    return const_cast<QkvProjection*>(this)->weight_view(checked_part(part));
  }
  /// b of projection `part`, (width(part)); an empty view without bias (read live).
  TensorView<Scalar, 1> bias(int part) {
    checked_part(part);
    if (!has_bias()) return {};
    return slice(bias_.view(), 0, offset(part), offset(part) + width(part));
  }
  TensorView<const Scalar, 1> bias(int part) const {
    return const_cast<QkvProjection*>(this)->bias(part);
  }
  /// The fused ((H + H_kv) hd + H_kv hd_v, d_in) weight [W_q; W_k; W_v]; unfreezes.
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
  /// The ((H + H_kv) hd + H_kv hd_v) bias [b_q; b_k; b_v]; empty without bias.
  TensorView<Scalar, 1> fused_bias() noexcept { return bias_.view(); }
  TensorView<const Scalar, 1> fused_bias() const noexcept { return bias_.view(); }

  /// Loads a fused ((H + H_kv) hd + H_kv hd_v, d_in) weight and optional bias (an empty
  /// view: none) given in `layout`'s row order. `who` names the caller in messages.
  /// @throws ConfigError unless fused() (and H_kv == H, hd_v == hd for kPerHead); ShapeError
  ///         on wrong shapes or a bias without qkv_bias.
  void set_fused(TensorView<const Scalar, 2> weight, TensorView<const Scalar, 1> bias,
                 QkvLayout layout, const char* who) {
    require_fused(who);
    detail::require_config(
        layout == QkvLayout::kStacked || (kv_heads_ == heads_ && value_head_dim_ == head_dim_), who,
        [&] {
          return "the per-head [q; k; v] layout needs num_kv_heads == num_heads and "
                 "value_head_dim == head_dim (got " +
                 std::to_string(kv_heads_) + " and " + std::to_string(heads_) + ", " +
                 std::to_string(value_head_dim_) + " and " + std::to_string(head_dim_) + ")";
        });
    const Index d = width(), hd = head_dim_, rows = offset(3);
    const Shape<2> expected{rows, in_[0]};
    detail::require(weight.shape() == expected, who, [&] {
      return "weight has shape " + detail::to_string(weight.shape()) + ", expected " +
             detail::to_string(expected);
    });
    const bool with_bias = bias.data() != nullptr;
    detail::require(!with_bias || (has_bias() && bias.extent(0) == rows), who, [&] {
      return has_bias() ? "bias has shape " + detail::to_string(bias.shape()) + ", expected (" +
                              std::to_string(rows) + ")"
                        : std::string("this module was built without qkv_bias");
    });
    unfreeze();
    for (Index row = 0; row < rows; ++row) {
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
      const Tensor<Scalar, 2> w = rand<Scalar>(Shape<2>{in_[p], width(p)}, gen);
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
                           : detail::pack_gemm_b(w.extent(0), w.extent(1), w.data(), w.extent(1),
                                                 pack_segment(s));
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
  /// Q, K, V and the staged inputs go into `ws`; the GEMMs' scratch (packing, a bfloat16
  /// projection's float results) into `scratch` when given (a training forward keeps `ws`).
  Heads project(TensorView<const Scalar, 3> query, TensorView<const Scalar, 3> key,
                TensorView<const Scalar, 3> value, Workspace& ws,
                Workspace* scratch = nullptr) const {
    Workspace& temp = scratch != nullptr ? *scratch : ws;
    using detail::WorkspaceSlot;
    const Index batch = query.extent(0), tq = query.extent(1), tk = key.extent(1);
    const Index qw = width(kQuery), kw = width(kKey), vw = width(kValue);
    const bool kv_same = detail::same_view(key, value);
    const bool one_size = value_head_dim_ == head_dim_;
    // `heads` heads of `hd` at base, in a buffer of `columns` features per token.
    const auto view = [&](const Scalar* base, Index heads, Index tokens, Index columns, Index hd) {
      return TensorView<const Scalar, 4>(base, {batch, heads, tokens, hd},
                                         {tokens * columns, tokens * hd, hd, 1});
    };
    const Index hd = head_dim_, hd_v = value_head_dim_;
    const auto xq = detail::as_rows(query, ws, WorkspaceSlot::kQueryStaging);
    if (fused() && kv_same && detail::same_view(query, key)) {
      // x (B*T, d_in) [W_q; W_k; W_v]^T + b -> (B, H + 2 H_kv, T, hd); with hd_v != hd,
      // x [W_q; W_k]^T -> (B, H + H_kv, T, hd), then x W_v^T -> (B, H_kv, T, hd_v).
      const Index qk = qw + kw, all = qk + vw;
      Scalar* qkv = detail::workspace_get<Scalar>(ws, WorkspaceSlot::kProjection, xq.rows * all);
      if (one_size) {
        gemm_into(xq, tq, kQuery, 3, qkv, temp);
        return {view(qkv, heads_, tq, all, hd),
                view(qkv + tq * qw, kv_heads_, tq, all, hd),
                view(qkv + tq * qk, kv_heads_, tq, all, hd),
                {xq, xq, xq}};
      }
      Scalar* vbuf = qkv + xq.rows * qk;
      gemm_into(xq, tq, kQuery, 2, qkv, temp);
      gemm_into(xq, tq, kValue, 1, vbuf, temp);
      return {view(qkv, heads_, tq, qk, hd),
              view(qkv + tq * qw, kv_heads_, tq, qk, hd),
              view(vbuf, kv_heads_, tq, vw, hd_v),
              {xq, xq, xq}};
    }
    const Index kv_rows = batch * tk;
    Scalar* qbuf = detail::workspace_get<Scalar>(ws, WorkspaceSlot::kProjection,
                                                 xq.rows * qw + kv_rows * (kw + vw));
    Scalar* kbuf = qbuf + xq.rows * qw;
    gemm_into(xq, tq, kQuery, 1, qbuf, temp);  // (B, H, T_q, hd)
    const auto xk = detail::as_rows(key, ws, WorkspaceSlot::kKeyStaging);
    if (kv_same && storage_ != Storage::kSeparate && one_size) {
      // key (B*T_k, kdim) [W_k; W_v]^T + b -> (B, 2 H_kv, T_k, hd)
      gemm_into(xk, tk, kKey, 2, kbuf, temp);
      return {view(qbuf, heads_, tq, qw, hd),
              view(kbuf, kv_heads_, tk, kw + vw, hd),
              view(kbuf + tk * kw, kv_heads_, tk, kw + vw, hd),
              {xq, xk, xk}};
    }
    Scalar* vbuf = kbuf + kv_rows * kw;
    gemm_into(xk, tk, kKey, 1, kbuf, temp);
    const auto xv = kv_same ? xk : detail::as_rows(value, ws, WorkspaceSlot::kValueStaging);
    gemm_into(xv, tk, kValue, 1, vbuf, temp);
    return {view(qbuf, heads_, tq, qw, hd),
            view(kbuf, kv_heads_, tk, kw, hd),
            view(vbuf, kv_heads_, tk, vw, hd_v),
            {xq, xk, xv}};
  }

 private:
  enum class Storage { kFused, kKeyValueFused, kSeparate };

  // Which storage tensor holds projection `part`, and its first row there.
  struct Location {
    int storage;
    Index row;
  };
  // `part`, when it names a projection (kQuery, kKey, kValue); else IndexError.
  static int checked_part(int part) {
    detail::require_that<IndexError>(part >= kQuery && part <= kValue, "QkvProjection", [&] {
      return "projection " + std::to_string(part) + " is not 0 (query), 1 (key) or 2 (value)";
    });
    return part;
  }
  Location locate(int part) const noexcept {
    switch (storage_) {
      case Storage::kFused:
        return {0, offset(part)};
      case Storage::kKeyValueFused:
        return {part == 0 ? 0 : 1, part == 0 ? 0 : offset(part) - offset(kKey)};
      case Storage::kSeparate:
        break;
    }
    return {part, 0};
  }
  // First row of projection `part` in [W_q; W_k; W_v] (and of its bias); offset(3): all rows.
  Index offset(int part) const noexcept {
    const Index rows[4] = {0, heads_ * head_dim_, (heads_ + kv_heads_) * head_dim_,
                           (heads_ + kv_heads_) * head_dim_ + kv_heads_ * value_head_dim_};
    return rows[part];
  }
  // The output segment of freeze()'s pack of storage tensor `s`: the head size of the
  // projections it holds, gcd(hd, hd_v) when it holds W_v and another (each GEMM writes
  // heads of one size, a multiple of it, from a row that is one too).
  Index pack_segment(int s) const noexcept {
    const bool holds_value = s == 2 || (s == 0 && storage_ == Storage::kFused) ||
                             (s == 1 && storage_ == Storage::kKeyValueFused);
    if (!holds_value) return head_dim_;
    return s == 2 ? value_head_dim_ : std::gcd(head_dim_, value_head_dim_);
  }
  // True when projections part .. part + count - 1 have heads of one size (one GEMM).
  bool one_head_size(int part, int count) const noexcept {
    return value_head_dim_ == head_dim_ || part + count <= kValue || (part == kValue && count == 1);
  }

  TensorView<Scalar, 2> weight_view(int part) noexcept {
    const Location at = locate(part);
    return slice(w_[at.storage].view(), 0, at.row, at.row + width(part));
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
  // (B, heads of those projections, T, hd), each head's rows a contiguous (T, hd) block.
  void gemm_into(const detail::RowsRef<const Scalar>& x, Index tokens, int part, int count,
                 Scalar* dst, Workspace& ws) const {
    const Index columns = offset(part + count) - offset(part), hd = head_dim(part);
    if constexpr (detail::is_gemm_storage_v<Scalar>) {  // float sums, rounded once into dst
      const Location at = locate(part);
      const Index in = in_[part];
      detail::gemm_nt_rounded(
          x.rows, columns, in, x.data, x.ld, w_[at.storage].data() + at.row * in, in, dst,
          [&](float* wide) {
            return detail::GemmOutput<float>::head_major(wide, tokens, columns, hd);
          },
          has_bias() ? bias_.data() + offset(part) : nullptr, packed(at), ws);
    } else {
      project_rows(x, part, count, detail::GemmOutput<Scalar>::head_major(dst, tokens, columns, hd),
                   ws);
    }
  }
  // freeze()'s pack of the storage tensor at `at` from its row, or none.
  detail::PackedB<Scalar> packed(const Location& at) const noexcept {
    return frozen_ ? detail::PackedB<Scalar>{&pack_[at.storage], at.row}
                   : detail::PackedB<Scalar>{};
  }

 public:
  /// Projections part .. part + count - 1 of the rows x (B T rows of in_features(part)
  /// features), written through `out` in head_dim-wide segments (see detail::GemmOutput):
  /// for a caller that places the heads itself, as the incremental forward writes K and V
  /// straight into a KVCache. The projections must share one stored weight (count 1, the
  /// fused storage, or K and V with kdim == vdim) and one head size (out's segment). Sizes
  /// are the caller's to check.
  void project_rows(const detail::RowsRef<const Scalar>& x, int part, int count,
                    const detail::GemmOutput<Scalar>& out, Workspace& ws) const {
    ATTN_ASSERT(one_head_size(part, count));
    const Location at = locate(part);
    const Index columns = offset(part + count) - offset(part), in = in_[part];
    const Scalar* bias = has_bias() ? bias_.data() + offset(part) : nullptr;
    if constexpr (detail::is_gemm_storage_v<Scalar>) {
      // The float sums of gemm_into() (row-major in the workspace, after the widened bias),
      // each rounded once, to nearest even, into out's layout: the same bits.
      if (x.rows <= 0 || columns <= 0) return;
      float* wide = detail::workspace_get<float>(ws, detail::WorkspaceSlot::kWideOutput,
                                                 columns + x.rows * columns);
      for (Index j = 0; j < (bias != nullptr ? columns : 0); ++j) wide[j] = bias[j];
      detail::gemm_nt(x.rows, columns, in, x.data, x.ld, w_[at.storage].data() + at.row * in, in,
                      detail::GemmOutput<float>::row_major(wide + columns, columns),
                      bias != nullptr ? static_cast<const float*>(wide) : nullptr, packed(at), &ws);
      const Index segment = out.segment > 0 ? out.segment : columns;
      for (Index i = 0; i < x.rows; ++i) {
        Scalar* row = out.row(i);
        const float* from = wide + columns + i * columns;
        for (Index j = 0; j < columns; ++j) row[out.column(j, segment)] = Scalar(from[j]);
      }
    } else {
      detail::gemm_nt(x.rows, columns, in, x.data, x.ld, w_[at.storage].data() + at.row * in, in,
                      out, bias, packed(at), &ws);
    }
  }

 private:
  Index in_[3] = {0, 0, 0};
  Index heads_ = 0, kv_heads_ = 0, head_dim_ = 0, value_head_dim_ = 0;
  Storage storage_ = Storage::kFused;
  Tensor<Scalar, 2> w_[3];  // see locate(): which holds which projection
  Tensor<Scalar, 1> bias_;
  detail::PackedGemmB<Scalar> pack_[3];  // freeze()'s packs of w_ (empty when not frozen)
  bool frozen_ = false;
};

ATTN_NAMESPACE_END
