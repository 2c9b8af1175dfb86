// SPDX-License-Identifier: MIT
// tests/attention/reference_attention_backward.hpp: a plain-loop, long-double reference for
// the backward pass of scaled dot-product attention (the forward is reference_attention.hpp),
// independent of attn's kernels and masks: every mask kind through DenseMask, dropout through
// given keep decisions, fully masked rows giving zero gradients. It is itself checked against
// central finite differences (reference_attention_backward_test.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "attention/reference_attention.hpp"
#include "attn/attn.hpp"

namespace attn::test::ref {

/// dQ (B, H, T_q, d), dK (B, H, T_k, d), dV (B, H, T_k, d_v), in double (rounded once from
/// long double).
struct AttentionGrads {
  Tensor<double, 4> query, key, value;
};

/// The gradients of out = attention(q, k, v, mask, scale, keep, dropout) (see attention())
/// for the upstream gradient grad_out (B, H, T_q, d_v). Per (b, h) and query i, with the
/// visible keys j (mask), s_j = q_i . k_j * scale + bias_ij, p = softmax(s) over them, the
/// dropped weights a_j = p_j keep_ij / (1 - dropout):
///   dV_j += a_j dO_i                    (out_i = sum_j a_j v_j)
///   dP_j  = (dO_i . v_j) keep_ij / (1 - dropout)
///   dS_j  = p_j (dP_j - sum_k p_k dP_k)  (softmax backward)
///   dQ_i += scale sum_j dS_j k_j,  dK_j += scale dS_j q_i
/// A query with no visible key has p = 0 and contributes nothing. The additive mask's own
/// gradient is not computed (it is not an input of the modules' backward).
template <class Q, class K, class V, class G>
AttentionGrads attention_backward(TensorView<Q, 4> q, TensorView<K, 4> k, TensorView<V, 4> v,
                                  TensorView<G, 4> grad_out, const DenseMask& mask, Real scale,
                                  const std::vector<char>* keep = nullptr, Real dropout = 0) {
  const Index batch = q.extent(0), heads = q.extent(1), tq = q.extent(2), d = q.extent(3);
  const Index tk = k.extent(2), dv = v.extent(3);
  const auto qs = to_vector(q);
  const auto ks = to_vector(k);
  const auto vs = to_vector(v);
  const auto gs = to_vector(grad_out);
  std::vector<Real> dq(qs.size(), 0), dk(ks.size(), 0), dvv(vs.size(), 0);
  std::vector<Real> s(static_cast<std::size_t>(tk)), dp(static_cast<std::size_t>(tk));
  for (Index b = 0; b < batch; ++b) {
    for (Index h = 0; h < heads; ++h) {
      const Index bh = b * heads + h;
      for (Index i = 0; i < tq; ++i) {
        const auto* qi = qs.data() + (bh * tq + i) * d;
        const auto* gi = gs.data() + (bh * tq + i) * dv;
        probabilities(mask, b, h, i, qi, ks.data() + bh * tk * d, d, scale, s);
        // backward: dV, dP, then the softmax backward and dQ, dK
        Real p_dot_dp = 0;  // (a query with no visible key has p = 0: no gradient)
        for (Index j = 0; j < tk; ++j) {
          const Real p = s[j];
          dp[j] = 0;
          if (p == 0) continue;
          const Real kept =
              keep == nullptr ? Real(1) : ((*keep)[mask.at(b, h, i, j)] ? 1 / (1 - dropout) : 0);
          const auto* vj = vs.data() + (bh * tk + j) * dv;
          Real* dvj = dvv.data() + (bh * tk + j) * dv;
          Real dot = 0;
          for (Index e = 0; e < dv; ++e) {
            dvj[e] += p * kept * static_cast<Real>(gi[e]);
            dot += static_cast<Real>(gi[e]) * static_cast<Real>(vj[e]);
          }
          dp[j] = dot * kept;
          p_dot_dp += p * dp[j];
        }
        Real* dqi = dq.data() + (bh * tq + i) * d;
        for (Index j = 0; j < tk; ++j) {
          if (s[j] == 0) continue;
          const Real ds = s[j] * (dp[j] - p_dot_dp) * scale;
          const auto* kj = ks.data() + (bh * tk + j) * d;
          Real* dkj = dk.data() + (bh * tk + j) * d;
          for (Index e = 0; e < d; ++e) {
            dqi[e] += ds * static_cast<Real>(kj[e]);
            dkj[e] += ds * static_cast<Real>(qi[e]);
          }
        }
      }
    }
  }
  const auto narrow = [](const std::vector<Real>& x, const Shape<4>& shape) {
    Tensor<double, 4> t(shape);
    for (std::size_t i = 0; i < x.size(); ++i) t.data()[i] = static_cast<double>(x[i]);
    return t;
  };
  return {narrow(dq, {batch, heads, tq, d}), narrow(dk, {batch, heads, tk, d}),
          narrow(dvv, {batch, heads, tk, dv})};
}

}  // namespace attn::test::ref
