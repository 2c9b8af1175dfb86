// SPDX-License-Identifier: MIT
// bench/reference/naive_attention.hpp: the loop baseline of the benchmarks (the ratio
// denominator): multi-head attention written as karpathy/llm.c writes it in plain C.
// Glossary: B = batch, T_q / T_k = query / key tokens, D = embedding width, H = heads,
// hd = head_dim = D / H.
//
// Same maths as attn::MultiHeadAttention (and torch.nn.MultiheadAttention):
//   qkv = x [W_q; W_k; W_v]^T + b_in          (llm.c matmul_forward_naive)
//   per (b, t, h): scores over the visible keys, max-subtracted softmax, weighted sum of V
//                                             (llm.c attention_forward, causal t2 <= t)
//   out = ctx W_o^T + b_o                     (llm.c matmul_forward_naive)
// Deliberately unblocked and unvectorised by hand; OpenMP over the outer loops exactly as
// llm.c does, so it uses the same threads as attn. It keeps one row of scores per thread
// instead of llm.c's (B, H, T, T) preatt/att buffers, so large T fits in memory.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "attn/attn.hpp"

#if defined(_OPENMP)
#include <omp.h>
#define ATTN_BENCH_OMP_PARALLEL_FOR_COLLAPSE2 \
  _Pragma("omp parallel for collapse(2) schedule(static)")
#else
#define ATTN_BENCH_OMP_PARALLEL_FOR_COLLAPSE2
#endif

namespace attn {
namespace bench {
namespace reference {

inline int max_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

inline int thread_id() {
#if defined(_OPENMP)
  return omp_get_thread_num();
#else
  return 0;
#endif
}

/// llm.c's matmul_forward_naive: out (rows, oc) = inp (rows, c) weight (oc, c)^T + bias (oc).
/// `ld_out` is out's row stride (>= oc), so several outputs can share a row.
template <class Scalar>
void matmul_forward(Scalar* out, Index ld_out, const Scalar* inp, const Scalar* weight,
                    const Scalar* bias, Index rows, Index c, Index oc) {
  ATTN_BENCH_OMP_PARALLEL_FOR_COLLAPSE2
  for (Index r = 0; r < rows; ++r) {
    for (Index o = 0; o < oc; ++o) {
      const Scalar* inp_r = inp + r * c;
      const Scalar* w_o = weight + o * c;
      Scalar val = bias != nullptr ? bias[o] : Scalar(0);
      for (Index i = 0; i < c; ++i) val += inp_r[i] * w_o[i];
      out[r * ld_out + o] = val;
    }
  }
}

/// llm.c's attention_forward, with separate Q and K/V row strides so it also serves
/// cross-attention. q: row (b, i) at q + (b * T_q + i) * ld_q, head h at + h * hd; k, v:
/// row (b, j) at k/v + (b * T_k + j) * ld_kv. out (B, T_q, D), contiguous. Causal: query i
/// sees keys j <= i. `scratch` holds max_threads() * T_k values.
template <class Scalar>
void attention_forward(Scalar* out, const Scalar* q, Index ld_q, const Scalar* k, const Scalar* v,
                       Index ld_kv, Index batch, Index tq, Index tk, Index d, Index heads,
                       bool causal, Scalar* scratch) {
  const Index hd = d / heads;
  const Scalar scale = Scalar(1) / std::sqrt(static_cast<Scalar>(hd));
  ATTN_BENCH_OMP_PARALLEL_FOR_COLLAPSE2
  for (Index b = 0; b < batch; ++b) {
    for (Index t = 0; t < tq; ++t) {
      Scalar* att = scratch + static_cast<Index>(thread_id()) * tk;
      const Index visible = causal ? std::min(t + 1, tk) : tk;
      for (Index h = 0; h < heads; ++h) {
        const Scalar* q_t = q + (b * tq + t) * ld_q + h * hd;
        // pass 1: q . k over the visible keys, and the running max
        Scalar maxval = -std::numeric_limits<Scalar>::infinity();
        for (Index t2 = 0; t2 < visible; ++t2) {
          const Scalar* k_t2 = k + (b * tk + t2) * ld_kv + h * hd;
          Scalar val = 0;
          for (Index i = 0; i < hd; ++i) val += q_t[i] * k_t2[i];
          val *= scale;
          maxval = std::max(maxval, val);
          att[t2] = val;
        }
        // pass 2: exp and sum
        Scalar expsum = 0;
        for (Index t2 = 0; t2 < visible; ++t2) {
          const Scalar e = std::exp(att[t2] - maxval);
          expsum += e;
          att[t2] = e;
        }
        const Scalar expsum_inv = expsum == Scalar(0) ? Scalar(0) : Scalar(1) / expsum;
        // pass 3: normalise and accumulate the weighted values
        Scalar* out_t = out + (b * tq + t) * d + h * hd;
        for (Index i = 0; i < hd; ++i) out_t[i] = 0;
        for (Index t2 = 0; t2 < visible; ++t2) {
          const Scalar* v_t2 = v + (b * tk + t2) * ld_kv + h * hd;
          const Scalar w = att[t2] * expsum_inv;
          for (Index i = 0; i < hd; ++i) out_t[i] += w * v_t2[i];
        }
      }
    }
  }
}

/// A naive multi-head attention holding copies of an attn::MultiHeadAttention's weights
/// (fused in_proj: d_in = kdim = vdim). Buffers grow on the first call and are reused, as
/// attn's Workspace is, so the benchmark compares arithmetic, not allocation.
template <class Scalar>
class NaiveMultiHeadAttention {
 public:
  explicit NaiveMultiHeadAttention(const MultiHeadAttention<Scalar>& mha)
      : d_(mha.embed_dim()), heads_(mha.num_heads()) {
    const auto w_in = mha.in_proj_weight();
    const auto b_in = mha.in_proj_bias();
    const auto w_out = mha.out_proj().weight();
    const auto b_out = mha.out_proj().bias();
    w_in_ = flatten(w_in);
    w_out_ = flatten(w_out);
    b_in_.assign(static_cast<std::size_t>(3 * d_), Scalar(0));
    b_out_.assign(static_cast<std::size_t>(d_), Scalar(0));
    for (Index i = 0; i < b_in.extent(0); ++i) b_in_[static_cast<std::size_t>(i)] = b_in(i);
    for (Index i = 0; i < b_out.extent(0); ++i) b_out_[static_cast<std::size_t>(i)] = b_out(i);
  }

