// SPDX-License-Identifier: MIT
// tests/parity/init_parity_test.cpp: attn::manual_seed + constructors reproduce PyTorch's
// initial weights bit for bit (nn.MultiheadAttention, nn.Linear; float and double).
#include <gtest/gtest.h>

#include "attn/attn.hpp"
#include "fixtures/pytorch/init_cases.hpp"
#include "parity/parity_support.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace init_parity_test {

// Known failures (library issues, reported; not worked around here):
// - MhaInitDouble: attn's xavier bound sqrt(6 / (fan_in + fan_out)) differs in the last bit
//   from torch's sqrt(3) * sqrt(2 / (fan_in + fan_out)) for some sizes (e.g. 48, 64), so most
//   double draws differ by an ulp.
// - Every double case in a build without FMA contraction (Debug -O0, or no -march=native):
//   torch's AVX2 uniform_ kernel evaluates x * (to - from) + from with an FMA, and
//   TorchGenerator::uniform<double> matches it only when the compiler contracts the same
//   expression.

namespace {

using attn::test::pytorch::bit_equal;
using attn::test::pytorch::CaseName;
using attn::test::pytorch::linear_init_cases;
using attn::test::pytorch::LinearInitCase;
using attn::test::pytorch::mha_init_cases;
using attn::test::pytorch::MhaInitCase;
using attn::test::pytorch::view;

template <class S>
attn::MultiHeadAttentionOptions options_of(const MhaInitCase<S>& c) {
  return attn::MultiHeadAttentionOptions::pytorch(c.embed_dim, c.num_heads, c.bias, c.kdim, c.vdim);
}

// Every parameter of `mha` equals the fixture's bit for bit.
template <class S>
void expect_mha_parameters(const attn::MultiHeadAttention<S>& mha, const MhaInitCase<S>& c) {
  if (c.in_proj_weight.present()) {
    EXPECT_TRUE(bit_equal(mha.in_proj_weight(), c.in_proj_weight, "in_proj_weight"));
  } else {
    EXPECT_TRUE(bit_equal(mha.q_proj_weight(), c.q_proj_weight, "q_proj_weight"));
    EXPECT_TRUE(bit_equal(mha.k_proj_weight(), c.k_proj_weight, "k_proj_weight"));
    EXPECT_TRUE(bit_equal(mha.v_proj_weight(), c.v_proj_weight, "v_proj_weight"));
  }
  EXPECT_TRUE(bit_equal(mha.out_proj().weight(), c.out_proj_weight, "out_proj.weight"));
  if (c.bias) {
    EXPECT_TRUE(bit_equal(mha.in_proj_bias(), c.in_proj_bias, "in_proj_bias"));
    EXPECT_TRUE(bit_equal(mha.out_proj().bias(), c.out_proj_bias, "out_proj.bias"));
  } else {
    EXPECT_TRUE(mha.in_proj_bias().empty());
    EXPECT_FALSE(mha.out_proj().has_bias());
  }
}

template <class S>
void check_mha_global_seed(const MhaInitCase<S>& c) {
  attn::manual_seed(c.seed);
  const attn::MultiHeadAttention<S> mha(options_of(c));
  expect_mha_parameters(mha, c);
}

template <class S>
void check_mha_generator(const MhaInitCase<S>& c) {
  attn::TorchGenerator gen(c.seed);
  const attn::MultiHeadAttention<S> mha(options_of(c), gen);
  expect_mha_parameters(mha, c);
}

template <class S>
void check_linear(const LinearInitCase<S>& c) {
  attn::manual_seed(c.seed);
  const attn::Linear<S> linear(c.in_features, c.out_features, c.bias);
  EXPECT_TRUE(bit_equal(linear.weight(), c.weight, "weight"));
  if (c.bias) {
    EXPECT_TRUE(bit_equal(linear.bias(), c.bias_values, "bias"));
  } else {
    EXPECT_FALSE(linear.has_bias());
  }
  attn::TorchGenerator gen(c.seed);
  const attn::Linear<S> from_generator(c.in_features, c.out_features, c.bias, gen);
  EXPECT_TRUE(bit_equal(from_generator.weight(), c.weight, "weight (explicit generator)"));
}

class MhaInitFloat : public ::testing::TestWithParam<MhaInitCase<float>> {};
TEST_P(MhaInitFloat, GlobalSeedReproducesPyTorch) { check_mha_global_seed(GetParam()); }
TEST_P(MhaInitFloat, GeneratorReproducesPyTorch) { check_mha_generator(GetParam()); }
INSTANTIATE_TEST_SUITE_P(PyTorch, MhaInitFloat, ::testing::ValuesIn(mha_init_cases<float>()),
                         CaseName{});

class MhaInitDouble : public ::testing::TestWithParam<MhaInitCase<double>> {};
TEST_P(MhaInitDouble, GlobalSeedReproducesPyTorch) { check_mha_global_seed(GetParam()); }
TEST_P(MhaInitDouble, GeneratorReproducesPyTorch) { check_mha_generator(GetParam()); }
INSTANTIATE_TEST_SUITE_P(PyTorch, MhaInitDouble, ::testing::ValuesIn(mha_init_cases<double>()),
                         CaseName{});

class LinearInitFloat : public ::testing::TestWithParam<LinearInitCase<float>> {};
TEST_P(LinearInitFloat, SeedReproducesPyTorch) { check_linear(GetParam()); }
INSTANTIATE_TEST_SUITE_P(PyTorch, LinearInitFloat, ::testing::ValuesIn(linear_init_cases<float>()),
                         CaseName{});

class LinearInitDouble : public ::testing::TestWithParam<LinearInitCase<double>> {};
TEST_P(LinearInitDouble, SeedReproducesPyTorch) { check_linear(GetParam()); }
INSTANTIATE_TEST_SUITE_P(PyTorch, LinearInitDouble,
                         ::testing::ValuesIn(linear_init_cases<double>()), CaseName{});

}  // namespace

}  // namespace init_parity_test

#include "support/bodies_end.hpp"
