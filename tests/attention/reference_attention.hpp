// SPDX-License-Identifier: MIT
// tests/attention/reference_attention.hpp: a plain-loop reference for attention, independent
// of attn's kernels, masks and projections. Everything is computed in long double; masks
// are expanded into explicit per-(b, h, i, j) booleans and additive values by the loops
// below (their own broadcasting), never through attn::AttentionMask or attn::detail.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/attn.hpp"
#include "support/test_support.hpp"

namespace attn::test::ref {

using Real = long double;

/// False in unoptimised (Debug, sanitizer) builds, where the heaviest shapes are trimmed
/// so each test executable stays within seconds; the shapes that exercise every tile
/// edge and mask kind stay in.
#ifdef __OPTIMIZE__
inline constexpr bool kOptimizedBuild = true;
#else
inline constexpr bool kOptimizedBuild = false;
#endif

/// What every (b, h, i, j) of an attention of shape (B, H, T_q, T_k) may see, and the value
/// added to its scaled score. A key is visible when `visible` is set and its bias is not
/// -inf.
struct DenseMask {
  Index batch = 0, heads = 0, tq = 0, tk = 0;
  std::vector<char> visible;
  std::vector<Real> bias;

  DenseMask(Index b, Index h, Index q, Index k)
      : batch(b),
        heads(h),
        tq(q),
        tk(k),
        visible(static_cast<std::size_t>(b * h * q * k), 1),
        bias(static_cast<std::size_t>(b * h * q * k), 0) {}

  std::size_t at(Index b, Index h, Index i, Index j) const {
    return static_cast<std::size_t>(((b * heads + h) * tq + i) * tk + j);
  }

  /// Causal bound: query i sees key j <= i + offset, offset 0 (square, top-left) or
  /// T_k - T_q (bottom-right).
  DenseMask& causal(CausalAlignment alignment) {
    const Index offset = alignment == CausalAlignment::kBottomRight ? tk - tq : 0;
    for_all([&](Index, Index, Index i, Index j) { return j <= i + offset; });
    return *this;
  }

  /// Causal bound per item with an optional sliding window: query i of item b, on diagonal
  /// position p = i + offsets[b], sees keys p - W < j <= p (W = 0: no lower bound).
  DenseMask& causal_window(const std::vector<Index>& offsets, Index window) {
    for_all([&](Index b, Index, Index i, Index j) {
      const Index p = i + offsets[static_cast<std::size_t>(b)];
      return j <= p && (window == 0 || j > p - window);
    });
    return *this;
  }

  /// Boolean mask (T_q, T_k), (B or 1, T_q, T_k) or (B or 1, H or 1, T_q, T_k).
  /// `allows`: true = may attend; otherwise true = blocked.
  template <class Element, std::size_t Rank>
  DenseMask& boolean(TensorView<Element, Rank> m, bool allows) {
    for_all([&](Index b, Index h, Index i, Index j) { return lookup(m, b, h, i, j) == allows; });
    return *this;
  }

  /// Additive mask, same broadcasting; -inf blocks.
  template <class Element, std::size_t Rank>
  DenseMask& additive(TensorView<Element, Rank> m) {
    for (Index b = 0; b < batch; ++b)
      for (Index h = 0; h < heads; ++h)
        for (Index i = 0; i < tq; ++i)
          for (Index j = 0; j < tk; ++j)
            bias[at(b, h, i, j)] += static_cast<Real>(lookup(m, b, h, i, j));
    return *this;
  }

  /// Batch item b sees its first lengths[b] keys.
  DenseMask& key_lengths(const std::vector<Index>& lengths) {
    for_all(
        [&](Index b, Index, Index, Index j) { return j < lengths[static_cast<std::size_t>(b)]; });
    return *this;
  }

  /// (B, T_k), true = padding.
  DenseMask& key_padding(TensorView<const bool, 2> pad) {
    for_all([&](Index b, Index, Index, Index j) { return !pad(b, j); });
    return *this;
  }

