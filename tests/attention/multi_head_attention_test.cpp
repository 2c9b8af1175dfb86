// SPDX-License-Identifier: MIT
// tests/attention/multi_head_attention_test.cpp: MultiHeadAttention
// (attn/attention/multi_head_attention.hpp): every projection layout against the long double
// reference, unbatched and strided inputs, weights, frozen weights, an explicit head_dim, and
// grouped-query configurations (equal to multi-head attention with repeated K/V weights).
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

#include "attention/module_test_support.hpp"
#include "attn/attn.hpp"
#include "support/scalar_types.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace multi_head_attention_test {

namespace {

using attn::AttentionMask;
using attn::CausalAlignment;
using attn::Index;
using attn::MultiHeadAttention;
using attn::MultiHeadAttentionOptions;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
using attn::test::inv_sqrt;
using attn::test::module_tolerance;
using attn::test::wide;
using attn::test::WideWeights;
using ::testing::AllOf;
using ::testing::HasSubstr;
namespace ref = attn::test::ref;
using ref::Real;

template <class Scalar>
class MultiHeadAttentionModule : public ::testing::Test {};
TYPED_TEST_SUITE(MultiHeadAttentionModule, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

TYPED_TEST(MultiHeadAttentionModule, MultiHeadNotebookConstructorIsCausal) {
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

TYPED_TEST(MultiHeadAttentionModule, MultiHeadFusedAndSeparateProjectionsAgree) {
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

TYPED_TEST(MultiHeadAttentionModule, MultiHeadSetInProjStackedAndPerHeadGiveIdenticalModules) {
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

TYPED_TEST(MultiHeadAttentionModule, MultiHeadWithKdimAndVdimMatchesReference) {
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

TYPED_TEST(MultiHeadAttentionModule, MultiHeadKeyAndValueSameTensorOrDistinctTensorsAgree) {
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

TYPED_TEST(MultiHeadAttentionModule, MultiHeadCrossAttentionWithCausalBottomRightMatchesReference) {
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

TYPED_TEST(MultiHeadAttentionModule, MultiHeadUnbatchedEqualsBatchOfOne) {
  using Scalar = TypeParam;
  attn::manual_seed(4);
  const MultiHeadAttention<Scalar> mha(6, 8, 50, 0.0, 2, true);
  const auto x = attn::test::random_tensor<Scalar>(Shape<2>{50, 6}, 32);
  const auto y2 = mha.forward(x.view());
  ASSERT_EQ(y2.shape(), (Shape<2>{50, 8}));
  const auto y3 = mha.forward(attn::unsqueeze(x.view(), 0));
  EXPECT_TRUE(ref::same_bits(y2.view(), attn::select(y3.view(), 0, 0)));
}

TYPED_TEST(MultiHeadAttentionModule, MultiHeadNonContiguousInputEqualsContiguousCopy) {
  using Scalar = TypeParam;
  attn::manual_seed(5);
  const MultiHeadAttention<Scalar> mha(6, 8, 50, 0.0, 2, true);
  const auto wide_x = attn::test::random_tensor<Scalar>(Shape<3>{2, 50, 10}, 33);
  const auto x = attn::slice(wide_x.view(), 2, 2, 8);  // (2, 50, 6), row stride 10
  const Tensor<Scalar, 3> x_copy(x);
  EXPECT_TRUE(ref::same_bits(mha.forward(x).view(), mha.forward(x_copy.view()).view()));
}

TYPED_TEST(MultiHeadAttentionModule, MultiHeadForwardWithWeightsRowsSumToOneAndAverageHeads) {
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

// ---- frozen weights ----

// freeze() packs the projection weights once; every forward path must then give the very
// same bits as the unfrozen module: fused Q/K/V (self), Q + fused K/V (cross, one key/value
// tensor), Q + K + V (distinct key and value tensors), kdim = vdim != d_in, kdim != vdim,
// with and without biases, a strided output (out_proj's fallback), and any thread count.
// Head dim 24 is not a divisor of the micro-panel width, and d = 3 * 256 gives the fused
// projection two column tiles, so the pack's column groups and the tiles' differ.
TYPED_TEST(MultiHeadAttentionModule, MultiHeadFrozenIsBitIdenticalToUnfrozen) {
  using Scalar = TypeParam;
  const Index b = 2, tq = 37, tk = 53, d = 768, heads = 32;
  const int saved = attn::num_threads();
  struct Config {
    Index kdim, vdim;
    bool bias;
  };
  for (const Config c :
       {Config{0, 0, true}, Config{0, 0, false}, Config{40, 40, true}, Config{40, 56, false}}) {
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
      mha.forward(x.view(), key.view(), value.view(), attn::slice(wide_out.view(), 2, d, 2 * d),
                  ws);
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
TYPED_TEST(MultiHeadAttentionModule, MultiHeadWeightAccessorsUnfreeze) {
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
          {"set_in_proj",
           [](auto& m) {
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

TYPED_TEST(MultiHeadAttentionModule, MultiHeadExplicitHeadDimMatchesReference) {
  // head_dim * num_heads != d_out (Gemma-like): W_q (H hd, d_in), out_proj (d_out, H hd).
  using Scalar = TypeParam;
  const Index b = 2, t = 9, d = 6, heads = 2, hd = 5;
  auto options = MultiHeadAttentionOptions::pytorch(d, heads, true);
  options.head_dim = hd;
  options.causal = true;
  attn::TorchGenerator gen(31);
  const MultiHeadAttention<Scalar> mha(options, gen);
  EXPECT_EQ(mha.head_dim(), hd);
  EXPECT_EQ(mha.d_out(), d);
  EXPECT_EQ(mha.q_proj_weight().shape(), (Shape<2>{heads * hd, d}));
  EXPECT_EQ(mha.out_proj().weight().shape(), (Shape<2>{d, heads * hd}));
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{b, t, d}, 32);
  ref::DenseMask causal(b, heads, t, t);
  causal.causal(CausalAlignment::kSquare);
  const auto expected = ref::module_forward(x.view(), x.view(), x.view(), wide(mha).views(), heads,
                                            causal, inv_sqrt(hd));
  EXPECT_TRUE(ref::all_near(mha.forward(x.view()).view(), expected.view(),
                            module_tolerance<Scalar>(d, hd, t, heads * hd)));
}

// Grouped-query attention is multi-head attention with each key/value head's weights
// repeated for its group (Hugging Face's repeat_kv on the projections): both modules must
// agree, causal and not, on one and two threads.
TYPED_TEST(MultiHeadAttentionModule, GroupedQueryEqualsMultiHeadWithRepeatedKeyValueWeights) {
  using Scalar = TypeParam;
  const Index d = 16, heads = 4, hd = 4, t = 9;
  for (const Index kv_heads : {Index(2), Index(1)}) {  // grouped-query, multi-query
    for (const bool causal : {false, true}) {
      auto options = MultiHeadAttentionOptions::pytorch(d, heads, true);
      options.num_kv_heads = kv_heads;
      options.causal = causal;
      options.init = attn::InitScheme::kLinear;  // non-zero biases
      MultiHeadAttention<Scalar> gqa(options);
      EXPECT_EQ(gqa.num_kv_heads(), kv_heads);
      EXPECT_EQ(gqa.k_proj_weight().shape(), (Shape<2>{hd * kv_heads, d}));
      EXPECT_EQ(gqa.in_proj_weight().shape(), (Shape<2>{d + 2 * hd * kv_heads, d}));
      options.num_kv_heads = 0;
      MultiHeadAttention<Scalar> mha(options);
      attn::copy(gqa.q_proj_weight(), mha.q_proj_weight());
      attn::copy(gqa.out_proj().weight(), mha.out_proj().weight());
      attn::copy(gqa.out_proj().bias(), mha.out_proj().bias());
      const Index group = heads / kv_heads;
      for (Index h = 0; h < heads; ++h) {
        for (Index e = 0; e < hd; ++e) {
          const Index to = h * hd + e, from = (h / group) * hd + e;
          attn::copy(attn::select(gqa.k_proj_weight(), 0, from),
                     attn::select(mha.k_proj_weight(), 0, to));
          attn::copy(attn::select(gqa.v_proj_weight(), 0, from),
                     attn::select(mha.v_proj_weight(), 0, to));
          mha.w_key().bias()(to) = gqa.w_key().bias()(from);
          mha.w_value().bias()(to) = gqa.w_value().bias()(from);
        }
      }
      attn::copy(gqa.w_query().bias(), mha.w_query().bias());
      gqa.eval();
      mha.eval();
      const auto x = attn::test::random_tensor<Scalar>(Shape<3>{2, t, d}, 3);
      const Tensor<Scalar, 3> expected = mha.forward(x.view());
      const int saved_threads = attn::num_threads();
      for (const int threads : {1, 2}) {
        attn::set_num_threads(threads);
        EXPECT_TRUE(ref::all_near(gqa.forward(x.view()).view(), expected.view(),
                                  module_tolerance<Scalar>(d, hd, t, d)))
            << "kv_heads=" << kv_heads << " causal=" << causal << " threads=" << threads;
      }
      attn::set_num_threads(saved_threads);
    }
  }
}

TEST(MultiHeadAttentionConfig, GroupedQueryAndHeadDimErrorsNameTheValues) {
  auto options = MultiHeadAttentionOptions::pytorch(12, 4);
  options.num_kv_heads = 3;
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>([&] { MultiHeadAttention<float> m(options); }),
              AllOf(HasSubstr("num_heads=4 is not divisible by num_kv_heads=3"),
                    HasSubstr("the number of heads in key and value must divide the number of "
                              "heads in query")));
  options.num_kv_heads = -1;
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>([&] { MultiHeadAttention<float> m(options); }),
              HasSubstr("num_kv_heads=-1"));
  options = MultiHeadAttentionOptions::pytorch(10, 4);
  EXPECT_THAT(
      attn::test::thrown<attn::ConfigError>([&] { MultiHeadAttention<float> m(options); }),
      AllOf(HasSubstr("d_out=10 is not divisible by num_heads=4"), HasSubstr("or set head_dim")));
  options.head_dim = 3;  // now fine: W_q (12, 10), out_proj (10, 12)
  const MultiHeadAttention<float> m(options);
  EXPECT_EQ(m.q_proj_weight().shape(), (Shape<2>{12, 10}));
  options.head_dim = -2;
  EXPECT_THAT(
      attn::test::thrown<attn::ConfigError>([&] { MultiHeadAttention<float> bad(options); }),
      HasSubstr("head_dim=-2"));
}

}  // namespace

}  // namespace multi_head_attention_test

#include "support/bodies_end.hpp"
