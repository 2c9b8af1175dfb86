// SPDX-License-Identifier: MIT
// tests/nn/mask_test.cpp: AttentionMask parts, broadcasting and check() messages, and the
// notebooks' helpers causal_blocked_mask, causal_additive_mask and masked_fill.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "attn/attn.hpp"
#include "support/scalar_types.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace mask_test {

namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using attn::AttentionMask;
using attn::CausalAlignment;
using attn::Index;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;

constexpr const char* kWhere = "MultiHeadAttention::forward";

// ---- AttentionMask: parts ----

TEST(AttentionMask, DefaultIsEmpty) {
  const AttentionMask<float> mask;
  EXPECT_TRUE(mask.empty());
  EXPECT_FALSE(mask.is_causal());
  EXPECT_EQ(mask.bool_mask().data(), nullptr);
  EXPECT_EQ(mask.additive_mask().data(), nullptr);
  EXPECT_FALSE(mask.has_key_lengths());
  EXPECT_FALSE(mask.has_key_padding());
  EXPECT_NO_THROW(mask.check(kWhere, 2, 3, 4, 5));
}

TEST(AttentionMask, CausalRecordsItsAlignment) {
  AttentionMask<float> mask;
  mask.causal();
  EXPECT_TRUE(mask.is_causal());
  EXPECT_FALSE(mask.empty());
  EXPECT_EQ(mask.alignment(), CausalAlignment::kSquare);
  mask.causal(CausalAlignment::kBottomRight);
  EXPECT_EQ(mask.alignment(), CausalAlignment::kBottomRight);
}

TEST(AttentionMask, TwoDimensionalBooleanMaskBroadcastsOverBatchAndHeads) {
  const Tensor<bool, 2> m({4, 5});
  AttentionMask<float> allowed;
  allowed.allowed(m);
  EXPECT_TRUE(allowed.bool_allows());
  EXPECT_EQ(allowed.bool_mask().data(), m.data());  // a view, not a copy
  EXPECT_THAT(allowed.bool_mask().shape(), ElementsAre(1, 1, 4, 5));
  EXPECT_THAT(allowed.bool_mask().strides(), ElementsAre(0, 0, 5, 1));

  AttentionMask<float> blocked;
  blocked.blocked(m.view());
  EXPECT_FALSE(blocked.bool_allows());
  EXPECT_FALSE(blocked.empty());
}

TEST(AttentionMask, ThreeAndFourDimensionalMasksKeepBatchAndHeads) {
  const Tensor<bool, 3> per_batch({2, 4, 5});
  AttentionMask<float> a;
  a.blocked(per_batch);
  EXPECT_THAT(a.bool_mask().shape(), ElementsAre(2, 1, 4, 5));
  EXPECT_THAT(a.bool_mask().strides(), ElementsAre(20, 0, 5, 1));

  const Tensor<float, 4> full({2, 3, 4, 5});
  AttentionMask<float> b;
  b.additive(full);
  EXPECT_THAT(b.additive_mask().shape(), ElementsAre(2, 3, 4, 5));
  EXPECT_THAT(b.additive_mask().strides(), ElementsAre(60, 20, 5, 1));

  // An extent-1 batch or head axis broadcasts (stride 0).
  const Tensor<double, 4> one_batch({1, 3, 4, 5});
  AttentionMask<double> c;
  c.additive(one_batch);
  EXPECT_THAT(c.additive_mask().strides(), ElementsAre(0, 20, 5, 1));
  EXPECT_NO_THROW(c.check(kWhere, 7, 3, 4, 5));
}

TEST(AttentionMask, StridedMaskViewsKeepTheirStrides) {
  const Tensor<bool, 2> storage({5, 4});
  AttentionMask<float> mask;
  mask.allowed(attn::transpose(storage.view()));  // (4, 5), strides (1, 4)
  EXPECT_THAT(mask.bool_mask().shape(), ElementsAre(1, 1, 4, 5));
  EXPECT_THAT(mask.bool_mask().strides(), ElementsAre(0, 0, 1, 4));
}

TEST(AttentionMask, KeyLengthsAndPadding) {
  AttentionMask<float> mask;
  mask.key_lengths({3, 5});
  EXPECT_TRUE(mask.has_key_lengths());
  EXPECT_THAT(mask.lengths(), ElementsAre(3, 5));
  EXPECT_THAT(attn::test::thrown<std::invalid_argument>([] {
                AttentionMask<float>().key_lengths({2, -1});
              }),
              HasSubstr("length -1 of batch item 1"));

  const Tensor<bool, 2> padding({2, 5});
  mask.key_padding(padding);
  EXPECT_TRUE(mask.has_key_padding());
  EXPECT_THAT(mask.padding_mask().shape(), ElementsAre(2, 1, 1, 5));
  EXPECT_THAT(mask.padding_mask().strides(), ElementsAre(5, 0, 0, 1));
  EXPECT_NO_THROW(mask.check(kWhere, 2, 4, 3, 5));
}

// ---- AttentionMask::check ----

