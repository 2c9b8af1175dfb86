// SPDX-License-Identifier: MIT
// tests/attention/module_test_support.hpp: what the per-module tests share: a module's
// weights widened to long double for the reference (reference_attention.hpp), and the
// tolerance of a module against it.
//
// Tolerance: module_tolerance = (d_in + head_dim + T_k + d_out) * eps, the kernel's
// (d + T_k) eps (reference_attention.hpp) plus one n * eps term for each projection GEMM
// (inputs in [-1, 1], weights bounded by nn.Linear's 1/sqrt(fan_in) or [0, 1) for
// kRandInit). Measured errors stay at or below ~1/10 of it. Where two configurations run
// the very same arithmetic (same weights loaded two ways, unbatched vs batch of one, a
// wrapper head vs its slice of the wrapper output) results are compared bit for bit.
#pragma once

#include <cmath>
#include <limits>

#include "attention/reference_attention.hpp"
#include "attn/attn.hpp"

namespace attn::test {

using ref::Real;

template <class Scalar>
double module_tolerance(Index d_in, Index head_dim, Index tk, Index d_out) {
  return static_cast<double>(d_in + head_dim + tk + d_out) * std::numeric_limits<Scalar>::epsilon();
}

/// A module's weights widened to long double; empty tensors mean "no bias" / "no out_proj".
struct WideWeights {
  Tensor<Real, 2> wq, wk, wv, wo;
  Tensor<Real, 1> bq, bk, bv, bo;

  ref::ModuleWeights views() const {
    return {wq.view(), wk.view(), wv.view(), wo.view(), bq.view(), bk.view(), bv.view(), bo.view()};
  }
};

template <class Scalar>
Tensor<Real, 1> wide_bias(TensorView<const Scalar, 1> bias) {
  if (bias.data() == nullptr) return {};
  return ref::widen(bias);
}

template <class Scalar>
WideWeights wide(const MultiHeadAttention<Scalar>& m) {
  WideWeights w;
  w.wq = ref::widen(m.q_proj_weight());
  w.wk = ref::widen(m.k_proj_weight());
  w.wv = ref::widen(m.v_proj_weight());
  w.wo = ref::widen(m.out_proj().weight());
  w.bq = wide_bias(m.w_query().bias());
  w.bk = wide_bias(m.w_key().bias());
  w.bv = wide_bias(m.w_value().bias());
  if (m.out_proj().has_bias()) w.bo = ref::widen(m.out_proj().bias());
  return w;
}

template <class Scalar>
WideWeights wide(const attn::SelfAttention<Scalar>& m) {
  WideWeights w;
  w.wq = ref::widen(m.w_query().weight());
  w.wk = ref::widen(m.w_key().weight());
  w.wv = ref::widen(m.w_value().weight());
  if (m.w_query().has_bias()) {
    w.bq = ref::widen(m.w_query().bias());
    w.bk = ref::widen(m.w_key().bias());
    w.bv = ref::widen(m.w_value().bias());
  }
  return w;
}

inline Real inv_sqrt(Index d) { return 1 / std::sqrt(static_cast<Real>(d)); }

}  // namespace attn::test
