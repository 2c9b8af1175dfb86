// SPDX-License-Identifier: MIT
// tests/attention/multi_head_attention_wrapper_test.cpp: MultiHeadAttentionWrapper
// (attn/attention/multi_head_attention_wrapper.hpp): the concatenation of its heads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "attention/module_test_support.hpp"
#include "attn/attn.hpp"
#include "support/scalar_types.hpp"
#include "support/test_support.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace multi_head_attention_wrapper_test {

namespace {

using attn::CausalAlignment;
using attn::Index;
using attn::Shape;
using attn::test::inv_sqrt;
using attn::test::module_tolerance;
using attn::test::wide;
namespace ref = attn::test::ref;

template <class Scalar>
class MultiHeadAttentionWrapperModule : public ::testing::Test {};
TYPED_TEST_SUITE(MultiHeadAttentionWrapperModule, attn::test::ScalarTypes,
                 attn::test::ScalarTypeNames);

TYPED_TEST(MultiHeadAttentionWrapperModule, WrapperEqualsConcatenationOfItsHeads) {
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

// forward(x, x, ws) with d_in = num_heads * d_out: head 1 used to read x after head 0 had
// written its slice of it (error 0.22). The input is copied first now.
TYPED_TEST(MultiHeadAttentionWrapperModule, ForwardInPlaceEqualsOutOfPlace) {
  using Scalar = TypeParam;
  attn::manual_seed(7);
  const attn::MultiHeadAttentionWrapper<Scalar> wrapper(4, 2, 6, 0.0, 2);
  auto x = attn::test::random_tensor<Scalar>(Shape<3>{2, 6, 4}, 15);
  const auto expected = wrapper.forward(x.view());
  attn::Workspace ws;
  wrapper.forward(x.view(), x.view(), ws);
  EXPECT_TRUE(ref::same_bits(x.view(), expected.view()));
}

}  // namespace

}  // namespace multi_head_attention_wrapper_test

#include "support/bodies_end.hpp"