TEST(AttentionMask, CheckNamesThePartAndBothShapes) {
  const Tensor<bool, 2> m({4, 5});
  AttentionMask<float> mask;
  mask.blocked(m);
  EXPECT_NO_THROW(mask.check(kWhere, 2, 3, 4, 5));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { mask.check(kWhere, 2, 3, 4, 4); }),
              AllOf(HasSubstr("attn::MultiHeadAttention::forward"), HasSubstr("blocked"),
                    HasSubstr("(1, 1, 4, 5)"), HasSubstr("(2, 3, 4, 4)")));
  AttentionMask<float> allowed;
  allowed.allowed(m);
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { allowed.check(kWhere, 1, 1, 5, 5); }),
              AllOf(HasSubstr("allowed"), HasSubstr("(1, 1, 4, 5)"), HasSubstr("(1, 1, 5, 5)")));
}

TEST(AttentionMask, CheckRejectsABatchThatDoesNotBroadcast) {
  const Tensor<float, 3> m({3, 4, 4});
  AttentionMask<float> mask;
  mask.additive(m);
  EXPECT_NO_THROW(mask.check(kWhere, 3, 8, 4, 4));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { mask.check(kWhere, 2, 8, 4, 4); }),
              AllOf(HasSubstr("additive"), HasSubstr("(3, 1, 4, 4)"), HasSubstr("(2, 8, 4, 4)")));
  const Tensor<float, 4> heads({1, 2, 4, 4});
  AttentionMask<float> per_head;
  per_head.additive(heads);
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { per_head.check(kWhere, 1, 3, 4, 4); }),
              AllOf(HasSubstr("(1, 2, 4, 4)"), HasSubstr("(1, 3, 4, 4)")));
}

TEST(AttentionMask, CheckKeyPaddingAndLengths) {
  const Tensor<bool, 2> padding({2, 5});
  AttentionMask<float> mask;
  mask.key_padding(padding);
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { mask.check(kWhere, 2, 1, 4, 4); }),
              AllOf(HasSubstr("key_padding"), HasSubstr("(2, 5)"), HasSubstr("(2, 4)")));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { mask.check(kWhere, 3, 1, 4, 5); }),
              AllOf(HasSubstr("(2, 5)"), HasSubstr("(3, 5)")));

  AttentionMask<float> lengths;
  lengths.key_lengths({3, 6});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { lengths.check(kWhere, 3, 1, 4, 6); }),
              AllOf(HasSubstr("2 entries"), HasSubstr("B=3")));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { lengths.check(kWhere, 2, 1, 4, 4); }),
              HasSubstr("key_lengths[1]=6 exceeds T_k=4"));
  EXPECT_NO_THROW(lengths.check(kWhere, 2, 1, 4, 6));
}

TEST(AttentionMask, SquareCausalNeedsEqualLengths) {
  AttentionMask<float> mask;
  mask.causal();
  EXPECT_NO_THROW(mask.check(kWhere, 1, 1, 6, 6));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { mask.check(kWhere, 1, 1, 2, 6); }),
              AllOf(HasSubstr("T_q=2"), HasSubstr("T_k=6"), HasSubstr("kTopLeft"),
                    HasSubstr("kBottomRight")));
  mask.causal(CausalAlignment::kTopLeft);
  EXPECT_NO_THROW(mask.check(kWhere, 1, 1, 2, 6));
  mask.causal(CausalAlignment::kBottomRight);
  EXPECT_NO_THROW(mask.check(kWhere, 1, 1, 2, 6));
}

// An empty mask used to be silently ignored (its null data read as "no mask"): a (0, 0)
// boolean or (0, 5, 5) additive mask then masked nothing. No empty shape broadcasts to an
// attention's (B, H, T_q, T_k), so each is a ShapeError when it is added.
TEST(AttentionMask, EmptyMasksAreShapeErrors) {
  const Tensor<bool, 2> none({0, 0});
  EXPECT_THAT(
      attn::test::thrown<attn::ShapeError>([&] { AttentionMask<float>().allowed(none.view()); }),
      AllOf(HasSubstr("attn::AttentionMask::allowed: mask has shape (0, 0)"),
            HasSubstr("needs every extent positive")));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { AttentionMask<float>().blocked(none); }),
              HasSubstr("AttentionMask::blocked"));
  const Tensor<float, 3> additive({0, 5, 5});
  EXPECT_THAT(
      attn::test::thrown<attn::ShapeError>([&] { AttentionMask<float>().additive(additive); }),
      HasSubstr("mask has shape (0, 5, 5)"));
  const Tensor<bool, 4> no_head({2, 0, 5, 5});
  EXPECT_THAT(
      attn::test::thrown<attn::ShapeError>([&] { AttentionMask<float>().allowed(no_head); }),
      HasSubstr("(2, 0, 5, 5)"));
  const Tensor<bool, 2> padding({2, 0});
  EXPECT_THAT(
      attn::test::thrown<attn::ShapeError>([&] { AttentionMask<float>().key_padding(padding); }),
      HasSubstr("attn::AttentionMask::key_padding: mask has shape (2, 0)"));
  const Tensor<bool, 2> one({1, 1}, true);  // one element: a mask (check() judges its fit)
  EXPECT_NO_THROW(AttentionMask<float>().allowed(one));
}

