// SPDX-License-Identifier: MIT
// tests/attention/modules_test.cpp: every attention module against the long double
// reference computed from the module's own weights (plain-loop projections, attention per
// head, merge, out_proj), plus the equivalences between configurations.
//
// Tolerance: module_tolerance = (d_in + head_dim + T_k + d_out) * eps, the kernel's
// (d + T_k) eps (reference_attention.hpp) plus one n * eps term for each projection GEMM
// (inputs in [-1, 1], weights bounded by nn.Linear's 1/sqrt(fan_in) or [0, 1) for
// kRandInit). Measured errors stay at or below ~1/10 of it. Where two configurations run
// the very same arithmetic (same weights loaded two ways, unbatched vs batch of one, a
// wrapper head vs its slice of the wrapper output) results are compared bit for bit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "attention/reference_attention.hpp"
#include "attn/attn.hpp"
#include "support/test_support.hpp"

namespace {

using attn::AttentionMask;
using attn::CausalAlignment;
using attn::Index;
using attn::MultiHeadAttention;
using attn::MultiHeadAttentionOptions;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
namespace ref = attn::test::ref;
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

Real inv_sqrt(Index d) { return 1 / std::sqrt(static_cast<Real>(d)); }

template <class Scalar>
class Modules : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Modules, Scalars);

// ---------------------------------------------------------------- SimpleSelfAttention

TYPED_TEST(Modules, SimpleSelfAttentionIsUnscaledByDefault) {
  using Scalar = TypeParam;
  const Index t = 100, d = 3;
  const auto x = attn::test::random_tensor<Scalar>(Shape<2>{t, d}, 1);
  const attn::SimpleSelfAttention<Scalar> simple;
  EXPECT_FALSE(simple.scaled());
  const auto x4 = attn::unsqueeze(attn::unsqueeze(x.view(), 0), 0);
  const auto expected = ref::attention(x4, x4, x4, ref::DenseMask(1, 1, t, t), 1);
  const double tol = ref::kernel_tolerance<Scalar>(d, t);
  const auto y = simple.forward(x);
  EXPECT_TRUE(
      ref::all_near(y.view(), attn::select(attn::select(expected.output.view(), 0, 0), 0, 0), tol));
  const auto r = simple.forward_with_weights(x);
  EXPECT_TRUE(ref::all_near(r.weights.view(),
                            attn::select(attn::select(expected.weights.view(), 0, 0), 0, 0), tol));
  EXPECT_TRUE(ref::all_near(r.output.view(), y.view(), tol));
}

TYPED_TEST(Modules, SimpleSelfAttentionScaledDividesBySqrtD) {
  using Scalar = TypeParam;
  const Index b = 2, t = 70, d = 8;
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{b, t, d}, 2);
  const attn::SimpleSelfAttention<Scalar> simple(/*scaled=*/true);
  const auto x4 = attn::unsqueeze(x.view(), 1);
  const auto expected = ref::attention(x4, x4, x4, ref::DenseMask(b, 1, t, t), inv_sqrt(d));
  EXPECT_TRUE(ref::all_near(simple.forward(x).view(), attn::select(expected.output.view(), 1, 0),
                            ref::kernel_tolerance<Scalar>(d, t)));
}

// ---------------------------------------------------------------- SelfAttention

TYPED_TEST(Modules, SelfAttentionLinearFormWithAndWithoutBiasMatchesReference) {
  using Scalar = TypeParam;
  const Index b = 2, t = 130, d_in = 6, d_out = 4;
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{b, t, d_in}, 3);
  for (const bool bias : {false, true}) {
    SCOPED_TRACE(bias ? "bias" : "no bias");
    attn::manual_seed(123);
    const attn::SelfAttention<Scalar> sa(d_in, d_out, bias);
    EXPECT_EQ(sa.w_query().has_bias(), bias);
    EXPECT_TRUE(sa.scaled());
    const auto expected = ref::module_forward(x.view(), x.view(), x.view(), wide(sa).views(), 1,
                                              ref::DenseMask(b, 1, t, t), inv_sqrt(d_out));
    EXPECT_TRUE(ref::all_near(sa.forward(x.view()).view(), expected.view(),
                              module_tolerance<Scalar>(d_in, d_out, t, 0)));
  }
}

