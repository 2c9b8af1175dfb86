// SPDX-License-Identifier: MIT
// tests/attention/causal_attention_test.cpp: CausalAttention (attn/attention/causal_attention.hpp)
// against the causal reference, alone and with a user mask.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "attention/module_test_support.hpp"
#include "attn/attn.hpp"
#include "support/scalar_types.hpp"
#include "support/test_support.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace causal_attention_test {

namespace {

using attn::AttentionMask;
using attn::CausalAlignment;
using attn::Index;
using attn::Shape;
using attn::Tensor;
using attn::test::inv_sqrt;
using attn::test::module_tolerance;
using attn::test::wide;
namespace ref = attn::test::ref;

template <class Scalar>
class CausalAttentionModule : public ::testing::Test {};
TYPED_TEST_SUITE(CausalAttentionModule, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

TYPED_TEST(CausalAttentionModule, CausalAttentionMatchesCausalReference) {
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

TYPED_TEST(CausalAttentionModule, CausalAttentionCombinesAUserMask) {
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

}  // namespace

}  // namespace causal_attention_test

#include "support/bodies_end.hpp"