// ---- notebook helpers ----

TEST(CausalBlockedMask, IsTriuWithDiagonalOne) {
  // /usr/bin/python3 -c "import torch; print(torch.triu(torch.ones(3, 5),
  // diagonal=1).bool().int().tolist())"
  const auto wide = attn::causal_blocked_mask(3, 5);
  EXPECT_THAT(wide.shape(), ElementsAre(3, 5));
  EXPECT_THAT(wide.to_vector(), ElementsAre(0, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1));
  // /usr/bin/python3 -c "import torch; print(torch.triu(torch.ones(5, 3),
  // diagonal=1).bool().int().tolist())"
  const auto tall = attn::causal_blocked_mask(5, 3);
  EXPECT_THAT(tall.to_vector(), ElementsAre(0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0));
  const auto square = attn::causal_blocked_mask(6);
  for (Index i = 0; i < 6; ++i) {
    for (Index j = 0; j < 6; ++j) EXPECT_EQ(square(i, j), j > i) << i << "," << j;
  }
}

template <class Scalar>
class MaskHelpersTest : public ::testing::Test {};
TYPED_TEST_SUITE(MaskHelpersTest, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

TYPED_TEST(MaskHelpersTest, CausalAdditiveMaskIsZeroOnAndBelowTheDiagonal) {
  // /usr/bin/python3 -c "import torch; print(torch.triu(torch.full((3, 3), float('-inf')),
  // diagonal=1).tolist())"
  const TypeParam inf = std::numeric_limits<TypeParam>::infinity();
  const auto mask = attn::causal_additive_mask<TypeParam>(3);
  EXPECT_THAT(mask.to_vector(), ElementsAre(0, -inf, -inf, 0, 0, -inf, 0, 0, 0));
}

TYPED_TEST(MaskHelpersTest, MaskedFillReplacesTrueEntries) {
  const Tensor<TypeParam, 2> x({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor<bool, 2> m({2, 3});
  m(0, 1) = true;
  m(1, 2) = true;
  const auto y = attn::masked_fill(x.view(), TensorView<const bool, 2>(m.view()), TypeParam(-9));
  EXPECT_THAT(y.to_vector(), ElementsAre(1, -9, 3, 4, 5, -9));
  EXPECT_THAT(x.to_vector(), ElementsAre(1, 2, 3, 4, 5, 6));  // input untouched
}

TYPED_TEST(MaskHelpersTest, MaskedFillWithStridedInputs) {
  const Tensor<TypeParam, 2> storage({3, 2}, {1, 4, 2, 5, 3, 6});
  const auto x = attn::transpose(storage.view());  // [[1, 2, 3], [4, 5, 6]]
  Tensor<bool, 2> m_storage({3, 2});
  m_storage(1, 0) = true;  // transposed: (0, 1)
  m_storage(2, 1) = true;  // transposed: (1, 2)
  const auto y = attn::masked_fill(x, attn::transpose(TensorView<const bool, 2>(m_storage.view())),
                                   TypeParam(0));
  EXPECT_THAT(y.to_vector(), ElementsAre(1, 0, 3, 4, 5, 0));
}

TYPED_TEST(MaskHelpersTest, MaskedFillRejectsShapeMismatchNamingBoth) {
  const Tensor<TypeParam, 2> x({2, 6});
  const Tensor<bool, 2> m({6, 2});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>(
                  [&] { attn::masked_fill(x.view(), m.view(), TypeParam(0)); }),
              AllOf(HasSubstr("masked_fill"), HasSubstr("(2, 6)"), HasSubstr("(6, 2)")));
}

TYPED_TEST(MaskHelpersTest, NotebookCausalWeightsFromMaskedFillAndSoftmax) {
  // scores.masked_fill(mask.bool(), -inf) -> softmax: row i spreads over keys 0..i only.
  const TypeParam inf = std::numeric_limits<TypeParam>::infinity();
  const auto scores = attn::test::random_tensor<TypeParam, 2>({6, 6}, 17);
  const auto blocked = attn::causal_blocked_mask(6);
  const auto weights = attn::softmax(attn::masked_fill(scores.view(), blocked.view(), -inf));
  // The additive form gives the same weights.
  Tensor<TypeParam, 2> added = scores;
  const auto additive = attn::causal_additive_mask<TypeParam>(6);
  attn::as_matrix(added) += attn::as_matrix(additive);
  const auto weights2 = attn::softmax(added);
  for (Index i = 0; i < 6; ++i) {
    double sum = 0;
    for (Index j = 0; j < 6; ++j) {
      if (j > i) {
        EXPECT_EQ(weights(i, j), TypeParam(0));
      } else {
        EXPECT_GT(weights(i, j), TypeParam(0));
      }
      EXPECT_EQ(weights(i, j), weights2(i, j));
      sum += double(weights(i, j));
    }
    EXPECT_NEAR(sum, 1.0, attn::test::reduction_tolerance<TypeParam>(6));
  }
  EXPECT_EQ(weights(0, 0), TypeParam(1));
}

}  // namespace

}  // namespace mask_test

#include "support/bodies_end.hpp"