TYPED_TEST(Modules, SelfAttentionRandInitDrawsRandInQkvOrder) {
  using Scalar = TypeParam;
  const Index d_in = 3, d_out = 2;
  attn::manual_seed(123);
  const attn::SelfAttention<Scalar> sa(d_in, d_out, attn::kRandInit);
  attn::manual_seed(123);
  const auto rq = attn::rand<Scalar>(Shape<2>{d_in, d_out});
  const auto rk = attn::rand<Scalar>(Shape<2>{d_in, d_out});
  const auto rv = attn::rand<Scalar>(Shape<2>{d_in, d_out});
  // Stored in nn.Linear's layout: the (d_in, d_out) parameter transposed.
  EXPECT_TRUE(ref::same_bits(sa.w_query().weight(), attn::transpose(rq.view())));
  EXPECT_TRUE(ref::same_bits(sa.w_key().weight(), attn::transpose(rk.view())));
  EXPECT_TRUE(ref::same_bits(sa.w_value().weight(), attn::transpose(rv.view())));
  EXPECT_FALSE(sa.w_query().has_bias());
  for (const Scalar w : attn::test::to_vector(sa.w_value().weight())) {
    EXPECT_GE(w, Scalar(0));
    EXPECT_LT(w, Scalar(1));
  }
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{1, 6, d_in}, 4);
  const auto expected = ref::module_forward(x.view(), x.view(), x.view(), wide(sa).views(), 1,
                                            ref::DenseMask(1, 1, 6, 6), inv_sqrt(d_out));
  EXPECT_TRUE(ref::all_near(sa.forward(x.view()).view(), expected.view(),
                            module_tolerance<Scalar>(d_in, d_out, 6, 0)));
}

TYPED_TEST(Modules, SelfAttentionFromParametersAppliesXTimesW) {
  using Scalar = TypeParam;
  const Index b = 2, t = 40, d_in = 5, d_out = 3;
  const auto wq = attn::test::random_tensor<Scalar>(Shape<2>{d_in, d_out}, 5, 0, 1);
  const auto wk = attn::test::random_tensor<Scalar>(Shape<2>{d_in, d_out}, 6, 0, 1);
  const auto wv = attn::test::random_tensor<Scalar>(Shape<2>{d_in, d_out}, 7, 0, 1);
  const auto sa = attn::SelfAttention<Scalar>::from_parameters(wq.view(), wk.view(), wv.view());
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{b, t, d_in}, 8);
  // q = x @ W_query with W (d_in, d_out), written out here: (d_out, d_in) rows are W's columns.
  const auto as_linear = [&](const Tensor<Scalar, 2>& w) {
    Tensor<Real, 2> lin({d_out, d_in});
    for (Index o = 0; o < d_out; ++o)
      for (Index i = 0; i < d_in; ++i) lin(o, i) = w(i, o);
    return lin;
  };
  WideWeights w;
  w.wq = as_linear(wq);
  w.wk = as_linear(wk);
  w.wv = as_linear(wv);
  const auto expected = ref::module_forward(x.view(), x.view(), x.view(), w.views(), 1,
                                            ref::DenseMask(b, 1, t, t), inv_sqrt(d_out));
  EXPECT_TRUE(ref::all_near(sa.forward(x.view()).view(), expected.view(),
                            module_tolerance<Scalar>(d_in, d_out, t, 0)));
}

TYPED_TEST(Modules, SelfAttentionSetScaledFalseIsUnscaled) {
  using Scalar = TypeParam;
  const Index b = 1, t = 50, d_in = 4, d_out = 6;
  attn::manual_seed(1);
  attn::SelfAttention<Scalar> sa(d_in, d_out, true);
  sa.set_scaled(false);
  EXPECT_FALSE(sa.scaled());
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{b, t, d_in}, 9);
  const auto unscaled = ref::module_forward(x.view(), x.view(), x.view(), wide(sa).views(), 1,
                                            ref::DenseMask(b, 1, t, t), 1);
  const auto scaled = ref::module_forward(x.view(), x.view(), x.view(), wide(sa).views(), 1,
                                          ref::DenseMask(b, 1, t, t), inv_sqrt(d_out));
  const auto y = sa.forward(x.view());
  const double tol = module_tolerance<Scalar>(d_in, d_out, t, 0);
  EXPECT_TRUE(ref::all_near(y.view(), unscaled.view(), tol));
  EXPECT_FALSE(ref::all_near(y.view(), scaled.view(), 100 * tol));
}

TYPED_TEST(Modules, SelfAttentionUnbatchedEqualsBatchOfOne) {
  using Scalar = TypeParam;
  attn::manual_seed(2);
  const attn::SelfAttention<Scalar> sa(5, 4, true);
  const auto x = attn::test::random_tensor<Scalar>(Shape<2>{30, 5}, 10);
  const auto y2 = sa.forward(x.view());
  const auto y3 = sa.forward(attn::unsqueeze(x.view(), 0));
  EXPECT_TRUE(ref::same_bits(y2.view(), attn::select(y3.view(), 0, 0)));
  const auto r2 = sa.forward_with_weights(x.view());
  const auto r3 = sa.forward_with_weights(attn::unsqueeze(x.view(), 0));
  EXPECT_TRUE(ref::same_bits(r2.weights.view(), attn::select(r3.weights.view(), 0, 0)));
}

// ---------------------------------------------------------------- CausalAttention

