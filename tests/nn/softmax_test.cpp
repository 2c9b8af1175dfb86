// SPDX-License-Identifier: MIT
// tests/nn/softmax_test.cpp: softmax/softmax_ (normalisation, float64 reference, stability for
// large logits, -inf handling, fully masked rows, any axis, strided views, errors).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attn/attn.hpp"
#include "support/scalar_types.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace softmax_test {

namespace {

using ::testing::AllOf;
using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pointwise;

using attn::Index;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;

template <class Scalar>
class SoftmaxTest : public ::testing::Test {
 protected:
  static constexpr Scalar kInf = std::numeric_limits<Scalar>::infinity();
  static double tol(Index n) { return attn::test::reduction_tolerance<Scalar>(n); }
};
TYPED_TEST_SUITE(SoftmaxTest, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

/// Softmax of each row of `x` (rank 2) in long double, straight from the definition.
template <class Scalar>
std::vector<double> reference_rows(const Tensor<Scalar, 2>& x) {
  std::vector<double> out;
  for (Index i = 0; i < x.extent(0); ++i) {
    long double m = -std::numeric_limits<long double>::infinity();
    for (Index j = 0; j < x.extent(1); ++j) m = std::max<long double>(m, x(i, j));
    long double sum = 0;
    for (Index j = 0; j < x.extent(1); ++j) sum += std::exp(static_cast<long double>(x(i, j)) - m);
    for (Index j = 0; j < x.extent(1); ++j) {
      out.push_back(static_cast<double>(std::exp(static_cast<long double>(x(i, j)) - m) / sum));
    }
  }
  return out;
}

TYPED_TEST(SoftmaxTest, RowsSumToOne) {
  const auto x = attn::test::random_tensor<TypeParam, 2>({5, 33}, 1, -6.0, 6.0);
  const auto y = attn::softmax(x);
  EXPECT_EQ(y.shape(), x.shape());
  for (Index i = 0; i < 5; ++i) {
    double sum = 0;
    for (Index j = 0; j < 33; ++j) {
      EXPECT_GT(y(i, j), TypeParam(0));
      sum += double(y(i, j));
    }
    EXPECT_NEAR(sum, 1.0, this->tol(33)) << "row " << i;
  }
}

TYPED_TEST(SoftmaxTest, MatchesFloat64Reference) {
  const auto x = attn::test::random_tensor<TypeParam, 2>({7, 50}, 2, -10.0, 10.0);
  EXPECT_THAT(attn::softmax(x).to_vector(),
              Pointwise(DoubleNear(this->tol(50)), reference_rows(x)));
}

TYPED_TEST(SoftmaxTest, MatchesTorchSoftmax) {
  // /usr/bin/python3 -c "import torch; x = torch.tensor([[0.9995, 0.9544, 0.9422, 0.4753, 0.4576,
  //   0.6310], [0.5, -1.5, 2.25, 0.0, 3.0, -0.75]], dtype=torch.float64);
  //   print([repr(v) for v in torch.softmax(x, -1).flatten().tolist()])"
  const auto x =
      Tensor<TypeParam, 2>::from_rows({{TypeParam(0.9995), TypeParam(0.9544), TypeParam(0.9422),
                                        TypeParam(0.4753), TypeParam(0.4576), TypeParam(0.6310)},
                                       {TypeParam(0.5), TypeParam(-1.5), TypeParam(2.25),
                                        TypeParam(0.0), TypeParam(3.0), TypeParam(-0.75)}});
  // float inputs differ from the float64 ones by up to 6e-8, which moves the result by as much.
  const double tolerance = this->tol(6) + 2 * double(std::numeric_limits<TypeParam>::epsilon());
  EXPECT_THAT(attn::softmax(x).to_vector(),
              Pointwise(DoubleNear(tolerance),
                        {0.20983475741543528, 0.20058144054322055, 0.19814921371986097,
                         0.12422821921264873, 0.12204872515583165, 0.14515764395300298,
                         0.05008648087928555, 0.006778468076123295, 0.28822779689964645,
                         0.030378986290397262, 0.6101782508247862, 0.0143500170297615}));
}

TYPED_TEST(SoftmaxTest, LargeLogitsStayFinite) {
  // exp(1e4) overflows both float and double: only a max-subtracted softmax survives.
  const Tensor<TypeParam, 2> x({2, 3}, {TypeParam(1e4), TypeParam(1e4 - 1), TypeParam(-1e4),
                                        TypeParam(-1e4), TypeParam(-1e4), TypeParam(-1e4 + 2)});
  const auto y = attn::softmax(x);
  for (const TypeParam v : y.to_vector()) EXPECT_TRUE(std::isfinite(v)) << v;
  const double e = std::exp(-1.0), e2 = std::exp(-2.0);
  EXPECT_THAT(y.to_vector(),
              Pointwise(DoubleNear(this->tol(3)), {1 / (1 + e), e / (1 + e), 0.0, e2 / (1 + 2 * e2),
                                                   e2 / (1 + 2 * e2), 1 / (1 + 2 * e2)}));
}

TYPED_TEST(SoftmaxTest, NegativeInfinityGetsZeroWeight) {
  const TypeParam inf = this->kInf;
  const Tensor<TypeParam, 2> x({2, 4}, {0, -inf, 0, -inf, 3, -inf, -inf, -inf});
  const auto y = attn::softmax(x);
  EXPECT_THAT(y.to_vector(), ElementsAre(0.5, 0, 0.5, 0, 1, 0, 0, 0));
}

TYPED_TEST(SoftmaxTest, FullyMaskedRowGivesZerosNotNaN) {
  const TypeParam inf = this->kInf;
  Tensor<TypeParam, 2> x({3, 3}, {1, 2, 3, -inf, -inf, -inf, 0, 0, -inf});
  attn::softmax_(x.view());
  for (const TypeParam v : x.to_vector()) EXPECT_FALSE(std::isnan(v));
  EXPECT_THAT(attn::test::row(x, 1), ElementsAre(0, 0, 0));
  EXPECT_THAT(attn::test::row(x, 2), ElementsAre(0.5, 0.5, 0));
  double sum = 0;
  for (const TypeParam v : attn::test::row(x, 0)) sum += double(v);
  EXPECT_NEAR(sum, 1.0, this->tol(3));
}

TYPED_TEST(SoftmaxTest, SingleElementRowIsOne) {
  const Tensor<TypeParam, 2> x({3, 1}, {TypeParam(-50), 0, TypeParam(1e4)});
  EXPECT_THAT(attn::softmax(x).to_vector(), ElementsAre(1, 1, 1));
}

TYPED_TEST(SoftmaxTest, AnyAxisMatchesTransposedLastAxis) {
  const auto x = attn::test::random_tensor<TypeParam, 3>({3, 4, 5}, 3, -3.0, 3.0);
  for (std::size_t axis = 0; axis < 3; ++axis) {
    const auto y = attn::softmax(x, axis);
    // Reference: move `axis` last, softmax the last axis, compare element by element.
    const auto moved = attn::contiguous(attn::transpose(x.view(), axis, 2));
    const auto ref = attn::softmax(moved);
    const auto y_moved = attn::transpose(y.view(), axis, 2);
    EXPECT_LE(attn::test::max_abs_diff(y_moved, ref.view()), 0.0) << "axis " << axis;
    // Sums along `axis` are 1 everywhere.
    const Index n = x.extent(axis);
    for (Index a = 0; a < y_moved.extent(0); ++a) {
      for (Index b = 0; b < y_moved.extent(1); ++b) {
        double sum = 0;
        for (Index k = 0; k < n; ++k) sum += double(y_moved(a, b, k));
        EXPECT_NEAR(sum, 1.0, this->tol(n)) << "axis " << axis;
      }
    }
  }
}

TYPED_TEST(SoftmaxTest, InPlaceOnAStridedViewTouchesOnlyTheView) {
  Tensor<TypeParam, 2> x({4, 6}, TypeParam(7));
  const auto block = attn::slice(attn::slice(x.view(), 0, 1, 3), 1, 2, 5);  // x[1:3, 2:5]
  block(0, 0) = 0;
  block(0, 1) = 0;
  block(0, 2) = -this->kInf;
  attn::softmax_(block);
  EXPECT_THAT(attn::test::row(x, 1), ElementsAre(7, 7, 0.5, 0.5, 0, 7));
  EXPECT_THAT(attn::test::row(x, 0), ElementsAre(7, 7, 7, 7, 7, 7));
  EXPECT_THAT(attn::test::row(x, 3), ElementsAre(7, 7, 7, 7, 7, 7));
  // Softmax over the rows (axis 0) of a transposed view = softmax over columns of x.
  Tensor<TypeParam, 2> m({2, 3}, {0, 0, 5, 0, -this->kInf, 5});
  attn::softmax_(attn::transpose(m.view()), 1);
  EXPECT_THAT(m.to_vector(), ElementsAre(0.5, 1, 0.5, 0.5, 0, 0.5));
}

TYPED_TEST(SoftmaxTest, OutOfPlaceLeavesTheInputAlone) {
  const Tensor<TypeParam, 1> x({3}, {1, 2, 3});
  const auto y = attn::softmax(x.view());
  EXPECT_THAT(x.to_vector(), ElementsAre(1, 2, 3));
  EXPECT_NEAR(double(y(2)), std::exp(2.0) / (1 + std::exp(1.0) + std::exp(2.0)), this->tol(3));
}

TYPED_TEST(SoftmaxTest, BadAxisThrowsNamingTheShape) {
  Tensor<TypeParam, 2> x({3, 4});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::softmax_(x.view(), 2); }),
              AllOf(HasSubstr("axis 2"), HasSubstr("(3, 4)")));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::softmax(x, 5); }),
              AllOf(HasSubstr("axis 5"), HasSubstr("(3, 4)")));
}

TYPED_TEST(SoftmaxTest, EmptyInputIsANoOp) {
  Tensor<TypeParam, 2> x({3, 0});
  attn::softmax_(x.view());
  EXPECT_TRUE(attn::softmax(x).empty());
}

}  // namespace

// softmax_ writes in place: a view whose elements share memory (a broadcast, zero stride)
// would be computed over values it overwrites as it goes. Rejected.
TEST(SoftmaxInPlace, ViewsWhoseElementsShareMemoryAreShapeErrors) {
  float data[4] = {1, 2, 3, 4};
  const attn::TensorView<float, 2> broadcast(data, {3, 4}, {0, 1});
  EXPECT_THROW(attn::softmax_(broadcast), attn::ShapeError);
}

}  // namespace softmax_test

#include "support/bodies_end.hpp"