 private:
  template <class Keep>
  void for_all(Keep&& keep) {
    for (Index b = 0; b < batch; ++b)
      for (Index h = 0; h < heads; ++h)
        for (Index i = 0; i < tq; ++i)
          for (Index j = 0; j < tk; ++j)
            if (!keep(b, h, i, j)) visible[at(b, h, i, j)] = 0;
  }

  template <class Element, std::size_t Rank>
  static auto lookup(TensorView<Element, Rank> m, Index b, Index h, Index i, Index j) {
    if constexpr (Rank == 2) {
      return m(i, j);
    } else if constexpr (Rank == 3) {
      return m(m.extent(0) == 1 ? 0 : b, i, j);
    } else {
      return m(m.extent(0) == 1 ? 0 : b, m.extent(1) == 1 ? 0 : h, i, j);
    }
  }
};

/// Output (B, H, T_q, d_v) and weights (B, H, T_q, T_k) of the reference, in double
/// (rounded once from long double).
struct Result {
  Tensor<double, 4> output;
  Tensor<double, 4> weights;
};

/// The attention probabilities of query i of head (b, h) into p (T_k): softmax over the
/// visible keys j of qi . k_j * scale + bias_ij, 0 for the others, all 0 when no key is
/// visible. qi: the query (d values); keys: the head's keys, (T_k, d) row-major.
template <class QE, class KE>
void probabilities(const DenseMask& mask, Index b, Index h, Index i, const QE* qi, const KE* keys,
                   Index d, Real scale, std::vector<Real>& p) {
  const Index tk = mask.tk;
  p.resize(static_cast<std::size_t>(tk));
  std::vector<char> vis_store(static_cast<std::size_t>(tk));
  // Raw pointers in the loops: a vector's operator[] is a call in -O0 and sanitizer builds.
  Real* const pj = p.data();
  char* const vis = vis_store.data();
  Real row_max = -std::numeric_limits<Real>::infinity();
  for (Index j = 0; j < tk; ++j) {
    const std::size_t at = mask.at(b, h, i, j);
    const Real bias = mask.bias[at];
    vis[j] = mask.visible[at] && !(std::isinf(bias) && bias < 0);
    if (!vis[j]) continue;
    const KE* kj = keys + j * d;
    Real dot = 0;
    for (Index e = 0; e < d; ++e) dot += static_cast<Real>(qi[e]) * static_cast<Real>(kj[e]);
    pj[j] = dot * scale + bias;
    if (pj[j] > row_max) row_max = pj[j];
  }
  Real sum = 0;
  for (Index j = 0; j < tk; ++j) {
    pj[j] = vis[j] ? std::exp(pj[j] - row_max) : 0;
    sum += pj[j];
  }
  for (Index j = 0; j < tk; ++j) pj[j] = sum > 0 ? pj[j] / sum : 0;
}

/// softmax(q k^T * scale + bias over visible keys) v, per (b, h), in long double.
/// `keep` (optional, B*H*T_q*T_k in DenseMask order): dropout decisions; kept weights are
/// divided by (1 - dropout). A row with no visible key gives zero output and weights.
template <class Q, class K, class V>
Result attention(TensorView<Q, 4> q, TensorView<K, 4> k, TensorView<V, 4> v, const DenseMask& mask,
                 Real scale, const std::vector<char>* keep = nullptr, Real dropout = 0) {
  const Index batch = q.extent(0), heads = q.extent(1), tq = q.extent(2), d = q.extent(3);
  const Index tk = k.extent(2), dv = v.extent(3);
  Result r{Tensor<double, 4>({batch, heads, tq, dv}), Tensor<double, 4>({batch, heads, tq, tk})};
  // Row-major copies (plain index arithmetic below keeps the reference fast in -O0 builds).
  const auto qs = to_vector(q);
  const auto ks = to_vector(k);
  const auto vs = to_vector(v);
  std::vector<Real> s_store(static_cast<std::size_t>(tk));
  std::vector<Real> acc_store(static_cast<std::size_t>(dv));
  Real* const s = s_store.data();
  Real* const acc = acc_store.data();
  for (Index b = 0; b < batch; ++b) {
    for (Index h = 0; h < heads; ++h) {
      const Index bh = b * heads + h;
      for (Index i = 0; i < tq; ++i) {
        probabilities(mask, b, h, i, qs.data() + (bh * tq + i) * d, ks.data() + bh * tk * d, d,
                      scale, s_store);
        double* wrow = r.weights.data() + (bh * tq + i) * tk;
        for (Index j = 0; j < tk; ++j) {
          Real w = s[j];
          if (keep != nullptr) w = (*keep)[mask.at(b, h, i, j)] ? w / (1 - dropout) : 0;
          s[j] = w;
          wrow[j] = static_cast<double>(w);
        }
        std::fill(acc, acc + dv, Real(0));
        for (Index j = 0; j < tk; ++j) {
          if (s[j] == 0) continue;
          const auto* vj = vs.data() + (bh * tk + j) * dv;
          for (Index e = 0; e < dv; ++e) acc[e] += s[j] * static_cast<Real>(vj[e]);
        }
        double* orow = r.output.data() + (bh * tq + i) * dv;
        for (Index e = 0; e < dv; ++e) orow[e] = static_cast<double>(acc[e]);
      }
    }
  }
  return r;
}

/// x (B, H_kv, T, d) with each head repeated H / H_kv times -> (B, H, T, d): Hugging Face's
/// repeat_kv (torch.repeat_interleave on the heads axis), the reference of grouped-query
/// attention.
template <class Scalar>
Tensor<std::remove_const_t<Scalar>, 4> repeat_kv(TensorView<Scalar, 4> x, Index heads) {
  const Index group = heads / x.extent(1);
  Tensor<std::remove_const_t<Scalar>, 4> y({x.extent(0), heads, x.extent(2), x.extent(3)});
  if (y.size() == 0) return y;
  // Row by row through pointers: element-wise indexing made this copy most of the time of
  // the grouped-query tests in the -O0 sanitizer build.
  const auto out = y.view();
  const Index d = x.extent(3), step = x.stride(3);
  for (Index b = 0; b < x.extent(0); ++b)
    for (Index h = 0; h < heads; ++h)
      for (Index t = 0; t < x.extent(2); ++t) {
        const auto* from = &x(b, h / group, t, 0);
        auto* to = &out(b, h, t, 0);
        for (Index e = 0; e < d; ++e) to[e] = from[e * step];
      }
  return y;
}

/// y (..., out) = x (..., in) W^T + b in long double, W (out, in) in nn.Linear's layout;
/// `bias` may be empty. x is (B, T, in); y is (B, T, out) in double.
template <class X, class W, class Bias>
Tensor<Real, 3> linear(TensorView<X, 3> x, TensorView<W, 2> weight, TensorView<Bias, 1> bias) {
  const Index batch = x.extent(0), tokens = x.extent(1), in = x.extent(2), out = weight.extent(0);
  Tensor<Real, 3> y({batch, tokens, out});
  const auto xs = to_vector(x);
  const auto ws = to_vector(weight);
  const bool has_bias = bias.data() != nullptr;
  for (Index row = 0; row < batch * tokens; ++row) {
    const auto* xr = xs.data() + row * in;
    for (Index o = 0; o < out; ++o) {
      const auto* wr = ws.data() + o * in;
      Real acc = has_bias ? static_cast<Real>(bias(o)) : Real(0);
      for (Index i = 0; i < in; ++i) acc += static_cast<Real>(xr[i]) * static_cast<Real>(wr[i]);
      y.data()[row * out + o] = acc;
    }
  }
  return y;
}

/// (B, T, H * hd) -> (B, H, T, hd) as a strided view (the reference's own head split).
template <class Scalar>
TensorView<Scalar, 4> heads_of(TensorView<Scalar, 3> x, Index heads) {
  const Index hd = x.extent(2) / heads;
  return {x.data(),
          {x.extent(0), heads, x.extent(1), hd},
          {x.stride(0), hd * x.stride(2), x.stride(1), x.stride(2)}};
}

/// (B, H, T, hd) -> (B, T, H * hd), copying.
inline Tensor<Real, 3> merge(TensorView<const double, 4> x) {
  const Index batch = x.extent(0), heads = x.extent(1), tokens = x.extent(2), hd = x.extent(3);
  Tensor<Real, 3> y({batch, tokens, heads * hd});
  for (Index b = 0; b < batch; ++b)
    for (Index h = 0; h < heads; ++h)
      for (Index t = 0; t < tokens; ++t)
        for (Index e = 0; e < hd; ++e) y(b, t, h * hd + e) = x(b, h, t, e);
  return y;
}

/// The reference of a multi-head module: q = query Wq^T + bq (etc.), attention per head,
/// heads merged, then out = ctx Wo^T + bo (skipped when `out_weight` is empty).
struct ModuleWeights {
  TensorView<const Real, 2> wq, wk, wv, wo;
  TensorView<const Real, 1> bq, bk, bv, bo;
};

/// Copies any view into long double.
template <class Scalar, std::size_t Rank>
Tensor<Real, Rank> widen(TensorView<Scalar, Rank> x) {
  Tensor<Real, Rank> y(x.shape());
  const auto values = to_vector(x);
  for (std::size_t i = 0; i < values.size(); ++i) y.data()[i] = static_cast<Real>(values[i]);
  return y;
}

/// Full module reference on (B, T_q, d_q) queries and (B, T_k, ·) keys/values.
template <class Scalar>
Tensor<double, 3> module_forward(TensorView<const Scalar, 3> query, TensorView<const Scalar, 3> key,
                                 TensorView<const Scalar, 3> value, const ModuleWeights& w,
                                 Index heads, const DenseMask& mask, Real scale,
                                 Tensor<double, 4>* weights = nullptr) {
  const Tensor<Real, 3> q = linear(query, w.wq, w.bq);
  const Tensor<Real, 3> k = linear(key, w.wk, w.bk);
  const Tensor<Real, 3> v = linear(value, w.wv, w.bv);
  Result r = attention(heads_of(q.view(), heads), heads_of(k.view(), heads),
                       heads_of(v.view(), heads), mask, scale);
  if (weights != nullptr) *weights = std::move(r.weights);
  Tensor<Real, 3> ctx = merge(r.output.view());
  Tensor<Real, 3> y = ctx;
  if (w.wo.data() != nullptr) y = linear(ctx.view(), w.wo, w.bo);
  Tensor<double, 3> out(y.shape());
  for (Index i = 0; i < y.size(); ++i) out.data()[i] = static_cast<double>(y.data()[i]);
  return out;
}

/// Gtest predicate: every |actual - expected| <= tol, no NaN anywhere; on failure names
/// the worst index and both values.
template <class A, class B, std::size_t Rank>
::testing::AssertionResult all_near(TensorView<A, Rank> actual, TensorView<B, Rank> expected,
                                    double tol) {
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure() << "shape " << detail::to_string(actual.shape())
                                         << " != " << detail::to_string(expected.shape());
  }
  const auto va = to_vector(actual);
  const auto vb = to_vector(expected);
  double worst = 0;
  std::size_t worst_at = 0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    const double a = static_cast<double>(va[i]), b = static_cast<double>(vb[i]);
    const double diff = std::abs(a - b);
    if (std::isnan(a) || std::isnan(b) || diff > worst) {
      worst = std::isnan(diff) ? std::numeric_limits<double>::infinity() : diff;
      worst_at = i;
      if (std::isnan(diff)) break;
    }
  }
  if (worst <= tol) return ::testing::AssertionSuccess();
  // unravel the flat index
  std::array<Index, Rank> index{};
  std::size_t rest = worst_at;
  for (std::size_t r = Rank; r-- > 0;) {
    index[r] = static_cast<Index>(rest % static_cast<std::size_t>(actual.extent(r)));
    rest /= static_cast<std::size_t>(actual.extent(r));
  }
  std::ostringstream text;
  text.precision(10);
  text << "max |diff| " << worst << " > tol " << tol << " at " << detail::to_string(index)
       << ": actual " << static_cast<double>(va[worst_at]) << ", expected "
       << static_cast<double>(vb[worst_at]);
  return ::testing::AssertionFailure() << text.str();
}