TYPED_TEST(Modules, CausalAttentionMatchesCausalReference) {
  using Scalar = TypeParam;
  const Index b = 2, t = 150, d_in = 5, d_out = 4;
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{b, t, d_in}, 11);
  for (const bool bias : {false, true}) {
    SCOPED_TRACE(bias ? "bias" : "no bias");
    attn::manual_seed(123);
    const attn::CausalAttention<Scalar> ca(d_in, d_out, /*context_length=*/200, 0.0, bias);
    ref::DenseMask causal(b, 1, t, t);
    causal.causal(CausalAlignment::kSquare);
    Tensor<double, 4> expected_weights;
    const auto expected = ref::module_forward(x.view(), x.view(), x.view(), wide(ca).views(), 1,
                                              causal, inv_sqrt(d_out), &expected_weights);
    const double tol = module_tolerance<Scalar>(d_in, d_out, t, 0);
    EXPECT_TRUE(ref::all_near(ca.forward(x.view()).view(), expected.view(), tol));
    const auto r = ca.forward_with_weights(x.view());
    EXPECT_TRUE(ref::all_near(r.weights.view(), attn::select(expected_weights.view(), 1, 0), tol));
    EXPECT_TRUE(ref::all_near(r.output.view(), expected.view(), tol));
  }
}

TYPED_TEST(Modules, CausalAttentionCombinesAUserMask) {
  using Scalar = TypeParam;
  const Index b = 2, t = 90, d_in = 5, d_out = 4;
  attn::manual_seed(3);
  const attn::CausalAttention<Scalar> ca(d_in, d_out, t, 0.0, true);
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{b, t, d_in}, 12);
  const auto pad = ref::random_bools(Shape<2>{b, t}, 13, 0.3);
  ref::DenseMask dense(b, 1, t, t);
  dense.causal(CausalAlignment::kSquare).key_padding(pad.view());
  const auto expected = ref::module_forward(x.view(), x.view(), x.view(), wide(ca).views(), 1,
                                            dense, inv_sqrt(d_out));
  EXPECT_TRUE(
      ref::all_near(ca.forward(x.view(), AttentionMask<Scalar>().key_padding(pad.view())).view(),
                    expected.view(), module_tolerance<Scalar>(d_in, d_out, t, 0)));
}

// ---------------------------------------------------------------- MultiHeadAttentionWrapper

TYPED_TEST(Modules, WrapperEqualsConcatenationOfItsHeads) {
  using Scalar = TypeParam;
  const Index b = 2, t = 80, d_in = 6, d_out = 4, heads = 3;
  attn::manual_seed(123);
  const attn::MultiHeadAttentionWrapper<Scalar> wrapper(d_in, d_out, t, 0.0, heads);
  ASSERT_EQ(wrapper.num_heads(), heads);
  ASSERT_EQ(wrapper.d_out(), heads * d_out);
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{b, t, d_in}, 14);
  const auto y = wrapper.forward(x.view());
  ASSERT_EQ(y.shape(), (Shape<3>{b, t, heads * d_out}));
  ref::DenseMask causal(b, 1, t, t);
  causal.causal(CausalAlignment::kSquare);
  for (Index h = 0; h < heads; ++h) {
    SCOPED_TRACE("head " + std::to_string(h));
    const auto part = attn::slice(y.view(), 2, h * d_out, (h + 1) * d_out);
    const auto alone = wrapper.head(h).forward(x.view());
    EXPECT_TRUE(ref::same_bits(part, alone.view()));  // the same arithmetic, another destination
    const auto expected = ref::module_forward(
        x.view(), x.view(), x.view(), wide(wrapper.head(h)).views(), 1, causal, inv_sqrt(d_out));
    EXPECT_TRUE(ref::all_near(part, expected.view(), module_tolerance<Scalar>(d_in, d_out, t, 0)));
  }
  // Heads are drawn one after another: they differ.
  EXPECT_FALSE(
      ref::same_bits(wrapper.head(0).w_query().weight(), wrapper.head(1).w_query().weight()));
}

// ---------------------------------------------------------------- MultiHeadAttention

TYPED_TEST(Modules, MultiHeadNotebookConstructorIsCausal) {
  using Scalar = TypeParam;
  const Index b = 2, t = 100, d_in = 6, d_out = 8, heads = 2;
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{b, t, d_in}, 15);
  for (const bool bias : {false, true}) {
    SCOPED_TRACE(bias ? "qkv_bias" : "no qkv_bias");
    attn::manual_seed(123);
    const MultiHeadAttention<Scalar> mha(d_in, d_out, /*context_length=*/t, 0.0, heads, bias);
    EXPECT_TRUE(mha.is_causal());
    EXPECT_EQ(mha.out_proj().has_bias(), bias);  // the notebook's out_proj follows qkv_bias
    ref::DenseMask causal(b, heads, t, t);
    causal.causal(CausalAlignment::kSquare);
    const auto expected = ref::module_forward(x.view(), x.view(), x.view(), wide(mha).views(),
                                              heads, causal, inv_sqrt(d_out / heads));
    const auto y = mha.forward(x.view());
    const double tol = module_tolerance<Scalar>(d_in, d_out / heads, t, d_out);
    EXPECT_TRUE(ref::all_near(y.view(), expected.view(), tol));
    const auto unmasked =
        ref::module_forward(x.view(), x.view(), x.view(), wide(mha).views(), heads,
                            ref::DenseMask(b, heads, t, t), inv_sqrt(d_out / heads));
    EXPECT_FALSE(ref::all_near(y.view(), unmasked.view(), 100 * tol));
  }
}

