// SPDX-License-Identifier: MIT
// attn/attention/scaled_dot_product.hpp: the public attention kernel, softmax(Q K^T * scale +
// mask) V, on strided views: a materialised path (returns weights; the reference) and a
// streaming path; the form that also writes each query's logsumexp (for the backward).
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>

#include "attn/attention/detail/call.hpp"
#include "attn/attention/options.hpp"
#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/nn/mask.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"
#include "attn/types/element.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN
/// Scaled dot-product attention on strided views, writing into `out`:
/// out = softmax(q k^T * scale + mask) v, per (batch, head), with optional inverted dropout
/// on the weights. Vaswani et al., "Attention Is All You Need" (2017).
///
/// Arguments come in the order every attn call uses: inputs, outputs, workspace, mask,
/// options (the modules' forward(x, out, ws, mask) is the same order). The workspace may be
/// left out (a temporary one is used); with one, a steady-state call does not allocate.
///
/// Shapes: q (B, H, T_q, d), k (B, H_kv, T_k, d), v (B, H_kv, T_k, d_v) -> out (B, H, T_q,
/// d_v). H_kv = H is multi-head attention; H_kv dividing H is grouped-query (H_kv = 1:
/// multi-query) attention, PyTorch's enable_gqa: query head h reads key/value head
/// h / (H / H_kv), with no copy of K or V. Masks and weights have H heads.
/// The last axis of every view must have stride 1; the other strides are free (heads split
/// by view work directly). `out` may be `q` itself (same data, shape and strides: in place,
/// when d_v == d); otherwise `out` and `weights` must share no memory with q, k, v, the
/// mask or each other, and each needs one location per element (no zero strides).
///
/// A query row with no visible key (fully masked) gives zeros in `out`. Runs in parallel
/// over (batch, head, query tile) when built with OpenMP; results are bit-identical for any
/// thread count.
///
/// Scalar may also be bfloat16 or float16 (q, k, v and out of that type; the mask and the
/// options' per-head values in float): the products accumulate in float, the softmax runs
/// in float, P is rounded to Scalar before it multiplies V and out is rounded once, as
/// PyTorch's CPU flash attention computes. bfloat16 products run on AMX or AVX512-BF16 where
/// bf16_path() says so, widened to float otherwise; docs/precision.md lists every rounding.
/// Those types take the streaming path only (AttentionPath::kMaterialized is a ConfigError).
///
/// @throws ShapeError on mismatched or empty shapes, a misfitting mask, non-unit inner
///         strides, or outputs that share memory as above; ConfigError on dropout outside
///         [0, 1) or a scale that is not finite as a double or as Scalar.
template <class Scalar>
void scaled_dot_product_attention(TensorView<const detail::identity_t<Scalar>, 4> q,
                                  TensorView<const detail::identity_t<Scalar>, 4> k,
                                  TensorView<const detail::identity_t<Scalar>, 4> v,
                                  TensorView<Scalar, 4> out, Workspace& workspace,
                                  const AttentionMask<compute_type_t<Scalar>>& mask = {},
                                  const AttentionOptions& options = {}) {
  static_assert(std::is_floating_point_v<Scalar> || std::is_same_v<Scalar, bfloat16> ||
                    std::is_same_v<Scalar, float16>,
                "attn::scaled_dot_product_attention: Scalar must be float, double, bfloat16 or "
                "float16");
  if constexpr (std::is_floating_point_v<Scalar>) {
    detail::attend("scaled_dot_product_attention", q, k, v, out, mask, options, {}, workspace);
  } else {
    detail::attend_storage("scaled_dot_product_attention", q, k, v, out, mask, options, workspace);
  }
}

/// The same with a temporary workspace.
template <class Scalar>
void scaled_dot_product_attention(TensorView<const detail::identity_t<Scalar>, 4> q,
                                  TensorView<const detail::identity_t<Scalar>, 4> k,
                                  TensorView<const detail::identity_t<Scalar>, 4> v,
                                  TensorView<Scalar, 4> out,
                                  const AttentionMask<compute_type_t<Scalar>>& mask = {},
                                  const AttentionOptions& options = {}) {
  Workspace workspace;
  scaled_dot_product_attention<Scalar>(q, k, v, out, workspace, mask, options);
}

