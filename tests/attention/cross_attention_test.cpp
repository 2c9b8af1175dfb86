// SPDX-License-Identifier: MIT
// tests/attention/cross_attention_test.cpp: CrossAttention (attn/attention/cross_attention.hpp)
// against the long double reference.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "attention/module_test_support.hpp"
#include "attn/attn.hpp"
#include "support/scalar_types.hpp"
#include "support/test_support.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace cross_attention_test {

namespace {

using attn::Index;
using attn::Shape;
using attn::Tensor;
using attn::test::inv_sqrt;
using attn::test::module_tolerance;
using attn::test::wide;
namespace ref = attn::test::ref;

template <class Scalar>
class CrossAttentionModule : public ::testing::Test {};
TYPED_TEST_SUITE(CrossAttentionModule, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

TYPED_TEST(CrossAttentionModule, CrossAttentionMatchesReference) {
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

}  // namespace

}  // namespace cross_attention_test

#include "support/bodies_end.hpp"