/// Random fused weights (3 D, D) and bias (3 D) in the stacked [W_q; W_k; W_v] layout.
template <class Scalar>
std::pair<Tensor<Scalar, 2>, Tensor<Scalar, 1>> random_in_proj(Index d, std::uint64_t seed) {
  const double bound = 1 / std::sqrt(static_cast<double>(d));
  return {attn::test::random_tensor<Scalar>(Shape<2>{3 * d, d}, seed, -bound, bound),
          attn::test::random_tensor<Scalar>(Shape<1>{3 * d}, seed + 1, -bound, bound)};
}

TYPED_TEST(Modules, MultiHeadFusedAndSeparateProjectionsAgree) {
  using Scalar = TypeParam;
  const Index b = 2, t = 120, d = 16, heads = 4;
  auto options = MultiHeadAttentionOptions::pytorch(d, heads);
  options.causal = true;
  MultiHeadAttention<Scalar> fused(options), separate(options);
  const auto [w, bias] = random_in_proj<Scalar>(d, 16);
  fused.set_in_proj(w.view(), bias.view());
  // The same weights through the per-projection views, as the notebooks' W_query etc.
  separate.w_query().set_weight(attn::slice(w.view(), 0, 0, d));
  separate.w_key().set_weight(attn::slice(w.view(), 0, d, 2 * d));
  separate.w_value().set_weight(attn::slice(w.view(), 0, 2 * d, 3 * d));
  separate.w_query().set_bias(attn::slice(bias.view(), 0, 0, d));
  separate.w_key().set_bias(attn::slice(bias.view(), 0, d, 2 * d));
  separate.w_value().set_bias(attn::slice(bias.view(), 0, 2 * d, 3 * d));
  separate.out_proj().set_weight(fused.out_proj().weight());
  separate.out_proj().set_bias(fused.out_proj().bias());
  EXPECT_TRUE(ref::same_bits(fused.in_proj_weight(), separate.in_proj_weight()));
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{b, t, d}, 17);
  const auto y_fused = fused.forward(x.view());
  EXPECT_TRUE(ref::same_bits(y_fused.view(), separate.forward(x.view()).view()));

  // Self-attention runs one fused (3D) GEMM; distinct but equal query/key/value tensors run
  // one GEMM per projection. Same result within rounding, and both match the reference.
  const Tensor<Scalar, 3> xk = x, xv = x;
  const auto y_split = fused.forward(x.view(), xk.view(), xv.view());
  ref::DenseMask causal(b, heads, t, t);
  causal.causal(CausalAlignment::kSquare);
  const auto expected = ref::module_forward(x.view(), x.view(), x.view(), wide(fused).views(),
                                            heads, causal, inv_sqrt(d / heads));
  const double tol = module_tolerance<Scalar>(d, d / heads, t, d);
  EXPECT_TRUE(ref::all_near(y_fused.view(), expected.view(), tol));
  EXPECT_TRUE(ref::all_near(y_split.view(), expected.view(), tol));
  EXPECT_TRUE(ref::all_near(y_split.view(), y_fused.view(), tol));
}

