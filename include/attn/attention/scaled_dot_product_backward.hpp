// SPDX-License-Identifier: MIT
// attn/attention/scaled_dot_product_backward.hpp: the backward pass of scaled dot-product
// attention (both paths).
// Glossary: B = batch, H = heads, T_q / T_k = query / key tokens, d = head dim, d_v = value
// head dim.
#pragma once

#include <cmath>
#include <cstddef>
#include <string>
#include <type_traits>

#include "attn/attention/detail/call.hpp"
#include "attn/attention/scaled_dot_product.hpp"
#include "attn/config.hpp"
#include "attn/detail/checked.hpp"
#include "attn/error.hpp"
#include "attn/nn/mask.hpp"
#include "attn/tensor/overlap.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN

/// The backward pass of out = scaled_dot_product_attention(q, k, v, mask, options): given
/// grad_out = dL/d out, ADDS dL/dq, dL/dk and dL/dv into grad_q, grad_k and grad_v (zero
/// them first; PyTorch's .grad semantics). Pass the forward's inputs, output, mask and
/// options (the same dropout seed and call: the same keep decisions are redrawn).
///
/// Paths, as options.path says:
/// - streaming (kAuto, kStreaming): recomputes P = exp(S - logsumexp) tile by tile from the
///   forward's `logsumexp` (scaled_dot_product_attention(q, k, v, out, logsumexp, ...)),
///   with D_i = rowsum(dO_i * O_i) and dS = P (dP - D); causal tiles above the diagonal are
///   skipped; O(T (d + d_v)) extra memory. Key-tile tasks own dK and dV, query-tile tasks
///   own dQ: no atomics, results bit-identical for any thread count.
/// - materialised (kMaterialized): recomputes each head's whole P as the forward's
///   materialised path does (same bits), then the dense formulas; `logsumexp` may be empty.
///   O(T_q T_k) memory per thread; the reference the streaming path is tested against.
/// A query whose masks hide every key contributes nothing (zero gradients through it).
/// grad_q, grad_k and grad_v may be the same view (self-attention: q = k = v = x), which
/// then receives the sum.
///
/// @throws as scaled_dot_product_attention() for q, k, v, out, the mask and options;
///         ShapeError for gradients or grad_out of the wrong shape or a non-unit inner stride,
///         a missing or misshapen logsumexp on the streaming path, or gradients that share
///         memory with an input, the mask or each other (other than being the same view).
template <class Scalar>
void scaled_dot_product_attention_backward(
    TensorView<const detail::identity_t<Scalar>, 4> q,
    TensorView<const detail::identity_t<Scalar>, 4> k,
    TensorView<const detail::identity_t<Scalar>, 4> v,
    TensorView<const detail::identity_t<Scalar>, 4> out,
    TensorView<const detail::identity_t<Scalar>, 4> grad_out,
    TensorView<const detail::identity_t<Scalar>, 3> logsumexp, TensorView<Scalar, 4> grad_q,
    TensorView<Scalar, 4> grad_k, TensorView<Scalar, 4> grad_v, Workspace& workspace,
    const AttentionMask<detail::identity_t<Scalar>>& mask = {},
    const AttentionOptions& options = {}) {
  static_assert(std::is_floating_point_v<Scalar>,
                "attn::scaled_dot_product_attention_backward: Scalar must be float or double");
  detail::attend_backward<Scalar>("scaled_dot_product_attention_backward", q, k, v, out, logsumexp,
                                  {grad_out, grad_q, grad_k, grad_v, {}}, mask, options, workspace);
}

/// The same with learned sinks (options.sinks): also ADDS dL/dsink_h into grad_sinks (H),
/// dL/dsink_h = -sum over the rows i of head h of P_sink(i) (dO_i . O_i), P_sink(i) the
/// sink's probability exp(sink_h - logsumexp_i).
/// @throws as above, and ShapeError when grad_sinks is not (H), shares memory with the sinks,
///         or the call has no sinks.
template <class Scalar>
void scaled_dot_product_attention_backward(
    TensorView<const detail::identity_t<Scalar>, 4> q,
    TensorView<const detail::identity_t<Scalar>, 4> k,
    TensorView<const detail::identity_t<Scalar>, 4> v,
    TensorView<const detail::identity_t<Scalar>, 4> out,
    TensorView<const detail::identity_t<Scalar>, 4> grad_out,
    TensorView<const detail::identity_t<Scalar>, 3> logsumexp, TensorView<Scalar, 4> grad_q,
    TensorView<Scalar, 4> grad_k, TensorView<Scalar, 4> grad_v, TensorView<Scalar, 1> grad_sinks,
    Workspace& workspace, const AttentionMask<detail::identity_t<Scalar>>& mask = {},
    const AttentionOptions& options = {}) {
  static_assert(std::is_floating_point_v<Scalar>,
                "attn::scaled_dot_product_attention_backward: Scalar must be float or double");
  detail::attend_backward<Scalar>("scaled_dot_product_attention_backward", q, k, v, out, logsumexp,
                                  {grad_out, grad_q, grad_k, grad_v, grad_sinks}, mask, options,
                                  workspace);
}

ATTN_NAMESPACE_END
