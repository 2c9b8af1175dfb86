// SPDX-License-Identifier: MIT
// tests/nn/dropout_test.cpp: inverted dropout (identity at p = 0 and in eval mode, the exact
// 1/(1-p) scale, the keep rate, determinism per seed, invalid p) and its backward (the
// forward's keep decisions from its record, finite differences, accumulation, shapes).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "attn/attn.hpp"
#include "support/finite_difference.hpp"
#include "support/scalar_types.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace dropout_test {

namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using attn::Dropout;
using attn::Index;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;

template <class Scalar>
class DropoutTest : public ::testing::Test {};
TYPED_TEST_SUITE(DropoutTest, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

template <class Scalar, std::size_t Rank>
Index count_zeros(const Tensor<Scalar, Rank>& t) {
  Index zeros = 0;
  for (const Scalar v : t.to_vector()) zeros += (v == Scalar(0));
  return zeros;
}

TYPED_TEST(DropoutTest, StartsInTrainingMode) {
  Dropout<TypeParam> d(0.25);
  EXPECT_EQ(d.p(), 0.25);
  EXPECT_TRUE(d.is_training());
  EXPECT_TRUE(d.active());
  d.eval();
  EXPECT_FALSE(d.is_training());
  EXPECT_FALSE(d.active());
  d.train();
  EXPECT_TRUE(d.active());
  d.train(false);
  EXPECT_FALSE(d.is_training());
  EXPECT_FALSE(Dropout<TypeParam>(0.0).active());
}

TYPED_TEST(DropoutTest, ZeroProbabilityIsIdentityInTraining) {
  const Dropout<TypeParam> d(0.0);
  const auto x = attn::test::random_tensor<TypeParam, 3>({2, 6, 7}, 1);
  EXPECT_EQ(d.forward(x).to_vector(), x.to_vector());
}

TYPED_TEST(DropoutTest, EvalModeIsIdentity) {
  Dropout<TypeParam> d(0.5);
  d.eval();
  const auto x = attn::test::random_tensor<TypeParam, 2>({64, 64}, 2);
  EXPECT_EQ(d.forward(x).to_vector(), x.to_vector());
  auto y = x;
  d.forward_(y.view());
  EXPECT_EQ(y.to_vector(), x.to_vector());
}

TYPED_TEST(DropoutTest, KeptEntriesAreScaledByExactlyOneOverOneMinusP) {
  // 1/(1-p) is exact in binary for these p, so the kept values are exactly x * scale.
  for (const double p : {0.5, 0.2, 0.75}) {
    const Dropout<TypeParam> d(p, 99);
    const TypeParam scale = TypeParam(1.0 / (1.0 - p));
    const auto x = attn::test::random_tensor<TypeParam, 2>({32, 32}, 3, 0.5, 1.5);  // no zeros
    const auto y = d.forward(x);
    Index kept = 0;
    for (Index i = 0; i < x.size(); ++i) {
      const TypeParam v = y.data()[i];
      if (v != TypeParam(0)) {
        EXPECT_EQ(v, x.data()[i] * scale) << "p=" << p << " i=" << i;
        ++kept;
      }
    }
    EXPECT_GT(kept, 0) << "p=" << p;
    EXPECT_LT(kept, x.size()) << "p=" << p;
  }
  // A p whose scale is not exact: the kept values are x * (1 / (1 - p)) rounded once.
  const Dropout<TypeParam> d(0.1, 5);
  const Tensor<TypeParam, 1> ones({256}, TypeParam(1));
  const auto y = d.forward(ones);
  for (const TypeParam v : y.to_vector()) {
    if (v != TypeParam(0)) {
      EXPECT_EQ(v, TypeParam(1) / TypeParam(0.9));
    }
  }
}

TYPED_TEST(DropoutTest, KeepRateIsWithinABinomialBound) {
  // n Bernoulli(1 - p) draws: |kept - n (1 - p)| <= 6 sqrt(n p (1 - p)) fails with
  // probability ~2e-9 for a fair coin; the seed is fixed anyway.
  for (const double p : {0.1, 0.5, 0.9}) {
    const Dropout<TypeParam> d(p, 1234);
    const Tensor<TypeParam, 3> ones({8, 250, 500}, TypeParam(1));
    const auto y = d.forward(ones);
    const double n = double(ones.size());
    const double kept = n - double(count_zeros(y));
    EXPECT_NEAR(kept, n * (1 - p), 6 * std::sqrt(n * p * (1 - p))) << "p=" << p;
    // Each column, across all rows, keeps at the same rate (the hash mixes the column in).
    for (const Index col : {0, 1, 499}) {
      double col_kept = 0;
      for (Index b = 0; b < 8; ++b) {
        for (Index r = 0; r < 250; ++r) col_kept += (y(b, r, col) != TypeParam(0));
      }
      EXPECT_NEAR(col_kept, 2000 * (1 - p), 6 * std::sqrt(2000 * p * (1 - p)))
          << "p=" << p << " column " << col;
    }
  }
}

TYPED_TEST(DropoutTest, SameSeedGivesTheSameMask) {
  const Dropout<TypeParam> a(0.5, 42), b(0.5, 42), c(0.5, 43);
  const Tensor<TypeParam, 2> ones({16, 16}, TypeParam(1));
  const auto ya = a.forward(ones);
  EXPECT_EQ(ya.to_vector(), b.forward(ones).to_vector());
  EXPECT_NE(ya.to_vector(), c.forward(ones).to_vector());
}

TYPED_TEST(DropoutTest, SuccessiveCallsDrawNewMasks) {
  const Dropout<TypeParam> d(0.5, 42);
  const Tensor<TypeParam, 2> ones({16, 16}, TypeParam(1));
  const auto first = d.forward(ones);
  const auto second = d.forward(ones);
  EXPECT_NE(first.to_vector(), second.to_vector());
}

TYPED_TEST(DropoutTest, RowsDrawDifferentMasks) {
  const Dropout<TypeParam> d(0.5, 42);
  const Tensor<TypeParam, 2> ones({4, 64}, TypeParam(1));
  const auto y = d.forward(ones);
  EXPECT_NE(attn::test::row(y, 0), attn::test::row(y, 1));
  EXPECT_NE(attn::test::row(y, 1), attn::test::row(y, 2));
}

TYPED_TEST(DropoutTest, SeedRestartsTheStream) {
  Dropout<TypeParam> d(0.3);
  const Tensor<TypeParam, 2> ones({16, 16}, TypeParam(1));
  d.seed(7);
  EXPECT_EQ(d.seed_value(), 7u);
  const auto a1 = d.forward(ones);
  const auto a2 = d.forward(ones);
  d.seed(7);
  EXPECT_EQ(d.forward(ones).to_vector(), a1.to_vector());
  EXPECT_EQ(d.forward(ones).to_vector(), a2.to_vector());
  // A copy continues from the same point of the stream.
  const Dropout<TypeParam> copy = d;
  EXPECT_EQ(copy.forward(ones).to_vector(), d.forward(ones).to_vector());
}

TYPED_TEST(DropoutTest, MaskDependsOnPositionNotMemoryLayout) {
  // The same logical (rows, cols) values in a transposed view and in a contiguous tensor get
  // the same keep decisions from the same seed and call number.
  const auto base = attn::test::random_tensor<TypeParam, 2>({12, 10}, 4, 0.5, 1.5);
  Tensor<TypeParam, 2> storage({10, 12});
  attn::copy(attn::transpose(base.view()), storage.view());  // storage^T == base
  const Dropout<TypeParam> a(0.5, 8), b(0.5, 8);
  const auto strided = attn::transpose(storage.view());
  a.forward_(strided);
  const auto dense = b.forward(base);
  EXPECT_LE(attn::test::max_abs_diff(TensorView<const TypeParam, 2>(strided), dense.view()), 0.0);
}

TYPED_TEST(DropoutTest, InPlaceOnAStridedViewTouchesOnlyTheView) {
  Tensor<TypeParam, 2> x({8, 8}, TypeParam(1));
  const Dropout<TypeParam> d(0.5, 3);
  d.forward_(attn::slice(x.view(), 1, 2, 6));
  Index changed = 0;
  for (Index i = 0; i < 8; ++i) {
    for (Index j = 0; j < 8; ++j) {
      if (j < 2 || j >= 6) {
        EXPECT_EQ(x(i, j), TypeParam(1));
      } else {
        EXPECT_TRUE(x(i, j) == TypeParam(0) || x(i, j) == TypeParam(2)) << x(i, j);
        changed += x(i, j) == TypeParam(0);
      }
    }
  }
  EXPECT_GT(changed, 0);
}

TYPED_TEST(DropoutTest, ForwardLeavesItsInputAlone) {
  const Dropout<TypeParam> d(0.5, 3);
  const Tensor<TypeParam, 2> ones({8, 8}, TypeParam(1));
  const auto y = d.forward(ones);
  EXPECT_EQ(ones.to_vector(), std::vector<TypeParam>(64, TypeParam(1)));
  EXPECT_GT(count_zeros(y), 0);
}

TYPED_TEST(DropoutTest, ProbabilityOutsideZeroOneThrowsNamingTheValue) {
  using D = Dropout<TypeParam>;
  EXPECT_THAT(attn::test::thrown<std::invalid_argument>([] { D d(1.0); }),
              AllOf(HasSubstr("dropout=1 "), HasSubstr("[0, 1)")));
  EXPECT_THAT(attn::test::thrown<std::invalid_argument>([] { D d(-0.1); }),
              HasSubstr("dropout=-0.1 "));
  EXPECT_THAT(attn::test::thrown<std::invalid_argument>([] { D d(1.5); }),
              HasSubstr("dropout=1.5 "));
  EXPECT_THAT(attn::test::thrown<std::invalid_argument>(
                  [] { D d(std::numeric_limits<double>::quiet_NaN()); }),
              HasSubstr("dropout=nan"));
  EXPECT_NO_THROW(D(0.0));
  EXPECT_NO_THROW(D(0.999));
}

// ---------------------------------------------------------------- backward

TYPED_TEST(DropoutTest, BackwardRedrawsTheForwardsKeepDecisions) {
  using Scalar = TypeParam;
  Dropout<Scalar> d(0.4, 21);
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{3, 5, 7}, 1, 0.5, 2.0);  // no zeros
  Tensor<Scalar, 3> y = x;
  const attn::DropoutRecord record = d.forward_(y.view());
  EXPECT_TRUE(record.active);
  EXPECT_EQ(record.seed, 21u);
  EXPECT_EQ(record.call, 0u);
  d.forward(x.view());  // later calls and a new seed do not change what backward redraws
  d.seed(99);
  Tensor<Scalar, 3> grad({3, 5, 7});
  const Tensor<Scalar, 3> ones({3, 5, 7}, Scalar(1));
  d.backward(record, ones.view(), grad.view());
  const Scalar scale = Scalar(1) / static_cast<Scalar>(1.0 - 0.4);
  Index dropped = 0;
  for (Index i = 0; i < x.size(); ++i) {
    if (y.data()[i] == Scalar(0)) {
      ++dropped;
      EXPECT_EQ(grad.data()[i], Scalar(0)) << i;
    } else {
      EXPECT_EQ(grad.data()[i], scale) << i;
      EXPECT_EQ(y.data()[i], x.data()[i] * grad.data()[i]) << i;  // y = x * (d y / d x)
    }
  }
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, x.size());
  // Strided views of the same shape see the same decisions (they depend on the index only).
  Tensor<Scalar, 3> storage({7, 5, 3});
  const auto grad_t = attn::transpose(storage.view(), 0, 2);
  d.backward(record, ones.view(), grad_t);
  EXPECT_EQ(attn::test::to_vector(grad_t), grad.to_vector());
}