TYPED_TEST(Modules, MultiHeadSetInProjStackedAndPerHeadGiveIdenticalModules) {
  using Scalar = TypeParam;
  const Index b = 2, t = 60, d = 12, heads = 3, hd = d / heads;
  const auto [stacked, stacked_bias] = random_in_proj<Scalar>(d, 18);
  // Notebook 004's qkv_layer: per head h, rows [q_h | k_h | v_h] (3 * hd rows each).
  Tensor<Scalar, 2> per_head({3 * d, d});
  Tensor<Scalar, 1> per_head_bias({3 * d});
  for (Index h = 0; h < heads; ++h)
    for (Index c = 0; c < 3; ++c)  // 0 = q, 1 = k, 2 = v
      for (Index e = 0; e < hd; ++e) {
        const Index src = c * d + h * hd + e, dst = h * 3 * hd + c * hd + e;
        for (Index i = 0; i < d; ++i) per_head(dst, i) = stacked(src, i);
        per_head_bias(dst) = stacked_bias(src);
      }
  auto options = MultiHeadAttentionOptions::pytorch(d, heads);
  MultiHeadAttention<Scalar> a(options), bm(options);
  a.set_in_proj(stacked.view(), stacked_bias.view(), attn::QkvLayout::kStacked);
  bm.set_in_proj(per_head.view(), per_head_bias.view(), attn::QkvLayout::kPerHead);
  bm.out_proj().set_weight(a.out_proj().weight());
  bm.out_proj().set_bias(a.out_proj().bias());
  EXPECT_TRUE(ref::same_bits(a.in_proj_weight(), bm.in_proj_weight()));
  EXPECT_TRUE(ref::same_bits(a.in_proj_bias(), bm.in_proj_bias()));
  EXPECT_TRUE(ref::same_bits(a.in_proj_weight(), TensorView<const Scalar, 2>(stacked.view())));
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{b, t, d}, 19);
  const auto y = a.forward(x.view());
  EXPECT_TRUE(ref::same_bits(y.view(), bm.forward(x.view()).view()));
  // And the per-head layout means what notebook 004 does: qkv = x W^T, then per head the
  // 3 * hd columns split into q, k, v. Reference straight from the per-head matrix:
  WideWeights w;
  w.wq = Tensor<Real, 2>({d, d});
  w.wk = Tensor<Real, 2>({d, d});
  w.wv = Tensor<Real, 2>({d, d});
  w.bq = Tensor<Real, 1>({d});
  w.bk = Tensor<Real, 1>({d});
  w.bv = Tensor<Real, 1>({d});
  for (Index h = 0; h < heads; ++h)
    for (Index e = 0; e < hd; ++e) {
      const Index row = h * 3 * hd + e;
      for (Index i = 0; i < d; ++i) {
        w.wq(h * hd + e, i) = per_head(row, i);
        w.wk(h * hd + e, i) = per_head(row + hd, i);
        w.wv(h * hd + e, i) = per_head(row + 2 * hd, i);
      }
      w.bq(h * hd + e) = per_head_bias(row);
      w.bk(h * hd + e) = per_head_bias(row + hd);
      w.bv(h * hd + e) = per_head_bias(row + 2 * hd);
    }
  w.wo = ref::widen(a.out_proj().weight());
  w.bo = ref::widen(a.out_proj().bias());
  const auto expected = ref::module_forward(x.view(), x.view(), x.view(), w.views(), heads,
                                            ref::DenseMask(b, heads, t, t), inv_sqrt(hd));
  EXPECT_TRUE(ref::all_near(y.view(), expected.view(), module_tolerance<Scalar>(d, hd, t, d)));
}

TYPED_TEST(Modules, MultiHeadWithKdimAndVdimMatchesReference) {
  using Scalar = TypeParam;
  const Index b = 2, tq = 30, tk = 75, d_in = 6, d_out = 8, heads = 2, kdim = 5, vdim = 7;
  auto options = MultiHeadAttentionOptions::pytorch(d_in, heads, true, kdim, vdim);
  options.d_out = d_out;
  attn::TorchGenerator gen(21);
  const MultiHeadAttention<Scalar> mha(options, gen);
  EXPECT_FALSE(mha.qkv_same_embed_dim());
  EXPECT_EQ(mha.k_proj_weight().shape(), (Shape<2>{d_out, kdim}));
  EXPECT_EQ(mha.v_proj_weight().shape(), (Shape<2>{d_out, vdim}));
  EXPECT_THROW(static_cast<void>(mha.in_proj_weight()), std::logic_error);
  const auto query = attn::test::random_tensor<Scalar>(Shape<3>{b, tq, d_in}, 22);
  const auto key = attn::test::random_tensor<Scalar>(Shape<3>{b, tk, kdim}, 23);
  const auto value = attn::test::random_tensor<Scalar>(Shape<3>{b, tk, vdim}, 24);
  const auto expected =
      ref::module_forward(query.view(), key.view(), value.view(), wide(mha).views(), heads,
                          ref::DenseMask(b, heads, tq, tk), inv_sqrt(d_out / heads));
  EXPECT_TRUE(ref::all_near(mha.forward(query.view(), key.view(), value.view()).view(),
                            expected.view(),
                            module_tolerance<Scalar>(vdim, d_out / heads, tk, d_out)));
}

