// SPDX-License-Identifier: MIT
// bench/bench_support.hpp: random tensors, the benchmark shape lists and the FLOP formulas,
// defined once for every benchmark, the timing tools and (mirrored) the comparison script.
// Glossary: B = batch, T = tokens (T_q queries, T_k keys), D = embedding width (d_in =
// d_out), H = heads, hd = head_dim = D / H.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "attn/attn.hpp"

namespace attn {
namespace bench {

// ---------------------------------------------------------------------------------------
// FLOP formulas ("useful FLOPs"). One multiply-add counts as 2 FLOPs. Only the matrix
// products are counted: bias adds, the 1/sqrt(hd) scale, the softmax (max, exp, sum,
// divide) and masking are not, as in the FlashAttention papers. Masked-out work is not
// counted either: a causal attention counts only the visible (query, key) pairs, so an
// implementation that computes the masked half and throws it away gets no credit for it.
//
//   projections (self)   2 * B * T * D * 3D                       (x [W_q; W_k; W_v]^T)
//   projections (cross)  2 * B * T_q * D * D  +  2 * B * T_k * D * 2D
//   out_proj             2 * B * T_q * D * D
//   attention            4 * B * H * pairs * hd                    (Q K^T and P V: 2 * hd each)
//     pairs = T_q * T_k                                            (no mask)
//     pairs = T (T + 1) / 2                                        (causal, T_q = T_k = T)
//     pairs = sum_i min(i + 1, T_k)                                (causal, T_q != T_k: query
//                                                                   i sees keys j <= i)
//   MHA total            projections + out_proj + attention
//
// scripts/bench_vs_pytorch.sh computes the same numbers (its mha_flops() mirrors these).
// ---------------------------------------------------------------------------------------

/// Visible (query, key) pairs: T_q * T_k, or with a causal bound (query i sees keys
/// j <= i, PyTorch's triu(diagonal=1) mask / is_causal) sum_i min(i + 1, T_k).
constexpr double attention_pairs(Index tq, Index tk, bool causal) {
  const double q = static_cast<double>(tq), k = static_cast<double>(tk);
  if (!causal) return q * k;
  if (tq <= tk) return q * (q + 1) / 2;  // every row i sees i + 1 keys
  return k * (k + 1) / 2 + (q - k) * k;  // rows past T_k see every key
}

/// The kernel alone: Q K^T and P V over the visible pairs, 4 * B * H * pairs * hd.
constexpr double attention_flops(Index b, Index h, Index tq, Index tk, Index hd, bool causal) {
  return 4.0 * static_cast<double>(b) * static_cast<double>(h) * attention_pairs(tq, tk, causal) *
         static_cast<double>(hd);
}

/// Q/K/V projections: self 2*B*T*D*3D; cross 2*B*T_q*D*D + 2*B*T_k*D*2D.
constexpr double projection_flops(Index b, Index tq, Index tk, Index d, bool cross) {
  const double bd = static_cast<double>(b), dd = static_cast<double>(d);
  if (!cross) return 2.0 * bd * static_cast<double>(tq) * dd * 3.0 * dd;
  return 2.0 * bd * static_cast<double>(tq) * dd * dd +
         2.0 * bd * static_cast<double>(tk) * dd * 2.0 * dd;
}

/// out_proj: 2*B*T_q*D*D.
constexpr double out_proj_flops(Index b, Index tq, Index d) {
  return 2.0 * static_cast<double>(b) * static_cast<double>(tq) * static_cast<double>(d) *
         static_cast<double>(d);
}

/// A whole multi-head attention forward (self when !cross, then T_k must equal T_q).
constexpr double mha_flops(Index b, Index tq, Index tk, Index d, Index h, bool causal, bool cross) {
  return projection_flops(b, tq, tk, d, cross) + out_proj_flops(b, tq, d) +
         attention_flops(b, h, tq, tk, d / h, causal);
}

/// Self-attention shorthand: mha_flops(b, t, t, d, h, causal, false).
constexpr double mha_flops(Index b, Index t, Index d, Index h, bool causal) {
  return mha_flops(b, t, t, d, h, causal, /*cross=*/false);
}

// ---------------------------------------------------------------------------------------
// Benchmark shapes: float, self-attention
// unless marked. scripts/bench_vs_pytorch.sh lists the same shapes (and its T sweep).
// ---------------------------------------------------------------------------------------

struct MhaShape {
  Index b, tq, tk, d, h;
  bool causal, cross;
};

/// The benchmark shapes: B1 T128 D512 H8; B8 T512 D512 H8; B1 T2048 D768 H12; B1 T8192
/// D512 H8 causal and not; cross B8 T_q128 T_k512 D512 H8.
inline const std::vector<MhaShape>& benchmark_shapes() {
  static const std::vector<MhaShape> shapes = {
      {1, 128, 128, 512, 8, false, false},    {8, 512, 512, 512, 8, false, false},
      {1, 2048, 2048, 768, 12, false, false}, {1, 8192, 8192, 512, 8, false, false},
      {1, 8192, 8192, 512, 8, true, false},   {8, 128, 512, 512, 8, false, true},
  };
  return shapes;
}

/// Shapes small enough for the naive loop reference (well under a second per call),
/// covering self, causal and cross. Every one is also run for attn in the same binary.
inline const std::vector<MhaShape>& reference_shapes() {
  static const std::vector<MhaShape> shapes = {
      {1, 128, 128, 512, 8, false, false},
      {1, 512, 512, 512, 8, false, false},
      {1, 512, 512, 512, 8, true, false},
      {1, 128, 512, 512, 8, false, true},
  };
  return shapes;
}

// ---------------------------------------------------------------------------------------
// Data
// ---------------------------------------------------------------------------------------

/// A tensor of uniform values in [-1, 1) from a seeded std::mt19937_64 (deterministic, so
/// every run and both sides of a comparison see the same data).
template <class Scalar, std::size_t Rank>
Tensor<Scalar, Rank> random_tensor(const Shape<Rank>& shape, std::uint64_t seed) {
  static_assert(std::is_floating_point_v<Scalar>, "attn::bench::random_tensor: float or double");
  Tensor<Scalar, Rank> t(shape);
  std::mt19937_64 engine(seed);
  std::uniform_real_distribution<Scalar> dist(Scalar(-1), Scalar(1));
  Scalar* data = t.data();
  for (Index i = 0; i < t.size(); ++i) data[i] = dist(engine);
  return t;
}

/// A PyTorch-initialised MultiHeadAttention (nn.MultiheadAttention(D, H, bias=True,
/// batch_first=True)), in eval mode, with weights from a fixed seed; frozen (weights packed
/// for the GEMM once, MultiHeadAttention::freeze()) unless `frozen` is false.
template <class Scalar>
MultiHeadAttention<Scalar> make_mha(Index d, Index h, std::uint64_t seed = 1234,
                                    bool frozen = true) {
  TorchGenerator gen(seed);
  MultiHeadAttention<Scalar> mha(MultiHeadAttentionOptions::pytorch(d, h, /*bias=*/true), gen);
  mha.eval();
  if (frozen) mha.freeze();  // weights packed once, as an inference deployment runs it
  return mha;
}

/// The attention mask a benchmark passes: causal (query i sees keys j <= i, PyTorch's
/// triu(diagonal=1) attn_mask) or none. Top-left alignment, so it also works for T_q != T_k.
template <class Scalar>
AttentionMask<Scalar> make_mask(bool causal) {
  AttentionMask<Scalar> mask;
  if (causal) mask.causal(CausalAlignment::kTopLeft);
  return mask;
}

}  // namespace bench
}  // namespace attn
