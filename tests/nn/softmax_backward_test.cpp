// SPDX-License-Identifier: MIT
// tests/nn/softmax_backward_test.cpp: softmax_backward (attn/nn/softmax_backward.hpp): central
// finite differences in double on every axis (with -inf logits and a fully masked row),
// PyTorch 1.13 autograd fixtures in float and double, accumulation into grad_x, any axis as
// the last one moved, and shape errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <limits>
#include <string>

#include "attn/attn.hpp"
#include "fixtures/pytorch/grad_op_cases.hpp"
#include "support/finite_difference.hpp"
#include "support/scalar_types.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace softmax_backward_test {

namespace {

using attn::Index;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
using ::testing::HasSubstr;
namespace fd = attn::test::fd;

template <class Scalar>
class SoftmaxBackwardTest : public ::testing::Test {};
TYPED_TEST_SUITE(SoftmaxBackwardTest, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

/// Logits (3, 4, 5) in [-2, 2] with some -inf entries and, along the last axis, one fully
/// masked row.
Tensor<double, 3> logits() {
  auto x = attn::test::random_tensor<double>(Shape<3>{3, 4, 5}, 1, -2.0, 2.0);
  const double inf = std::numeric_limits<double>::infinity();
  x(0, 1, 2) = x(2, 3, 0) = x(1, 0, 4) = -inf;
  for (Index j = 0; j < 5; ++j) x(1, 2, j) = -inf;
  return x;
}

TEST(SoftmaxBackward, FiniteDifferencesOnEveryAxis) {
  for (std::size_t axis = 0; axis < 3; ++axis) {
    SCOPED_TRACE("axis " + std::to_string(axis));
    Tensor<double, 3> x = logits();
    const auto w = attn::test::random_tensor<double>(Shape<3>{3, 4, 5}, 2 + axis);
    const auto y = attn::softmax(x.view(), axis);
    const auto grad = attn::softmax_backward(y.view(), w.view(), axis);
    const auto loss = [&] {
      return fd::weighted_sum(attn::softmax(x.view(), axis).view(), w.view());
    };
    EXPECT_TRUE(fd::check(loss, {fd::variable("x", x.view(), grad.view())}));
  }
}

TEST(SoftmaxBackward, MaskedEntriesAndFullyMaskedRowsGetZeroGradient) {
  const Tensor<double, 3> x = logits();
  const auto w = attn::test::random_tensor<double>(Shape<3>{3, 4, 5}, 9);
  const auto grad = attn::softmax_backward(attn::softmax(x.view()).view(), w.view());
  EXPECT_EQ(grad(0, 1, 2), 0.0);
  for (Index j = 0; j < 5; ++j) EXPECT_EQ(grad(1, 2, j), 0.0);
  // A softmax row's gradient sums to zero (the sum of y is constant).
  double sum = 0;
  for (Index j = 0; j < 5; ++j) sum += grad(0, 0, j);
  EXPECT_NEAR(sum, 0.0, 1e-15);
}

TYPED_TEST(SoftmaxBackwardTest, MatchesPyTorchAutograd) {
  using Scalar = TypeParam;
  int cases = 0;
  for (const auto& c : attn::test::pytorch::softmax_grad_cases<Scalar>()) {
    SCOPED_TRACE(c.name);
    ++cases;
    const Shape<3> shape{c.output.shape[0], c.output.shape[1], c.output.shape[2]};
    const TensorView<const Scalar, 3> y(c.output.values, shape);
    const TensorView<const Scalar, 3> grad_y(c.grad_output.values, shape);
    const TensorView<const Scalar, 3> expected(c.grad_input.values, shape);
    // attn's own forward gives PyTorch's output (same check as tests/nn/softmax_test).
    const TensorView<const Scalar, 3> x(c.input.values, shape);
    const auto n = static_cast<Index>(shape[static_cast<std::size_t>(c.axis)]);
    const double tol = attn::test::reduction_tolerance<Scalar>(n);
    EXPECT_LE(attn::test::max_abs_diff(attn::softmax(x, c.axis).view(), y), tol);
    const auto grad = attn::softmax_backward(y, grad_y, c.axis);
    // grad_x = y (dy - sum y dy): an n-term sum of products of values up to ~2 in magnitude.
    EXPECT_LE(attn::test::max_abs_diff(grad.view(), expected), 2 * tol);
  }
  EXPECT_GE(cases, 3);
}

TYPED_TEST(SoftmaxBackwardTest, AddsIntoGradXAndAnyAxisIsTheLastOneMoved) {
  using Scalar = TypeParam;
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{2, 6, 3}, 4, -3.0, 3.0);
  const auto w = attn::test::random_tensor<Scalar>(Shape<3>{2, 6, 3}, 5);
  const auto y = attn::softmax(x.view(), 1);
  const auto alone = attn::softmax_backward(y.view(), w.view(), 1);
  Tensor<Scalar, 3> added({2, 6, 3}, Scalar(0.5));
  attn::softmax_backward(y.view(), w.view(), added.view(), 1);
  for (Index i = 0; i < added.size(); ++i) {  // one FMA: within an ulp of 0.5 + alone
    EXPECT_NEAR(added.data()[i], Scalar(0.5) + alone.data()[i],
                std::numeric_limits<Scalar>::epsilon());
  }
  // The same rows moved last and made contiguous: the very same bits.
  const Tensor<Scalar, 3> y_last(attn::transpose(y.view(), 1, 2));
  const Tensor<Scalar, 3> w_last(attn::transpose(w.view(), 1, 2));
  const auto last = attn::softmax_backward(y_last.view(), w_last.view());
  const Tensor<Scalar, 3> moved(attn::transpose(alone.view(), 1, 2));
  EXPECT_EQ(attn::test::to_vector(last), attn::test::to_vector(moved));
}

TEST(SoftmaxBackward, WrongShapesThrowNamingThem) {
  const Tensor<float, 2> y({2, 3}), dy({2, 4});
  Tensor<float, 2> dx({2, 3});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>(
                  [&] { attn::softmax_backward(y.view(), dy.view(), dx.view()); }),
              HasSubstr("attn::softmax_backward: y (2, 3), grad_y (2, 4), grad_x (2, 3), axis 1"));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>(
                  [&] { attn::softmax_backward(y.view(), y.view(), dx.view(), 2); }),
              HasSubstr("axis 2: expected one shape"));
}

}  // namespace

}  // namespace softmax_backward_test

#include "support/bodies_end.hpp"