TYPED_TEST(Modules, MultiHeadKeyAndValueSameTensorOrDistinctTensorsAgree) {
  using Scalar = TypeParam;
  const Index b = 2, tq = 40, tk = 170, d = 8, heads = 2;
  const auto query = attn::test::random_tensor<Scalar>(Shape<3>{b, tq, d}, 25);
  for (const Index kv_dim : {d, Index{5}}) {  // same dims (fused Q/K/V) and kdim = vdim != d_in
    SCOPED_TRACE("kdim = vdim = " + std::to_string(kv_dim));
    auto options = MultiHeadAttentionOptions::pytorch(d, heads, true, kv_dim, kv_dim);
    attn::TorchGenerator gen(26);
    const MultiHeadAttention<Scalar> mha(options, gen);
    const auto kv = attn::test::random_tensor<Scalar>(Shape<3>{b, tk, kv_dim}, 27);
    const Tensor<Scalar, 3> kv_copy = kv;
    const auto pad = ref::random_bools(Shape<2>{b, tk}, 28, 0.2);
    const AttentionMask<Scalar> mask = AttentionMask<Scalar>().key_padding(pad.view());
    ref::DenseMask dense(b, heads, tq, tk);
    dense.key_padding(pad.view());
    const auto expected = ref::module_forward(query.view(), kv.view(), kv.view(), wide(mha).views(),
                                              heads, dense, inv_sqrt(d / heads));
    const double tol = module_tolerance<Scalar>(d, d / heads, tk, d);
    const auto same = mha.forward(query.view(), kv.view(), kv.view(), mask);  // one K/V GEMM
    const auto distinct = mha.forward(query.view(), kv.view(), kv_copy.view(), mask);
    EXPECT_TRUE(ref::all_near(same.view(), expected.view(), tol));
    EXPECT_TRUE(ref::all_near(distinct.view(), expected.view(), tol));
  }
}

TYPED_TEST(Modules, MultiHeadCrossAttentionWithCausalBottomRightMatchesReference) {
  using Scalar = TypeParam;
  const Index b = 1, tq = 20, tk = 150, d = 8, heads = 4;
  auto options = MultiHeadAttentionOptions::pytorch(d, heads, false);
  options.causal = true;
  options.causal_alignment = CausalAlignment::kBottomRight;  // a KV cache: last query sees all
  attn::TorchGenerator gen(29);
  const MultiHeadAttention<Scalar> mha(options, gen);
  const auto query = attn::test::random_tensor<Scalar>(Shape<3>{b, tq, d}, 30);
  const auto kv = attn::test::random_tensor<Scalar>(Shape<3>{b, tk, d}, 31);
  ref::DenseMask dense(b, heads, tq, tk);
  dense.causal(CausalAlignment::kBottomRight);
  const auto expected = ref::module_forward(query.view(), kv.view(), kv.view(), wide(mha).views(),
                                            heads, dense, inv_sqrt(d / heads));
  EXPECT_TRUE(ref::all_near(mha.forward(query.view(), kv.view(), kv.view()).view(), expected.view(),
                            module_tolerance<Scalar>(d, d / heads, tk, d)));
}

TYPED_TEST(Modules, MultiHeadUnbatchedEqualsBatchOfOne) {
  using Scalar = TypeParam;
  attn::manual_seed(4);
  const MultiHeadAttention<Scalar> mha(6, 8, 50, 0.0, 2, true);
  const auto x = attn::test::random_tensor<Scalar>(Shape<2>{50, 6}, 32);
  const auto y2 = mha.forward(x.view());
  ASSERT_EQ(y2.shape(), (Shape<2>{50, 8}));
  const auto y3 = mha.forward(attn::unsqueeze(x.view(), 0));
  EXPECT_TRUE(ref::same_bits(y2.view(), attn::select(y3.view(), 0, 0)));
}

TYPED_TEST(Modules, MultiHeadNonContiguousInputEqualsContiguousCopy) {
  using Scalar = TypeParam;
  attn::manual_seed(5);
  const MultiHeadAttention<Scalar> mha(6, 8, 50, 0.0, 2, true);
  const auto wide_x = attn::test::random_tensor<Scalar>(Shape<3>{2, 50, 10}, 33);
  const auto x = attn::slice(wide_x.view(), 2, 2, 8);  // (2, 50, 6), row stride 10
  const Tensor<Scalar, 3> x_copy(x);
  EXPECT_TRUE(ref::same_bits(mha.forward(x).view(), mha.forward(x_copy.view()).view()));
}