/// True when both views hold the same bytes element by element (NaN-safe, -0 != +0).
template <class A, class B, std::size_t Rank>
::testing::AssertionResult same_bits(TensorView<A, Rank> a, TensorView<B, Rank> b) {
  static_assert(std::is_same_v<std::remove_const_t<A>, std::remove_const_t<B>>,
                "same_bits compares views of one element type");
  if (a.shape() != b.shape()) return ::testing::AssertionFailure() << "shapes differ";
  const auto va = to_vector(a);
  const auto vb = to_vector(b);
  for (std::size_t i = 0; i < va.size(); ++i) {
    if (std::memcmp(&va[i], &vb[i], sizeof(va[i])) != 0) {
      return ::testing::AssertionFailure()
             << "element " << i << " differs: " << va[i] << " vs " << vb[i];
    }
  }
  return ::testing::AssertionSuccess();
}

/// True when no element is NaN or infinite.
template <class Scalar, std::size_t Rank>
bool all_finite(TensorView<Scalar, Rank> x) {
  for (const auto value : to_vector(x)) {
    if (!std::isfinite(static_cast<double>(value))) return false;
  }
  return true;
}

/// Tolerance of a kernel output (or weight) against the long double reference, for inputs
/// in [-1, 1]: (d + T_k) * eps. The scores are d-term dot products and the output a
/// T_k-term weighted sum; first-order rounding of each is about n * eps with unit-sized
/// terms, and the softmax turns an absolute score error e into a relative weight error of
/// about e. Measured errors are at most 1/10 of this over the shapes of these tests
/// (float: ~2e-7 for d = 64, T_k = 300, against a tolerance of 4.3e-5; double: ~1e-16 ...
/// 2e-15); a wrong mask, scale or tile edge moves outputs by 1e-2 or more.
template <class Scalar>
double kernel_tolerance(Index d, Index tk) {
  return static_cast<double>(d + tk) * std::numeric_limits<Scalar>::epsilon();
}

