// SPDX-License-Identifier: MIT
// tests/optim/sgd_test.cpp: attn::optim::SGD (attn/optim/sgd.hpp) against torch.optim.SGD
// (PyTorch 1.13, foreach=False): several steps bit for bit in float and double with momentum,
// dampening, weight decay, Nesterov momentum and maximize, the momentum buffer carried across
// steps, and its errors.
#include "attn/optim/sgd.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <utility>

#include "attn/attn.hpp"
#include "optim/optim_test_support.hpp"
#include "support/scalar_types.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace sgd_test {
namespace {

using attn::Gradients;
using attn::optim::SGD;
using attn::optim::SGDOptions;
using attn::test::pytorch::OptimCase;
using attn::test::pytorch::Optimizer;
using ::testing::HasSubstr;

template <class Scalar>
class SGDTest : public ::testing::Test {};
TYPED_TEST_SUITE(SGDTest, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

template <class Scalar>
SGDOptions options_of(const OptimCase<Scalar>& c) {
  SGDOptions o;
  o.lr = c.lr;
  o.momentum = c.momentum;
  o.dampening = c.dampening;
  o.weight_decay = c.weight_decay;
  o.nesterov = c.nesterov;
  o.maximize = c.maximize;
  return o;
}

TYPED_TEST(SGDTest, MatchesTorchOptimSGDBitForBitOverSeveralSteps) {
  using Scalar = TypeParam;
  const int cases = attn::test::pytorch::run_cases<Scalar>(
      Optimizer::kSGD,
      [](attn::ParameterList<Scalar> params, const OptimCase<Scalar>& c) {
        return SGD<Scalar>(std::move(params), options_of(c));
      },
      [](const SGD<Scalar>& sgd, const OptimCase<Scalar>& c) {
        if (c.momentum != 0.0) {
          attn::test::pytorch::expect_state(sgd.momentum_buffer(), c.weight_momentum_buffer,
                                            c.bias_momentum_buffer, c.odd_momentum_buffer);
        } else {
          EXPECT_TRUE(sgd.momentum_buffer().empty());
        }
      });
  EXPECT_EQ(cases, 5);
}

TEST(SGD, RejectsWhatPyTorchRejects) {
  attn::Linear<double> layer(3, 2, true);
  const auto params = layer.named_parameters();
  const auto rejects = [&](SGDOptions o, const char* text) {
    EXPECT_THAT(attn::test::thrown<attn::ConfigError>([&] { SGD<double>(params, o); }),
                HasSubstr(text));
  };
  rejects(SGDOptions{}, "attn::optim::SGD: lr=nan is invalid: must be set and >= 0");
  SGDOptions o;
  o.lr = 0.1;
  o.momentum = -0.5;
  rejects(o, "momentum=-0.5 is invalid: must be >= 0");
  o.momentum = 0.0;
  o.nesterov = true;
  rejects(o, "Nesterov momentum requires a momentum > 0 and zero dampening");
  o.momentum = 0.9;
  o.dampening = 0.1;
  rejects(o, "Nesterov momentum requires");
  o = {};
  o.lr = 0.1;
  o.weight_decay = -0.1;
  rejects(o, "weight_decay=-0.1 is invalid");
  o.weight_decay = 0.0;
  SGD<double> sgd(params, o);
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>([&] { sgd.set_lr(-2); }), HasSubstr("lr=-2"));
  // Repeated names are refused even without a momentum buffer.
  attn::Tensor<double, 1> t({3});
  attn::ParameterList<double> twice;
  twice.add("t", t.view()).add("t", attn::slice(t.view(), 0, 0, 1));
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>([&] { SGD<double>(twice, o); }),
              HasSubstr("'t' appears twice"));
}

TEST(SGD, OneStepIsGradientDescent) {
  attn::Linear<double> layer(2, 1, true);
  layer.set_weight(attn::Tensor<double, 2>({1, 2}, {1.0, -2.0}).view());
  SGDOptions o;
  o.lr = 0.5;
  SGD<double> sgd(layer.named_parameters(), o);
  Gradients<double> grads(layer.named_parameters());
  grads.at("weight").matrix()(0, 1) = 4.0;
  grads.at("bias").vector()(0) = -1.0;
  const double bias = layer.bias()(0);
  sgd.step(grads);
  EXPECT_EQ(layer.weight()(0, 0), 1.0);
  EXPECT_EQ(layer.weight()(0, 1), -4.0);
  EXPECT_EQ(layer.bias()(0), bias + 0.5);
}

}  // namespace
}  // namespace sgd_test

#include "support/bodies_end.hpp"