TYPED_TEST(Modules, MultiHeadForwardWithWeightsRowsSumToOneAndAverageHeads) {
  using Scalar = TypeParam;
  const Index b = 2, tq = 35, tk = 140, d = 12, heads = 3;
  attn::TorchGenerator gen(34);
  const MultiHeadAttention<Scalar> mha(MultiHeadAttentionOptions::pytorch(d, heads), gen);
  const auto query = attn::test::random_tensor<Scalar>(Shape<3>{b, tq, d}, 35);
  const auto kv = attn::test::random_tensor<Scalar>(Shape<3>{b, tk, d}, 36);
  const auto r = mha.forward_with_weights(query.view(), kv.view(), kv.view());
  ASSERT_EQ(r.weights.shape(), (Shape<4>{b, heads, tq, tk}));
  Tensor<double, 4> expected_weights;
  const auto expected =
      ref::module_forward(query.view(), kv.view(), kv.view(), wide(mha).views(), heads,
                          ref::DenseMask(b, heads, tq, tk), inv_sqrt(d / heads), &expected_weights);
  const double tol = module_tolerance<Scalar>(d, d / heads, tk, d);
  EXPECT_TRUE(ref::all_near(r.output.view(), expected.view(), tol));
  EXPECT_TRUE(ref::all_near(r.weights.view(), expected_weights.view(), tol));
  EXPECT_TRUE(
      ref::all_near(r.output.view(), mha.forward(query.view(), kv.view(), kv.view()).view(), tol));
  for (Index bi = 0; bi < b; ++bi)
    for (Index h = 0; h < heads; ++h)
      for (Index i = 0; i < tq; ++i) {
        double sum = 0;
        for (Index j = 0; j < tk; ++j) sum += static_cast<double>(r.weights(bi, h, i, j));
        ASSERT_NEAR(sum, 1.0, ref::kernel_tolerance<Scalar>(d / heads, tk));
      }
  const auto mean = attn::average_heads(r.weights.view());
  ASSERT_EQ(mean.shape(), (Shape<3>{b, tq, tk}));
  Tensor<double, 3> expected_mean({b, tq, tk});
  for (Index bi = 0; bi < b; ++bi)
    for (Index i = 0; i < tq; ++i)
      for (Index j = 0; j < tk; ++j) {
        for (Index h = 0; h < heads; ++h)
          expected_mean(bi, i, j) += static_cast<double>(r.weights(bi, h, i, j));
        expected_mean(bi, i, j) /= static_cast<double>(heads);
      }
  EXPECT_TRUE(
      ref::all_near(mean.view(), expected_mean.view(), 4 * std::numeric_limits<Scalar>::epsilon()));
}

// ---------------------------------------------------------------- CrossAttention

TYPED_TEST(Modules, CrossAttentionMatchesReference) {
  using Scalar = TypeParam;
  const Index b = 2, tq = 30, tkv = 90, d_q = 6, d_kv = 10, d_out = 8, heads = 2;
  attn::manual_seed(6);
  const attn::CrossAttention<Scalar> cross(d_q, d_kv, d_out, heads, /*qkv_bias=*/true);
  EXPECT_TRUE(cross.module().out_proj().has_bias());
  const auto x_q = attn::test::random_tensor<Scalar>(Shape<3>{b, tq, d_q}, 37);
  const auto x_kv = attn::test::random_tensor<Scalar>(Shape<3>{b, tkv, d_kv}, 38);
  Tensor<double, 4> expected_weights;
  const auto expected = ref::module_forward(
      x_q.view(), x_kv.view(), x_kv.view(), wide(cross.module()).views(), heads,
      ref::DenseMask(b, heads, tq, tkv), inv_sqrt(d_out / heads), &expected_weights);
  const double tol = module_tolerance<Scalar>(d_kv, d_out / heads, tkv, d_out);
  const auto y = cross.forward(x_q.view(), x_kv.view());
  EXPECT_TRUE(ref::all_near(y.view(), expected.view(), tol));
  const auto r = cross.forward_with_weights(x_q.view(), x_kv.view());
  EXPECT_TRUE(ref::all_near(r.weights.view(), expected_weights.view(), tol));
  Tensor<Scalar, 3> out({b, tq, d_out});
  attn::Workspace ws;
  cross.forward(x_q.view(), x_kv.view(), out.view(), ws);
  EXPECT_TRUE(ref::same_bits(out.view(), y.view()));
}

// ---------------------------------------------------------------- frozen weights