TEST(DropoutBackward, MatchesFiniteDifferences) {
  Dropout<double> d(0.3, 8);
  auto x = attn::test::random_tensor<double>(Shape<2>{6, 9}, 2);
  const auto w = attn::test::random_tensor<double>(Shape<2>{6, 9}, 3);
  Tensor<double, 2> y = x;
  d.seed(8);
  const attn::DropoutRecord record = d.forward_(y.view());
  Tensor<double, 2> grad({6, 9});
  d.backward(record, w.view(), grad.view());
  const auto loss = [&] {
    Tensor<double, 2> again = x;
    d.seed(8);  // call 0 again: the same keep decisions
    d.forward_(again.view());
    return attn::test::fd::weighted_sum(again.view(), w.view());
  };
  EXPECT_TRUE(attn::test::fd::check(loss, {attn::test::fd::variable("x", x.view(), grad.view())}));
}

TYPED_TEST(DropoutTest, BackwardOfAnInactiveForwardAddsGradYAndChecksShapes) {
  using Scalar = TypeParam;
  Dropout<Scalar> d(0.5);
  d.eval();
  Tensor<Scalar, 2> x({2, 3}, Scalar(1));
  const attn::DropoutRecord record = d.forward_(x.view());
  EXPECT_FALSE(record.active);
  const auto dy = attn::test::random_tensor<Scalar>(Shape<2>{2, 3}, 4);
  Tensor<Scalar, 2> dx({2, 3}, Scalar(0.25));
  d.backward(record, dy.view(), dx.view());
  for (Index i = 0; i < 6; ++i) EXPECT_EQ(dx.data()[i], Scalar(0.25) + dy.data()[i]);
  Tensor<Scalar, 2> wrong({3, 2});
  EXPECT_THAT(
      attn::test::thrown<attn::ShapeError>([&] { d.backward(record, dy.view(), wrong.view()); }),
      HasSubstr("attn::Dropout::backward: grad_y (2, 3) and grad_x (3, 2) must have the "
                "forward's shape (6 elements, rows of 3)"));
  const Tensor<Scalar, 2> other({3, 2});
  EXPECT_THAT(
      attn::test::thrown<attn::ShapeError>([&] { d.backward(record, other.view(), wrong.view()); }),
      HasSubstr("rows of 3"));
}

}  // namespace

// Dropout::forward_ writes in place: a broadcast view would be scaled several times over.
TEST(DropoutInPlace, ViewsWhoseElementsShareMemoryAreShapeErrors) {
  float data[4] = {1, 2, 3, 4};
  const attn::TensorView<float, 2> broadcast(data, {3, 4}, {0, 1});
  attn::Dropout<float> dropout(0.5);
  EXPECT_THROW(dropout.forward_(broadcast), attn::ShapeError);
}

}  // namespace dropout_test

#include "support/bodies_end.hpp"
