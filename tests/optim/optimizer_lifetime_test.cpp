// SPDX-License-Identifier: MIT
// tests/optim/optimizer_lifetime_test.cpp: an optimizer keeps views of the parameters it was
// built on, and checks at every step that they still exist: a module replaced in place
// (assigned a new one) or destroyed frees them, and a step then wrote into freed memory
// (ASan: heap-use-after-free) with no error. Now such a step throws ConfigError and changes
// nothing; a module moved elsewhere keeps its parameters (and its optimizer) working, as a
// moved std::vector keeps its elements. Gradients made for parameters that no longer exist
// are refused the same way.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <utility>

#include "attn/attn.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace optimizer_lifetime_test {

namespace {

using attn::ConfigError;
using attn::Gradients;
using attn::MultiHeadAttention;
using attn::MultiHeadAttentionOptions;
using ::testing::HasSubstr;

MultiHeadAttentionOptions options() { return MultiHeadAttentionOptions::pytorch(8, 2, true); }

attn::optim::SGDOptions sgd_options() {
  attn::optim::SGDOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  return o;
}

template <class Optimizer, class Options>
void expect_refused_after_replacement(const Options& o) {
  attn::manual_seed(1);
  MultiHeadAttention<float> m(options());
  Gradients<float> grads(m.named_parameters());
  Optimizer opt(m.named_parameters(), o);
  grads.at("in_proj_weight").matrix()(0, 0) = 1.0f;
  opt.step(grads);
  m = MultiHeadAttention<float>(options());  // the parameters opt holds are freed
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { opt.step(grads); }),
              HasSubstr("no longer exist"));
  EXPECT_EQ(opt.steps(), 1);
}

template <class Optimizer, class Options>
void expect_refused_after_destruction(const Options& o) {
  attn::manual_seed(2);
  auto m = std::make_unique<MultiHeadAttention<float>>(options());
  Gradients<float> grads(m->named_parameters());
  Optimizer opt(m->named_parameters(), o);
  m.reset();
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { opt.step(grads); }),
              HasSubstr("no longer exist"));
}

TEST(OptimizerLifetime, SgdRefusesParametersOfAReplacedOrDestroyedModule) {
  expect_refused_after_replacement<attn::optim::SGD<float>>(sgd_options());
  expect_refused_after_destruction<attn::optim::SGD<float>>(sgd_options());
}

TEST(OptimizerLifetime, AdamWRefusesParametersOfAReplacedOrDestroyedModule) {
  expect_refused_after_replacement<attn::optim::AdamW<float>>(attn::optim::AdamWOptions{});
  expect_refused_after_destruction<attn::optim::AdamW<float>>(attn::optim::AdamWOptions{});
}

TEST(OptimizerLifetime, ALinearReplacedInPlaceIsRefusedToo) {
  attn::manual_seed(3);
  attn::Linear<float> lin(4, 3);
  Gradients<float> grads(lin.named_parameters());
  attn::optim::SGD<float> sgd(lin.named_parameters(), sgd_options());
  lin = attn::Linear<float>(5, 3);
  EXPECT_THROW(sgd.step(grads), ConfigError);
}

TEST(OptimizerLifetime, AMovedModuleKeepsItsOptimizer) {
  attn::manual_seed(4);
  MultiHeadAttention<float> m(options());
  Gradients<float> grads(m.named_parameters());
  attn::optim::SGD<float> sgd(m.named_parameters(), sgd_options());
  grads.at("in_proj_weight").matrix()(0, 0) = 1.0f;
  MultiHeadAttention<float> moved = std::move(m);
  const float before = moved.in_proj_weight()(0, 0);
  sgd.step(grads);
  EXPECT_FLOAT_EQ(moved.in_proj_weight()(0, 0), before - 0.1f);
}

TEST(OptimizerLifetime, GradientsOfParametersThatNoLongerExistAreRefused) {
  attn::manual_seed(5);
  MultiHeadAttention<float> m(options());
  Gradients<float> grads(m.named_parameters());
  m = MultiHeadAttention<float>(options());
  const auto x = attn::test::random_tensor<float>(attn::Shape<3>{1, 3, 8}, 1);
  attn::Tensor<float, 3> out({1, 3, 8}), gx({1, 3, 8});
  attn::Workspace ws;
  attn::SavedForward<float> saved;
  m.forward(x.view(), out.view(), saved, ws);
  EXPECT_THAT(
      attn::test::thrown<ConfigError>([&] { m.backward(out.view(), saved, gx.view(), grads, ws); }),
      HasSubstr("no longer exist"));
  // A fresh Gradients of the new module works, and an optimizer refuses the old one.
  Gradients<float> fresh(m.named_parameters());
  EXPECT_NO_THROW(m.backward(out.view(), saved, gx.view(), fresh, ws));
  attn::optim::SGD<float> sgd(m.named_parameters(), sgd_options());
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { sgd.step(grads); }),
              HasSubstr("no longer exist"));
  EXPECT_NO_THROW(sgd.step(fresh));
}

}  // namespace

}  // namespace optimizer_lifetime_test

#include "support/bodies_end.hpp"
