// SPDX-License-Identifier: MIT
// attn/attention/scaled_dot_product_backward.hpp: the backward pass of scaled dot-product
// attention (both paths), and the forward that saves what the streaming backward needs (each
// query's logsumexp).
// Glossary: B = batch, H = heads, T_q / T_k = query / key tokens, d = head dim, d_v = value
// head dim.
#pragma once

#include <cmath>
#include <cstddef>
#include <string>
#include <type_traits>

#include "attn/attention/detail/kernel_backward.hpp"
#include "attn/attention/scaled_dot_product.hpp"
#include "attn/config.hpp"
#include "attn/detail/checked.hpp"
#include "attn/error.hpp"
#include "attn/nn/mask.hpp"
#include "attn/tensor/overlap.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// The gradients a backward writes: each has its input's shape, unit inner stride and one
/// location per element; none shares memory with an input, the mask or another gradient,
/// except that two gradients may be the same view (self-attention's one x: the backward
/// then adds dQ, dK and dV into it; their tasks never write the same rows at once).
template <class Scalar>
void check_backward_memory(const char* where, const BackwardParams<Scalar>& p) {
  const AttentionBackwardArgs<Scalar>& a = p.args;
  const std::pair<const char*, TensorView<Scalar, 4>> grads[3] = {
      {"grad_q", a.grad_q}, {"grad_k", a.grad_k}, {"grad_v", a.grad_v}};
  const TensorView<const Scalar, 4> inputs[5] = {a.q, a.k, a.v, a.out, a.grad_out};
  const char* input_names[5] = {"q", "k", "v", "out", "grad_out"};
  for (int g = 0; g < 3; ++g) {
    const auto& [name, grad] = grads[g];
    require_distinct_elements(where, name, grad);
    for (int i = 0; i < 5; ++i) require_disjoint(where, name, grad, input_names[i], inputs[i]);
    require_disjoint(where, name, grad, "logsumexp", a.lse);
    require_disjoint(where, name, grad, "the boolean mask", p.mask->bool_mask());
    require_disjoint(where, name, grad, "the additive mask", p.mask->additive_mask());
    require_disjoint(where, name, grad, "the key padding mask", p.mask->padding_mask());
    for (int o = 0; o < g; ++o) {
      if (!same_view(grad, grads[o].second)) {
        require_disjoint(where, name, grad, grads[o].first, grads[o].second);
      }
    }
  }
}

/// Checks a backward call, then runs it. The forward's checks (check_sdpa) on q, k, v, out,
/// the mask and the options; then grad_out (out's shape), the logsumexp ((B, H, T_q), needed
/// by the streaming path), the gradients (their inputs' shapes) and, unless `own_gradients`
/// (a module's backward, whose head-major dQ, dK, dV interleave per batch item in its own
/// buffer without sharing an element), their memory.
template <class Scalar>
void attend_backward(const char* where, BackwardParams<Scalar> p, const AttentionOptions& options,
                     Workspace& ws, bool own_gradients = false) {
  AttentionBackwardArgs<Scalar>& a = p.args;
  const TensorView<Scalar, 4> out_checked(const_cast<Scalar*>(a.out.data()), a.out.shape(),
                                          a.out.strides());  // read only: check_sdpa's shape
  check_sdpa(where, a.q, a.k, a.v, out_checked, {}, *p.mask, options);
  const auto shape_is = [&](const char* name, const auto& view, const auto& expected) {
    require(view.shape() == expected, where, [&] {
      return std::string(name) + " has shape " + to_string(view.shape()) + ", expected " +
             to_string(expected);
    });
    require(view.extent(view.rank() - 1) == 1 || view.stride(view.rank() - 1) == 1, where, [&] {
      return std::string(name) + " must have stride 1 on its last axis (got " +
             to_string(view.strides()) + ")";
    });
  };
  shape_is("grad_out", a.grad_out, a.out.shape());
  shape_is("grad_q", a.grad_q, a.q.shape());
  shape_is("grad_k", a.grad_k, a.k.shape());
  shape_is("grad_v", a.grad_v, a.v.shape());
  const bool materialize = options.path == AttentionPath::kMaterialized;
  const Index batch = a.q.extent(0), heads = a.q.extent(1), tq = a.q.extent(2);
  const Index tk = a.k.extent(2), d = a.q.extent(3), dv = a.v.extent(3);
  if (!materialize) {
    require(a.lse.data() != nullptr, where, [] {
      return std::string(
          "the streaming backward needs the forward's logsumexp (B, H, T_q); "
          "pass the one scaled_dot_product_attention(q, k, v, out, logsumexp, "
          "...) wrote, or use AttentionPath::kMaterialized");
    });
    shape_is("logsumexp", a.lse, Shape<3>{batch, heads, tq});
  } else {
    std::size_t count = 0, bytes = 0;
    const std::size_t width = static_cast<std::size_t>(2 * tq + std::max(d, dv));
    require(checked_mul(width, static_cast<std::size_t>(tk), count) &&
                checked_bytes(count + 64, sizeof(Scalar), bytes),
            where, [&] {
              return "the materialised backward would need (2 T_q + max(d, d_v)) x T_k = (" +
                     std::to_string(2 * tq + std::max(d, dv)) + ") x " + std::to_string(tk) +
                     " elements per thread, more than fits in memory";
            });
  }
  if (!own_gradients) check_backward_memory(where, p);
  a.scale =
      static_cast<Scalar>(options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(d)));
  a.dropout = options.dropout;
  p.dropout_seed = options.dropout_seed;
  p.dropout_call = options.dropout_call;
  if (p.module_causal && p.module_alignment == CausalAlignment::kSquare) {
    require(tq == tk, where, [&] {
      return "causal attention with T_q=" + std::to_string(tq) + " != T_k=" + std::to_string(tk) +
             ": set a causal alignment (kTopLeft or kBottomRight) explicitly";
    });
  }
  run_attention_backward(p, materialize, ws);
}

}  // namespace detail

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
  detail::attend("scaled_dot_product_attention", q, k, v, out, mask, options, {}, workspace, false,
                 CausalAlignment::kSquare, 0, logsumexp);
}

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
  detail::BackwardParams<Scalar> p;
  p.args.q = q, p.args.k = k, p.args.v = v, p.args.out = out, p.args.grad_out = grad_out;
  p.args.lse = logsumexp;
  p.args.grad_q = grad_q, p.args.grad_k = grad_k, p.args.grad_v = grad_v;
  p.mask = &mask;
  detail::attend_backward("scaled_dot_product_attention_backward", p, options, workspace);
}

ATTN_NAMESPACE_END