/// scaled_dot_product_attention() that also writes each query's logsumexp into `logsumexp`
/// (B, H, T_q): log sum_j exp(s_ij) over the scaled, masked scores the query sees (before
/// dropout), +inf for a query whose masks hide every key. The streaming backward
/// recomputes the probabilities from it; `out` is the same, bit for bit, as without it.
/// @throws as scaled_dot_product_attention(), and ShapeError when `logsumexp` is not
///         (B, H, T_q), has elements sharing memory, or overlaps another argument.
template <class Scalar>
void scaled_dot_product_attention(TensorView<const detail::identity_t<Scalar>, 4> q,
                                  TensorView<const detail::identity_t<Scalar>, 4> k,
                                  TensorView<const detail::identity_t<Scalar>, 4> v,
                                  TensorView<Scalar, 4> out, TensorView<Scalar, 3> logsumexp,
                                  Workspace& workspace,
                                  const AttentionMask<detail::identity_t<Scalar>>& mask = {},
                                  const AttentionOptions& options = {}) {
  static_assert(std::is_floating_point_v<Scalar>,
                "attn::scaled_dot_product_attention: Scalar must be float or double");
  detail::require(logsumexp.data() != nullptr, "scaled_dot_product_attention",
                  [] { return std::string("logsumexp is empty"); });
  detail::attend("scaled_dot_product_attention", q, k, v, out, mask, options, {}, workspace, {},
                 logsumexp);
}

/// Also writes the attention weights (after dropout), (B, H, T_q, T_k), into `weights`,
/// which forces the materialised path (an empty `weights` view: none are written).
/// @throws as scaled_dot_product_attention(), and ShapeError with AttentionPath::kStreaming.
template <class Scalar>
void scaled_dot_product_attention_with_weights(
    TensorView<const detail::identity_t<Scalar>, 4> q,
    TensorView<const detail::identity_t<Scalar>, 4> k,
    TensorView<const detail::identity_t<Scalar>, 4> v, TensorView<Scalar, 4> out,
    TensorView<Scalar, 4> weights, Workspace& workspace,
    const AttentionMask<detail::identity_t<Scalar>>& mask = {},
    const AttentionOptions& options = {}) {
  static_assert(std::is_floating_point_v<Scalar>,
                "attn::scaled_dot_product_attention: Scalar must be float or double");
  detail::attend("scaled_dot_product_attention", q, k, v, out, mask, options, weights, workspace);
}

/// The same with a temporary workspace.
template <class Scalar>
void scaled_dot_product_attention_with_weights(
    TensorView<const detail::identity_t<Scalar>, 4> q,
    TensorView<const detail::identity_t<Scalar>, 4> k,
    TensorView<const detail::identity_t<Scalar>, 4> v, TensorView<Scalar, 4> out,
    TensorView<Scalar, 4> weights, const AttentionMask<detail::identity_t<Scalar>>& mask = {},
    const AttentionOptions& options = {}) {
  Workspace workspace;
  scaled_dot_product_attention_with_weights<Scalar>(q, k, v, out, weights, workspace, mask,
                                                    options);
}

/// The result of every call that returns attention weights (the allocating
/// scaled_dot_product_attention_with_weights() and every module's forward_with_weights()):
/// the output (..., T_q, d_v) and the weights (..., T_q, T_k), after dropout. The weights
/// have rank WeightsRank: the output's for the kernel and single-head modules, one more
/// (a heads axis, (B, H, T_q, T_k)) for multi-head modules.
template <class Scalar, std::size_t Rank, std::size_t WeightsRank = Rank>
struct AttentionResult {
  Tensor<Scalar, Rank> output;
  Tensor<Scalar, WeightsRank> weights;
};

