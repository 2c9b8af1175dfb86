// SPDX-License-Identifier: MIT
// tests/optim/adamw_test.cpp: attn::optim::AdamW (attn/optim/adamw.hpp) against
// torch.optim.AdamW (PyTorch 1.13, foreach=False): several steps bit for bit in float and
// double, the state (step count, moments, amsgrad's maximum) carried across steps, a module's
// strided raw parameters, and its errors.
#include "attn/optim/adamw.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <utility>

#include "attn/attn.hpp"
#include "optim/optim_test_support.hpp"
#include "support/scalar_types.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace adamw_test {

namespace {

using attn::Gradients;
using attn::Index;
using attn::optim::AdamW;
using attn::optim::AdamWOptions;
using attn::test::pytorch::OptimCase;
using attn::test::pytorch::Optimizer;
using ::testing::HasSubstr;

template <class Scalar>
class AdamWTest : public ::testing::Test {};
TYPED_TEST_SUITE(AdamWTest, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

template <class Scalar>
AdamWOptions options_of(const OptimCase<Scalar>& c) {
  AdamWOptions o;
  o.lr = c.lr;
  o.beta1 = c.beta1;
  o.beta2 = c.beta2;
  o.eps = c.eps;
  o.weight_decay = c.weight_decay;
  o.amsgrad = c.amsgrad;
  o.maximize = c.maximize;
  return o;
}

TYPED_TEST(AdamWTest, MatchesTorchOptimAdamWBitForBitOverSeveralSteps) {
  using Scalar = TypeParam;
  using attn::test::pytorch::expect_state;
  const int cases = attn::test::pytorch::run_cases<Scalar>(
      Optimizer::kAdamW,
      [](attn::ParameterList<Scalar> params, const OptimCase<Scalar>& c) {
        return AdamW<Scalar>(std::move(params), options_of(c));
      },
      [](const AdamW<Scalar>& adamw, const OptimCase<Scalar>& c) {
        expect_state(adamw.exp_avg(), c.weight_exp_avg, c.bias_exp_avg, c.odd_exp_avg);
        expect_state(adamw.exp_avg_sq(), c.weight_exp_avg_sq, c.bias_exp_avg_sq, c.odd_exp_avg_sq);
        if (c.amsgrad) {
          expect_state(adamw.max_exp_avg_sq(), c.weight_max_exp_avg_sq, c.bias_max_exp_avg_sq,
                       c.odd_max_exp_avg_sq);
        } else {
          EXPECT_TRUE(adamw.max_exp_avg_sq().empty());
        }
      });
  EXPECT_EQ(cases, 4);
}

// A module's raw (d_in, d_out) W_query is a transposed view of its storage: the optimizer
// walks it, its gradient and its moments with the same strides and gets PyTorch's values.
TYPED_TEST(AdamWTest, UpdatesAModulesStridedParametersInPlace) {
  using Scalar = TypeParam;
  const OptimCase<Scalar> c = attn::test::pytorch::optim_case<Scalar>("AdamWAmsgrad");
  attn::manual_seed(3);
  attn::SelfAttention<Scalar> v1(4, 3, attn::kRandInit);  // W_query (4, 3) = d_in x d_out
  auto params = v1.named_parameters(attn::ParameterNames::kNotebookRaw);
  const attn::TensorView<Scalar, 2> w = params.find("W_query")->matrix();
  ASSERT_FALSE(w.is_contiguous());
  for (Index r = 0; r < 4; ++r) {
    for (Index k = 0; k < 3; ++k) w(r, k) = c.weight.values[r * 3 + k];
  }
  AdamW<Scalar> adamw(params, options_of(c));
  Gradients<Scalar> grads(params);
  for (Index t = 0; t < c.steps; ++t) {
    grads.zero();
    const attn::TensorView<Scalar, 2> g = grads.at("W_query").matrix();
    const Scalar* values = attn::test::pytorch::at_step(c.weight_grads, t);
    for (Index r = 0; r < 4; ++r) {
      for (Index k = 0; k < 3; ++k) g(r, k) = values[r * 3 + k];
    }
    adamw.step(grads);
    EXPECT_TRUE(attn::test::pytorch::same_values(*params.find("W_query"),
                                                 attn::test::pytorch::at_step(c.weight_after, t)))
        << "step " << t + 1;
  }
  EXPECT_TRUE(
      attn::test::pytorch::same_values(adamw.exp_avg().at("W_query"), c.weight_exp_avg.values));
  // The module computes with the updated weights (they are its own memory).
  EXPECT_EQ(v1.w_query().weight()(2, 1), w(1, 2));
}

TEST(AdamW, ZeroLearningRateKeepsTheParametersAndStillTracksMoments) {
  attn::Linear<double> layer(3, 2, true);
  const attn::Tensor<double, 2> before(layer.weight());
  AdamW<double> adamw(layer.named_parameters());
  adamw.set_lr(0.0);
  Gradients<double> grads(layer.named_parameters());
  grads.at("weight").matrix()(1, 2) = 0.5;
  adamw.step(grads);
  EXPECT_EQ(attn::test::to_vector(before.view()), attn::test::to_vector(layer.weight()));
  EXPECT_EQ(adamw.exp_avg().at("weight").matrix()(1, 2), 0.5 * (1 - 0.9));
  EXPECT_EQ(adamw.exp_avg().at("weight").matrix()(0, 0), 0.0);
}

TEST(AdamW, RejectsWhatPyTorchRejects) {
  attn::Linear<float> layer(3, 2, true);
  const auto params = layer.named_parameters();
  const auto rejects = [&](AdamWOptions o, const char* text) {
    EXPECT_THAT(attn::test::thrown<attn::ConfigError>([&] { AdamW<float>(params, o); }),
                HasSubstr(text));
  };
  AdamWOptions o;
  o.lr = -0.1;
  rejects(o, "attn::optim::AdamW: lr=-0.1 is invalid: must be >= 0");
  o = {};
  o.beta1 = 1.0;
  rejects(o, "beta1=1 is invalid: must be in [0, 1)");
  o = {};
  o.beta2 = -0.5;
  rejects(o, "beta2=-0.5 is invalid");
  o = {};
  o.eps = -1e-8;
  rejects(o, "eps=-1e-08 is invalid");
  o = {};
  o.weight_decay = -1;
  rejects(o, "weight_decay=-1 is invalid");
  AdamW<float> adamw(params);
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>([&] { adamw.set_lr(-1); }), HasSubstr("lr=-1"));
  // Gradients of another module's parameters: nothing is updated.
  const attn::Linear<float> other(3, 2, true);
  const attn::Tensor<float, 2> before(layer.weight());
  const Gradients<float> foreign(other.named_parameters());
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>([&] { adamw.step(foreign); }),
              HasSubstr("is not in the memory"));
  EXPECT_EQ(adamw.steps(), 0);
  EXPECT_EQ(attn::test::to_vector(before.view()), attn::test::to_vector(layer.weight()));
}

}  // namespace

}  // namespace adamw_test

#include "support/bodies_end.hpp"