/// Random booleans, true with probability `p_true`.
template <std::size_t Rank>
Tensor<bool, Rank> random_bools(const Shape<Rank>& shape, std::uint64_t seed, double p_true) {
  const auto u = attn::test::random_tensor<double>(shape, seed, 0.0, 1.0);
  Tensor<bool, Rank> m(shape);
  for (Index i = 0; i < m.size(); ++i) m.data()[i] = u.data()[i] < p_true;
  return m;
}

/// Random additive values in [-2, 2) with ~15% -inf entries.
template <class Scalar, std::size_t Rank>
Tensor<Scalar, Rank> random_additive(const Shape<Rank>& shape, std::uint64_t seed) {
  auto m = attn::test::random_tensor<Scalar>(shape, seed, -2.0, 2.0);
  const auto u = attn::test::random_tensor<double>(shape, seed + 7, 0.0, 1.0);
  for (Index i = 0; i < m.size(); ++i) {
    if (u.data()[i] < 0.15) m.data()[i] = -std::numeric_limits<Scalar>::infinity();
  }
  return m;
}

/// Runs attn::scaled_dot_product_attention on `path` into a fresh (B, H, T_q, d_v) output
/// that starts as NaN (unwritten elements show up); fills `weights` (B, H, T_q, T_k) too
/// when given (materialised path only).
template <class Scalar>
Tensor<Scalar, 4> run_kernel(TensorView<const Scalar, 4> q, TensorView<const Scalar, 4> k,
                             TensorView<const Scalar, 4> v, const AttentionMask<Scalar>& mask,
                             AttentionOptions options, AttentionPath path,
                             Tensor<Scalar, 4>* weights = nullptr) {
  const Scalar nan = std::numeric_limits<Scalar>::quiet_NaN();
  Tensor<Scalar, 4> out({q.extent(0), q.extent(1), q.extent(2), v.extent(3)}, nan);
  options.path = path;
  TensorView<Scalar, 4> w{};
  if (weights != nullptr) {
    *weights = Tensor<Scalar, 4>({q.extent(0), q.extent(1), q.extent(2), k.extent(2)}, nan);
    w = weights->view();
  }
  scaled_dot_product_attention_with_weights<Scalar>(q, k, v, out.view(), w, mask, options);
  return out;
}

}  // namespace attn::test::ref