namespace detail {

template <class Scalar, std::size_t Rank>
TensorView<Scalar, 4> to_rank4(TensorView<Scalar, Rank> x) {
  static_assert(Rank >= 2 && Rank <= 4,
                "attn::scaled_dot_product_attention: inputs have rank 2 (T, d), 3 (B, T, d) "
                "or 4 (B, H, T, d)");
  if constexpr (Rank == 4) {
    return x;
  } else if constexpr (Rank == 3) {
    return unsqueeze(x, 1);
  } else {
    return unsqueeze(unsqueeze(x, 0), 0);
  }
}

template <class Scalar, std::size_t Rank>
AttentionResult<Scalar, Rank> sdpa_allocating(TensorView<const Scalar, Rank> q,
                                              TensorView<const Scalar, Rank> k,
                                              TensorView<const Scalar, Rank> v,
                                              const AttentionMask<compute_type_t<Scalar>>& mask,
                                              const AttentionOptions& options, bool need_weights) {
  Shape<Rank> out_shape = q.shape(), weights_shape = q.shape();
  out_shape[Rank - 1] = v.extent(Rank - 1);
  weights_shape[Rank - 1] = k.extent(Rank - 2);
  // Validate with the caller's rank first so messages show the shapes the caller passed.
  require(k.extent(Rank - 2) == v.extent(Rank - 2) && q.extent(Rank - 1) == k.extent(Rank - 1),
          "scaled_dot_product_attention", [&] {
            return "q " + to_string(q.shape()) + ", k " + to_string(k.shape()) + ", v " +
                   to_string(v.shape()) +
                   " do not fit (..., T_q, d), (..., T_k, d), (..., T_k, d_v)";
          });
  AttentionResult<Scalar, Rank> result;
  result.output = Tensor<Scalar, Rank>(out_shape);
  if (need_weights) result.weights = Tensor<Scalar, Rank>(weights_shape);
  if constexpr (std::is_floating_point_v<Scalar>) {
    TensorView<Scalar, 4> weights4{};
    if (need_weights) weights4 = to_rank4(result.weights.view());
    scaled_dot_product_attention_with_weights<Scalar>(to_rank4(q), to_rank4(k), to_rank4(v),
                                                      to_rank4(result.output.view()), weights4,
                                                      mask, options);
  } else {  // storage types: no weights (the allocating with_weights forms are float only)
    scaled_dot_product_attention<Scalar>(to_rank4(q), to_rank4(k), to_rank4(v),
                                         to_rank4(result.output.view()), mask, options);
  }
  return result;
}

}  // namespace detail

/// Allocating form for rank 2 (T, d), 3 (B, T, d; one head) or 4 (B, H, T, d) inputs.
/// Masks broadcast as described in AttentionMask.
template <class Scalar, std::size_t Rank>
Tensor<std::remove_const_t<Scalar>, Rank> scaled_dot_product_attention(
    TensorView<Scalar, Rank> q, TensorView<Scalar, Rank> k, TensorView<Scalar, Rank> v,
    const AttentionMask<compute_type_t<Scalar>>& mask = {}, const AttentionOptions& options = {}) {
  using S = std::remove_const_t<Scalar>;
  return detail::sdpa_allocating<S, Rank>(q, k, v, mask, options, false).output;
}

template <class Scalar, std::size_t Rank>
Tensor<Scalar, Rank> scaled_dot_product_attention(
    const Tensor<Scalar, Rank>& q, const Tensor<Scalar, Rank>& k, const Tensor<Scalar, Rank>& v,
    const AttentionMask<compute_type_t<Scalar>>& mask = {}, const AttentionOptions& options = {}) {
  return detail::sdpa_allocating<Scalar, Rank>(q.view(), k.view(), v.view(), mask, options, false)
      .output;
}

/// Allocating form that also returns the attention weights (..., T_q, T_k), computed on
/// the materialised path.
template <class Scalar, std::size_t Rank>
AttentionResult<std::remove_const_t<Scalar>, Rank> scaled_dot_product_attention_with_weights(
    TensorView<Scalar, Rank> q, TensorView<Scalar, Rank> k, TensorView<Scalar, Rank> v,
    const AttentionMask<std::remove_const_t<Scalar>>& mask = {},
    const AttentionOptions& options = {}) {
  using S = std::remove_const_t<Scalar>;
  return detail::sdpa_allocating<S, Rank>(q, k, v, mask, options, true);
}

template <class Scalar, std::size_t Rank>
AttentionResult<Scalar, Rank> scaled_dot_product_attention_with_weights(
    const Tensor<Scalar, Rank>& q, const Tensor<Scalar, Rank>& k, const Tensor<Scalar, Rank>& v,
    const AttentionMask<Scalar>& mask = {}, const AttentionOptions& options = {}) {
  return detail::sdpa_allocating<Scalar, Rank>(q.view(), k.view(), v.view(), mask, options, true);
}

ATTN_NAMESPACE_END
