// SPDX-License-Identifier: MIT
// tests/catalogue/notebook003_simple_attention_test.cpp: notebook 003 In [168]-[193], [216],
// [217], [221] (attention without trainable weights) through attn, against the catalogue.
//
// Catalogue cases: numeric 003-In169, In172, In173, In177, In178, In180, In181, In183,
// In185, In186, In187, In188, In190, In221 (14); shape 003-In175, In176, In193, In216,
// In217 (5). Tolerances come from the catalogue: atol_vs_expected (1e-4) against the
// 4-decimal printouts, atol_vs_expected_full (1e-5) against torch 1.13's float32 values,
// tolerance_weights_full_atol (1e-6) for In [183]'s full-precision weights.
// Glossary: T = tokens (6), d = embedding (3).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "attn/attn.hpp"
#include "catalogue/catalogue_support.hpp"
#include "support/test_support.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace notebook003_simple_attention_test {

namespace {

namespace cat = attn::test::catalogue;
namespace nb = attn::test::notebook::nb003;
using attn::Index;
using attn::Shape;
using attn::Tensor;
using ::testing::DoubleNear;

template <class Scalar>
class Notebook003Simple : public ::testing::Test {};
TYPED_TEST_SUITE(Notebook003Simple, cat::Scalars, cat::ScalarName);

// scores[i] = dot(inputs[query], inputs[i]), the notebook's loop of torch.dot (In [177]),
// with attn::select rows mapped by attn::as_vector.
template <class Scalar>
Tensor<Scalar, 1> scores_of_query(const Tensor<Scalar, 2>& x, Index query) {
  Tensor<Scalar, 1> scores({x.extent(0)});
  const auto q = attn::as_vector(attn::select(x.view(), 0, query));
  for (Index i = 0; i < x.extent(0); ++i) {
    scores(i) = q.dot(attn::as_vector(attn::select(x.view(), 0, i)));
  }
  return scores;
}

// ---- In [168]-[171]: the inputs ----

// 003-In169: the literal, reprinted in In [189], [192], [203], [215]; inputs[1] (In [170])
// and inputs[0] (In [171]) through attn::select.
TYPED_TEST(Notebook003Simple, In169InputsAndSelectedRowsMatchNotebook) {
  using Scalar = TypeParam;
  const auto x = cat::journey_inputs<Scalar>();
  EXPECT_EQ(x.shape(), cat::shape_of(nb::in169::printed_inputs));
  EXPECT_THAT(cat::values(x), cat::Near(nb::in169::printed_inputs, nb::in169::atol_vs_expected));
  EXPECT_THAT(cat::values(x), cat::Near(nb::in169::full_inputs, nb::in169::atol_vs_expected_full));
  for (Index i = 0; i < x.extent(0); ++i) {
    SCOPED_TRACE(i);
    EXPECT_THAT(cat::values(attn::select(x.view(), 0, i)),
                cat::Near(nb::in169::printed_inputs[i], nb::in169::atol_vs_expected));
  }
}

// ---- In [172]-[183]: one query ----

// 003-In172: 0.55*0.43 + 0.87*0.15 + 0.66*0.89 written out with Python floats.
TYPED_TEST(Notebook003Simple, In172HandWrittenDotProductMatchesNotebook) {
  using Scalar = TypeParam;
  const auto a = cat::tensor<Scalar>(nb::in172::input_a);
  const auto b = cat::tensor<Scalar>(nb::in172::input_b);
  const double dot = attn::as_vector(a).dot(attn::as_vector(b));
  EXPECT_THAT(dot, DoubleNear(nb::in172::printed_dot[0], nb::in172::atol_vs_expected));
  EXPECT_THAT(dot, DoubleNear(nb::in172::full_dot[0], nb::in172::atol_vs_expected_full));
}

// 003-In173: torch.dot(inputs[1], inputs[0]).
TYPED_TEST(Notebook003Simple, In173DotOfSelectedRowsMatchesNotebook) {
  using Scalar = TypeParam;
  const auto x = cat::journey_inputs<Scalar>();
  const double dot = attn::as_vector(attn::select(x.view(), 0, 1))
                         .dot(attn::as_vector(attn::select(x.view(), 0, 0)));
  EXPECT_THAT(dot, DoubleNear(nb::in173::printed_dot[0], nb::in173::atol_vs_expected));
  EXPECT_THAT(dot, DoubleNear(nb::in173::full_dot[0], nb::in173::atol_vs_expected_full));
}

// 003-In177: scores of query x^2 (inputs[1]) against every token.
TYPED_TEST(Notebook003Simple, In177ScoresOfSecondTokenMatchNotebook) {
  using Scalar = TypeParam;
  const auto x = cat::tensor<Scalar>(nb::in177::input_inputs);
  const auto scores = scores_of_query(x, nb::in177::input_query_index);
  EXPECT_THAT(cat::values(scores),
              cat::Near(nb::in177::printed_scores, nb::in177::atol_vs_expected));
  EXPECT_THAT(cat::values(scores),
              cat::Near(nb::in177::full_scores, nb::in177::atol_vs_expected_full));
}

// 003-In178 (+ In [179]): naive normalisation scores / sum(scores), not a softmax.
TYPED_TEST(Notebook003Simple, In178SumNormalisedScoresMatchNotebook) {
  using Scalar = TypeParam;
  const auto x = cat::tensor<Scalar>(nb::in178::input_inputs);
  Tensor<Scalar, 1> weights = scores_of_query(x, nb::in178::input_query_index);
  auto w = attn::as_vector(weights);
  w /= w.sum();
  EXPECT_THAT(cat::values(weights),
              cat::Near(nb::in178::printed_weights, nb::in178::atol_vs_expected));
  EXPECT_THAT(cat::values(weights),
              cat::Near(nb::in178::full_weights, nb::in178::atol_vs_expected_full));
  const double sum = w.sum();
  EXPECT_THAT(sum, DoubleNear(nb::in178::printed_sum[0], nb::in178::atol_vs_expected));
  EXPECT_THAT(sum, DoubleNear(nb::in178::full_sum[0], nb::in178::atol_vs_expected_full));
}

// 003-In180: the naive softmax exp(s) / sum(exp(s)); attn::softmax (max-subtracted) must
// give the same values.
TYPED_TEST(Notebook003Simple, In180NaiveSoftmaxAndAttnSoftmaxMatchNotebook) {
  using Scalar = TypeParam;
  const auto x = cat::tensor<Scalar>(nb::in180::input_inputs);
  const auto scores = scores_of_query(x, nb::in180::input_query_index);
  Tensor<Scalar, 1> naive({scores.extent(0)});
  attn::as_vector(naive) = attn::as_vector(scores).array().exp().matrix();
  attn::as_vector(naive) /= attn::as_vector(naive).sum();
  const auto stable = attn::softmax(scores);
  for (const auto& weights : {cat::values(naive), cat::values(stable)}) {
    EXPECT_THAT(weights, cat::Near(nb::in180::printed_weights, nb::in180::atol_vs_expected));
    EXPECT_THAT(weights, cat::Near(nb::in180::full_weights, nb::in180::atol_vs_expected_full));
  }
}

// 003-In181 (+ In [182]): torch.softmax(scores, dim=0) and its sum.
TYPED_TEST(Notebook003Simple, In181SoftmaxAndItsSumMatchNotebook) {
  using Scalar = TypeParam;
  const auto x = cat::tensor<Scalar>(nb::in181::input_inputs);
  const auto weights = attn::softmax(scores_of_query(x, nb::in181::input_query_index), 0);
  EXPECT_THAT(cat::values(weights),
              cat::Near(nb::in181::printed_weights, nb::in181::atol_vs_expected));
  EXPECT_THAT(cat::values(weights),
              cat::Near(nb::in181::full_weights, nb::in181::atol_vs_expected_full));
  const double sum = attn::as_vector(weights).sum();
  EXPECT_THAT(sum, DoubleNear(nb::in181::printed_sum[0], nb::in181::atol_vs_expected));
  EXPECT_THAT(sum, DoubleNear(nb::in181::full_sum[0], nb::in181::atol_vs_expected_full));
}

// 003-In183: weights printed at full float32 precision (atol 1e-6) and the context vector of
// token 2, sum_i w_i inputs[i]; SimpleSelfAttention's row 1 is the same vector.
TYPED_TEST(Notebook003Simple, In183FullPrecisionWeightsAndContextMatchNotebook) {
  using Scalar = TypeParam;
  const auto x = cat::tensor<Scalar>(nb::in183::input_inputs);
  const auto weights = attn::softmax(scores_of_query(x, nb::in183::input_query_index));
  EXPECT_THAT(cat::values(weights),
              cat::Near(nb::in183::printed_weights_full, nb::in183::tolerance_weights_full_atol));
  Tensor<Scalar, 1> context({x.extent(1)});
  attn::as_vector(context).noalias() = attn::as_vector(weights) * attn::as_matrix(x);
  EXPECT_THAT(cat::values(context),
              cat::Near(nb::in183::printed_context, nb::in183::atol_vs_expected));
  EXPECT_THAT(cat::values(context),
              cat::Near(nb::in183::full_context, nb::in183::atol_vs_expected_full));

  const auto all = attn::SimpleSelfAttention<Scalar>{}.forward(x.view());
  EXPECT_THAT(cat::values(attn::select(all.view(), 0, nb::in183::input_query_index)),
              cat::Near(nb::in183::full_context, nb::in183::atol_vs_expected_full));
}

// ---- In [185]-[191]: all queries ----

// 003-In185: the 6x6 scores by a double loop of dot products.
TYPED_TEST(Notebook003Simple, In185LoopScoresMatchNotebook) {
  using Scalar = TypeParam;
  const auto x = cat::tensor<Scalar>(nb::in185::input_inputs);
  const Index tokens = x.extent(0);
  Tensor<Scalar, 2> scores({tokens, tokens});
  for (Index i = 0; i < tokens; ++i) {
    for (Index j = 0; j < tokens; ++j) {
      scores(i, j) = attn::as_vector(attn::select(x.view(), 0, i))
                         .dot(attn::as_vector(attn::select(x.view(), 0, j)));
    }
  }
  EXPECT_THAT(cat::values(scores),
              cat::Near(nb::in185::printed_scores, nb::in185::atol_vs_expected));
  EXPECT_THAT(cat::values(scores),
              cat::Near(nb::in185::full_scores, nb::in185::atol_vs_expected_full));
}

// 003-In186: inputs.T as an attn::transpose view (strides swapped, no copy).
TYPED_TEST(Notebook003Simple, In186TransposeViewMatchesNotebook) {
  using Scalar = TypeParam;
  const auto x = cat::tensor<Scalar>(nb::in186::input_inputs);
  const auto xt = attn::transpose(x.view());
  EXPECT_EQ(xt.shape(), cat::shape_of(nb::in186::printed_inputs_t));
  EXPECT_EQ(xt.data(), x.data());  // a view, not a copy
  EXPECT_THAT(cat::values(xt), cat::Near(nb::in186::printed_inputs_t, nb::in186::atol_vs_expected));
  EXPECT_THAT(cat::values(xt),
              cat::Near(nb::in186::full_inputs_t, nb::in186::atol_vs_expected_full));
}

// 003-In187: inputs @ inputs.T through as_matrix (the transpose made contiguous first,
// because as_matrix refuses a non-unit inner stride).
TYPED_TEST(Notebook003Simple, In187MatrixProductScoresMatchNotebook) {
  using Scalar = TypeParam;
  const auto x = cat::tensor<Scalar>(nb::in187::input_inputs);
  const auto xt = attn::contiguous(attn::transpose(x.view()));
  Tensor<Scalar, 2> scores({x.extent(0), xt.extent(1)});
  attn::as_matrix(scores).noalias() = attn::as_matrix(x) * attn::as_matrix(xt);
  EXPECT_THAT(cat::values(scores),
              cat::Near(nb::in187::printed_scores, nb::in187::atol_vs_expected));
  EXPECT_THAT(cat::values(scores),
              cat::Near(nb::in187::full_scores, nb::in187::atol_vs_expected_full));
}

// 003-In188: row-wise softmax of the unscaled scores, by attn::softmax (dim=1) and as the
// weights of SimpleSelfAttention (unscaled by default, like the notebook).
TYPED_TEST(Notebook003Simple, In188RowSoftmaxMatchesNotebook) {
  using Scalar = TypeParam;
  const auto x = cat::tensor<Scalar>(nb::in188::input_inputs);
  Tensor<Scalar, 2> scores({x.extent(0), x.extent(0)});
  attn::as_matrix(scores).noalias() = attn::as_matrix(x) * attn::as_matrix(x).transpose();
  const auto weights = attn::softmax(scores, 1);
  EXPECT_THAT(cat::values(weights),
              cat::Near(nb::in188::printed_weights, nb::in188::atol_vs_expected));
  EXPECT_THAT(cat::values(weights),
              cat::Near(nb::in188::full_weights, nb::in188::atol_vs_expected_full));
  const auto module = attn::SimpleSelfAttention<Scalar>{}.forward_with_weights(x.view());
  EXPECT_THAT(cat::values(module.weights),
              cat::Near(nb::in188::printed_weights, nb::in188::atol_vs_expected));
  EXPECT_THAT(cat::values(module.weights),
              cat::Near(nb::in188::full_weights, nb::in188::atol_vs_expected_full));
}

// 003-In190 (+ In [191]): the context vectors of all six tokens, softmax(x x^T) x.
TYPED_TEST(Notebook003Simple, In190SimpleSelfAttentionContextMatchesNotebook) {
  using Scalar = TypeParam;
  const auto x = cat::tensor<Scalar>(nb::in190::input_inputs);
  const attn::SimpleSelfAttention<Scalar> attention;
  ASSERT_FALSE(attention.scaled());
  const auto context = attention.forward(x.view());
  EXPECT_EQ(context.shape(), cat::shape_of(nb::in190::printed_context));
  EXPECT_THAT(cat::values(context),
              cat::Near(nb::in190::printed_context, nb::in190::atol_vs_expected));
  EXPECT_THAT(cat::values(context),
              cat::Near(nb::in190::full_context, nb::in190::atol_vs_expected_full));
  // The batched form gives the same rows.
  const auto batch = cat::stack_copies(x, 2);
  const auto batched = attention.forward(batch);
  for (Index b = 0; b < 2; ++b) {
    EXPECT_THAT(cat::values(attn::select(batched.view(), 0, b)),
                cat::Near(nb::in190::full_context, nb::in190::atol_vs_expected_full));
  }
}

// 003-In221: batch = torch.stack((inputs, inputs)), built with attn::copy into select views.
TYPED_TEST(Notebook003Simple, In221StackedBatchMatchesNotebook) {
  using Scalar = TypeParam;
  const auto batch = cat::stack_copies(cat::tensor<Scalar>(nb::in221::input_inputs), 2);
  EXPECT_EQ(batch.shape(), cat::shape_of(nb::in221::printed_batch));
  EXPECT_THAT(cat::values(batch), cat::Near(nb::in221::printed_batch, nb::in221::atol_vs_expected));
  EXPECT_THAT(cat::values(batch),
              cat::Near(nb::in221::full_batch, nb::in221::atol_vs_expected_full));
}

// ---- shape cases ----

// 003-In175 and 003-In193: inputs.shape.
TYPED_TEST(Notebook003Simple, In175AndIn193InputsShape) {
  const auto x = cat::journey_inputs<TypeParam>();
  EXPECT_EQ(x.shape(), cat::shape(nb::in175::shape_inputs));
  EXPECT_EQ(x.shape(), cat::shape(nb::in193::shape_inputs));
}

// 003-In176: query = inputs[1]; query.shape == (3,).
TYPED_TEST(Notebook003Simple, In176SelectedQueryShape) {
  const auto x = cat::journey_inputs<TypeParam>();
  EXPECT_EQ(attn::select(x.view(), 0, 1).shape(), cat::shape(nb::in176::shape_query));
}

// 003-In216: torch.stack((inputs, inputs), dim=0).shape == (2, 6, 3).
TYPED_TEST(Notebook003Simple, In216StackedBatchShape) {
  const auto batch = cat::stack_copies(cat::journey_inputs<TypeParam>(), 2);
  EXPECT_EQ(batch.shape(), cat::shape(nb::in216::shape_batch));
}

// 003-In217: x (2, 3, 4), x.transpose(1, 2) (2, 4, 3) and the batched x^T @ x (2, 4, 4).
// Random x (the notebook's is unseeded); the product's extents come from the Eigen maps.
TYPED_TEST(Notebook003Simple, In217TransposeAndBatchedProductShapes) {
  using Scalar = TypeParam;
  const auto x = attn::test::random_tensor<Scalar>(cat::shape(nb::in217::shape_x), 217);
  EXPECT_EQ(x.shape(), cat::shape(nb::in217::shape_x));
  const auto xt = attn::transpose(x.view(), 1, 2);
  EXPECT_EQ(xt.shape(), cat::shape(nb::in217::shape_x_transposed));
  std::vector<attn::RowMatrix<Scalar>> products;
  for (Index b = 0; b < x.extent(0); ++b) {
    const auto xt_b = attn::contiguous(attn::select(xt, 0, b));
    products.push_back(attn::as_matrix(xt_b) * attn::as_matrix(attn::select(x.view(), 0, b)));
  }
  const Shape<3> fin{static_cast<Index>(products.size()), products[0].rows(), products[0].cols()};
  EXPECT_EQ(fin, cat::shape(nb::in217::shape_x_fin));
}

}  // namespace

}  // namespace notebook003_simple_attention_test

#include "support/bodies_end.hpp"
