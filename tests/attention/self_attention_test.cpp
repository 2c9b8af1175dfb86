// SPDX-License-Identifier: MIT
// tests/attention/self_attention_test.cpp: SelfAttention (attn/attention/self_attention.hpp): the
// linear and raw forms, scaling and unbatched inputs against the long double reference.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "attention/module_test_support.hpp"
#include "attn/attn.hpp"
#include "support/scalar_types.hpp"
#include "support/test_support.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace self_attention_test {

namespace {

using attn::Index;
using attn::Shape;
using attn::Tensor;
using attn::test::inv_sqrt;
using attn::test::module_tolerance;
using attn::test::wide;
using attn::test::WideWeights;
namespace ref = attn::test::ref;
using ref::Real;

template <class Scalar>
class SelfAttentionModule : public ::testing::Test {};
TYPED_TEST_SUITE(SelfAttentionModule, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

TYPED_TEST(SelfAttentionModule, SelfAttentionLinearFormWithAndWithoutBiasMatchesReference) {
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

TYPED_TEST(SelfAttentionModule, SelfAttentionRandInitDrawsRandInQkvOrder) {
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

TYPED_TEST(SelfAttentionModule, SelfAttentionFromParametersAppliesXTimesW) {
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

TYPED_TEST(SelfAttentionModule, SelfAttentionSetScaledFalseIsUnscaled) {
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

TYPED_TEST(SelfAttentionModule, SelfAttentionUnbatchedEqualsBatchOfOne) {
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

}  // namespace

}  // namespace self_attention_test

#include "support/bodies_end.hpp"