// freeze() packs the projection weights once; every forward path must then give the very
// same bits as the unfrozen module: fused Q/K/V (self), Q + fused K/V (cross, one key/value
// tensor), Q + K + V (distinct key and value tensors), kdim = vdim != d_in, kdim != vdim,
// with and without biases, a strided output (out_proj's fallback), and any thread count.
// Head dim 24 is not a divisor of the micro-panel width, and d = 3 * 256 gives the fused
// projection two column tiles, so the pack's column groups and the tiles' differ.
TYPED_TEST(Modules, MultiHeadFrozenIsBitIdenticalToUnfrozen) {
  using Scalar = TypeParam;
  const Index b = 2, tq = 37, tk = 53, d = 768, heads = 32;
  const int saved = attn::num_threads();
  struct Config {
    Index kdim, vdim;
    bool bias;
  };
  for (const Config c : {Config{0, 0, true}, Config{0, 0, false}, Config{40, 40, true},
                         Config{40, 56, false}}) {
    SCOPED_TRACE("kdim=" + std::to_string(c.kdim) + " vdim=" + std::to_string(c.vdim) +
                 " bias=" + std::to_string(c.bias));
    attn::TorchGenerator gen(41);
    MultiHeadAttention<Scalar> mha(
        MultiHeadAttentionOptions::pytorch(d, heads, c.bias, c.kdim, c.vdim), gen);
    const Index kdim = mha.kdim(), vdim = mha.vdim();
    const auto x = attn::test::random_tensor<Scalar>(Shape<3>{b, tq, d}, 42);
    const auto key = attn::test::random_tensor<Scalar>(Shape<3>{b, tk, kdim}, 43);
    const auto value = attn::test::random_tensor<Scalar>(Shape<3>{b, tk, vdim}, 44);
    const Tensor<Scalar, 3> key_copy = key;
    const auto run_all = [&] {
      std::vector<Tensor<Scalar, 3>> outs;
      if (mha.qkv_same_embed_dim()) outs.push_back(mha.forward(x.view()));
      if (kdim == vdim) {
        outs.push_back(mha.forward(x.view(), key.view(), key.view()));       // fused K/V
        outs.push_back(mha.forward(x.view(), key.view(), key_copy.view()));  // K and V apart
      }
      outs.push_back(mha.forward(x.view(), key.view(), value.view()));
      // A strided output: out_proj writes through a contiguous copy.
      Tensor<Scalar, 3> wide_out({b, tq, 2 * d});
      attn::Workspace ws;
      mha.forward(x.view(), key.view(), value.view(),
                  attn::slice(wide_out.view(), 2, d, 2 * d), ws);
      outs.emplace_back(attn::slice(wide_out.view(), 2, d, 2 * d));
      return outs;
    };
    attn::set_num_threads(1);
    const auto expected = run_all();
    mha.freeze();
    ASSERT_TRUE(mha.is_frozen());
    for (const int threads : {1, 2, 3}) {
      attn::set_num_threads(threads);
      const auto got = run_all();
      ASSERT_EQ(got.size(), expected.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        EXPECT_TRUE(ref::same_bits(got[i].view(), expected[i].view()))
            << "forward " << i << ", threads=" << threads;
      }
    }
    // A copy keeps its own packs.
    const MultiHeadAttention<Scalar> copy = mha;
    EXPECT_TRUE(copy.is_frozen());
    EXPECT_TRUE(ref::same_bits(copy.forward(x.view(), key.view(), value.view()).view(),
                               expected[expected.size() - 2].view()));
  }
  attn::set_num_threads(saved);
}

// Every non-const weight accessor unfreezes, so weights edited through it take effect.
TYPED_TEST(Modules, MultiHeadWeightAccessorsUnfreeze) {
  using Scalar = TypeParam;
  const Index b = 1, t = 9, d = 16, heads = 2;
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{b, t, d}, 45);
  attn::TorchGenerator gen(46);
  MultiHeadAttention<Scalar> mha(MultiHeadAttentionOptions::pytorch(d, heads), gen);
  const std::vector<std::pair<std::string, std::function<void(MultiHeadAttention<Scalar>&)>>>
      edits = {
          {"in_proj_weight", [](auto& m) { m.in_proj_weight()(0, 0) += Scalar(0.5); }},
          {"q_proj_weight", [](auto& m) { m.q_proj_weight()(1, 2) += Scalar(0.5); }},
          {"k_proj_weight", [](auto& m) { m.k_proj_weight()(3, 1) += Scalar(0.5); }},
          {"v_proj_weight", [](auto& m) { m.v_proj_weight()(2, 2) += Scalar(0.5); }},
          {"w_query", [](auto& m) { m.w_query().weight()(0, 1) += Scalar(0.5); }},
          {"w_key", [](auto& m) { m.w_key().weight()(1, 1) += Scalar(0.5); }},
          {"w_value", [](auto& m) { m.w_value().weight()(4, 0) += Scalar(0.5); }},
          {"out_proj", [](auto& m) { m.out_proj().weight()(5, 5) += Scalar(0.5); }},
          {"set_in_proj", [](auto& m) {
             Tensor<Scalar, 2> w(std::as_const(m).in_proj_weight());
             w(7, 3) += Scalar(0.5);
             m.set_in_proj(w.view());
           }},
      };
  for (const auto& [name, edit] : edits) {
    SCOPED_TRACE(name);
    mha.freeze();
    const auto before = mha.forward(x.view());
    edit(mha);
    EXPECT_FALSE(mha.is_frozen());
    const MultiHeadAttention<Scalar> fresh = mha;  // unfrozen, the edited weights
    const auto after = mha.forward(x.view());
    EXPECT_FALSE(ref::same_bits(after.view(), before.view()));
    EXPECT_TRUE(ref::same_bits(after.view(), fresh.forward(x.view()).view()));
    mha.freeze();
    EXPECT_TRUE(ref::same_bits(mha.forward(x.view()).view(), after.view()));
  }
  attn::CrossAttention<Scalar> cross(6, 10, 8, 2, true);
  cross.freeze();
  EXPECT_TRUE(cross.is_frozen());
  static_cast<void>(cross.module().k_proj_weight());
  EXPECT_FALSE(cross.is_frozen());
}

}  // namespace
