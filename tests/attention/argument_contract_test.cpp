// SPDX-License-Identifier: MIT
// tests/attention/argument_contract_test.cpp: the public entry points around the modules that
// take an index, a size or a view of their own records check it, with an attn::Error naming
// the value, instead of reading out of bounds or returning a wrong answer:
//  - the size arithmetic helpers (detail/checked.hpp, the one place sizes are checked);
//  - a module configuration whose projection widths overflow;
//  - MultiHeadAttentionWrapper::head(h) (once std::vector::at's std::out_of_range, not an
//    attn::Error), QkvProjection's projection index, RotaryEmbedding's table rows;
//  - a training forward given a view of its own record (saved.context) as input or output,
//    and a training forward that throws, which leaves the record empty.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <utility>

#include "attn/attn.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace argument_contract_test {

namespace {

using attn::Index;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
using ::testing::HasSubstr;

constexpr Index kMax = std::numeric_limits<Index>::max();

TEST(ArgumentContract, CheckedArithmeticSaysWhenItOverflows) {
  Index out = 0;
  EXPECT_TRUE(attn::detail::checked_add(kMax - 1, Index(1), out));
  EXPECT_EQ(out, kMax);
  EXPECT_FALSE(attn::detail::checked_add(kMax, Index(1), out));
  EXPECT_FALSE(attn::detail::checked_add(-kMax, Index(-2), out));
  EXPECT_TRUE(attn::detail::checked_sum(out, Index(3), Index(4), Index(-1)));
  EXPECT_EQ(out, 6);
  EXPECT_FALSE(attn::detail::checked_sum(out, kMax / 2 + 1, kMax / 2 + 1, Index(-1)));
  EXPECT_TRUE(attn::detail::checked_product(out, Index(3), Index(4), Index(5)));
  EXPECT_EQ(out, 60);
  EXPECT_FALSE(attn::detail::checked_product(out, Index(1) << 32, Index(1) << 31));
  std::size_t bytes = 0;
  EXPECT_FALSE(attn::detail::checked_bytes(std::size_t(1) << 62, 4, bytes));
}

TEST(ArgumentContract, ProjectionWidthsThatOverflowAreAConfigError) {
  attn::MultiHeadAttentionOptions o;
  o.d_in = 8;
  o.d_out = 8;
  o.num_heads = Index(1) << 32;
  o.head_dim = Index(1) << 32;
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>([&] { attn::MultiHeadAttention<float>{o}; }),
              HasSubstr("widths overflow"));
  o.num_heads = 2;
  o.num_kv_heads = 0;
  o.head_dim = kMax / 3;  // H hd fits, (H + 2 H_kv) hd does not
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>([&] { attn::MultiHeadAttention<float>{o}; }),
              HasSubstr("widths overflow"));
}

TEST(ArgumentContract, IndicesOfHeadsProjectionsAndTableRowsAreChecked) {
  attn::manual_seed(1);
  attn::MultiHeadAttentionWrapper<float> wrapper(4, 2, 8, 0.0, 2);
  EXPECT_NO_THROW(wrapper.head(1));
  EXPECT_THAT(attn::test::thrown<attn::IndexError>([&] { wrapper.head(2); }), HasSubstr("head 2"));
  EXPECT_THROW(std::as_const(wrapper).head(-1), attn::IndexError);
  attn::QkvProjection<float> proj(4, 4, 4, 2, 2, true);
  EXPECT_EQ(proj.width(attn::QkvProjection<float>::kValue), 4);
  EXPECT_THAT(attn::test::thrown<attn::IndexError>([&] { (void)proj.weight(3); }),
              HasSubstr("projection 3"));
  EXPECT_THROW((void)proj.bias(-1), attn::IndexError);
  EXPECT_THROW((void)proj.width(5), attn::IndexError);
  EXPECT_THROW((void)std::as_const(proj).in_features(3), attn::IndexError);
  const attn::RotaryEmbedding<float> rope(8, 16);
  EXPECT_NO_THROW((void)rope.cos_row(15));
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>([&] { (void)rope.cos_row(16); }),
              HasSubstr("position 16"));
  EXPECT_THROW((void)rope.sin_row(-1), attn::ConfigError);
}

TEST(ArgumentContract, ATrainingForwardRefusesViewsOfItsOwnRecord) {
  attn::manual_seed(2);
  const attn::MultiHeadAttention<float> m(6, 6, 8, 0.0, 2);
  const auto x = attn::test::random_tensor<float>(Shape<3>{2, 4, 6}, 1);
  Tensor<float, 3> out({2, 4, 6});
  attn::Workspace ws;
  attn::SavedForward<float> saved;
  m.forward(x.view(), out.view(), saved, ws);
  // The context the record keeps, fed back as the next step's input (or written as its
  // output) with the same record: the forward would overwrite what it reads.
  const TensorView<const float, 3> context = saved.context;
  EXPECT_THAT(
      attn::test::thrown<attn::ShapeError>([&] { m.forward(context, out.view(), saved, ws); }),
      HasSubstr("buffers of `saved`"));
  const TensorView<float, 3> inside(const_cast<float*>(context.data()), context.shape());
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { m.forward(x.view(), inside, saved, ws); }),
              HasSubstr("out"));
  // Copied first, it is an input like any other.
  const Tensor<float, 3> copy(context);
  attn::SavedForward<float> other;
  EXPECT_NO_THROW(m.forward(copy.view(), out.view(), other, ws));
}

TEST(ArgumentContract, ATrainingForwardThatThrowsLeavesTheRecordEmpty) {
  attn::manual_seed(3);
  const attn::MultiHeadAttention<float> m(6, 6, 4, 0.0, 2);  // context_length 4
  const auto x = attn::test::random_tensor<float>(Shape<3>{1, 4, 6}, 1);
  const auto longer = attn::test::random_tensor<float>(Shape<3>{1, 5, 6}, 2);
  Tensor<float, 3> out({1, 4, 6}), out5({1, 5, 6}), gx({1, 4, 6});
  attn::Workspace ws;
  attn::SavedForward<float> saved;
  m.forward(x.view(), out.view(), saved, ws);
  EXPECT_TRUE(saved.filled());
  EXPECT_THROW(m.forward(longer.view(), out5.view(), saved, ws), attn::ConfigError);
  EXPECT_FALSE(saved.filled());
  attn::Gradients<float> grads(m.named_parameters());
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>(
                  [&] { m.backward(out.view(), saved, gx.view(), grads, ws); }),
              HasSubstr("`saved` is empty"));
}

}  // namespace

}  // namespace argument_contract_test

#include "support/bodies_end.hpp"