  /// Self-attention: x (B, T, D) -> out (B, T, D).
  void forward(const Scalar* x, Scalar* out, Index batch, Index t, bool causal) {
    const Index d = d_;
    Scalar* qkv = grow(qkv_, batch * t * 3 * d);
    Scalar* ctx = grow(ctx_, batch * t * d);
    Scalar* att = grow(att_, static_cast<Index>(max_threads()) * t);
    matmul_forward(qkv, 3 * d, x, w_in_.data(), b_in_.data(), batch * t, d, 3 * d);
    attention_forward(ctx, qkv, 3 * d, qkv + d, qkv + 2 * d, 3 * d, batch, t, t, d, heads_, causal,
                      att);
    matmul_forward(out, d, ctx, w_out_.data(), b_out_.data(), batch * t, d, d);
  }

  /// Cross-attention: queries from xq (B, T_q, D), keys and values from xkv (B, T_k, D).
  void forward(const Scalar* xq, const Scalar* xkv, Scalar* out, Index batch, Index tq, Index tk,
               bool causal) {
    const Index d = d_;
    Scalar* qbuf = grow(qkv_, batch * tq * d + batch * tk * 2 * d);
    Scalar* kv = qbuf + batch * tq * d;
    Scalar* ctx = grow(ctx_, batch * tq * d);
    Scalar* att = grow(att_, static_cast<Index>(max_threads()) * tk);
    matmul_forward(qbuf, d, xq, w_in_.data(), b_in_.data(), batch * tq, d, d);
    matmul_forward(kv, 2 * d, xkv, w_in_.data() + d * d, b_in_.data() + d, batch * tk, d, 2 * d);
    attention_forward(ctx, qbuf, d, kv, kv + d, 2 * d, batch, tq, tk, d, heads_, causal, att);
    matmul_forward(out, d, ctx, w_out_.data(), b_out_.data(), batch * tq, d, d);
  }

 private:
  static std::vector<Scalar> flatten(TensorView<const Scalar, 2> w) {
    std::vector<Scalar> flat;
    flat.reserve(static_cast<std::size_t>(w.size()));
    for (Index i = 0; i < w.extent(0); ++i) {
      for (Index j = 0; j < w.extent(1); ++j) flat.push_back(w(i, j));
    }
    return flat;
  }
  static Scalar* grow(std::vector<Scalar>& buffer, Index count) {
    if (static_cast<Index>(buffer.size()) < count) buffer.resize(static_cast<std::size_t>(count));
    return buffer.data();
  }

  Index d_, heads_;
  std::vector<Scalar> w_in_, b_in_, w_out_, b_out_;
  std::vector<Scalar> qkv_, ctx_, att_;
};

}  // namespace reference
}  // namespace bench
}  // namespace attn
