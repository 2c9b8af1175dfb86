// SPDX-License-Identifier: MIT
// tests/attention/simple_self_attention_test.cpp: SimpleSelfAttention
// (attn/attention/simple_self_attention.hpp) against the long double reference.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "attention/module_test_support.hpp"
#include "attn/attn.hpp"
#include "support/scalar_types.hpp"
#include "support/test_support.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace simple_self_attention_test {

namespace {

using attn::Index;
using attn::Shape;
using attn::test::inv_sqrt;
namespace ref = attn::test::ref;

template <class Scalar>
class SimpleSelfAttentionModule : public ::testing::Test {};
TYPED_TEST_SUITE(SimpleSelfAttentionModule, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

TYPED_TEST(SimpleSelfAttentionModule, SimpleSelfAttentionIsUnscaledByDefault) {
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

TYPED_TEST(SimpleSelfAttentionModule, SimpleSelfAttentionScaledDividesBySqrtD) {
  using Scalar = TypeParam;
  const Index b = 2, t = 70, d = 8;
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{b, t, d}, 2);
  const attn::SimpleSelfAttention<Scalar> simple(/*scaled=*/true);
  const auto x4 = attn::unsqueeze(x.view(), 1);
  const auto expected = ref::attention(x4, x4, x4, ref::DenseMask(b, 1, t, t), inv_sqrt(d));
  EXPECT_TRUE(ref::all_near(simple.forward(x).view(), attn::select(expected.output.view(), 1, 0),
                            ref::kernel_tolerance<Scalar>(d, t)));
}

// forward(x, x, ws): q = k = v = x, so out over x overwrote keys and values that later
// query tiles (T > 64) still read (error 0.15 before). x is copied first now.
TYPED_TEST(SimpleSelfAttentionModule, ForwardInPlaceEqualsOutOfPlace) {
  using Scalar = TypeParam;
  const attn::SimpleSelfAttention<Scalar> simple(true);
  auto x = attn::test::random_tensor<Scalar>(Shape<3>{2, 130, 4}, 3);
  const auto expected = simple.forward(x.view());
  attn::Workspace ws;
  simple.forward(x.view(), x.view(), ws);
  EXPECT_TRUE(ref::same_bits(x.view(), expected.view()));
  // and with weights
  x = attn::test::random_tensor<Scalar>(Shape<3>{2, 130, 4}, 3);
  const auto r = simple.forward_with_weights(x.view());
  attn::Tensor<Scalar, 3> weights({2, 130, 130});
  simple.forward_with_weights(x.view(), x.view(), weights.view(), ws);
  EXPECT_TRUE(ref::same_bits(x.view(), r.output.view()));
  EXPECT_TRUE(ref::same_bits(weights.view(), r.weights.view()));
}

}  // namespace

}  // namespace simple_self_attention_test

#include "support/bodies_end.hpp"
