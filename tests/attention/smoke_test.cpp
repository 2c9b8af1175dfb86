// SPDX-License-Identifier: MIT
// tests/attention/smoke_test.cpp: the notebook modules reproduce the notebook from seed 123.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "attn/attn.hpp"
#include "support/test_support.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace smoke_test {

namespace {

using ::testing::FloatNear;
using ::testing::Pointwise;

TEST(Smoke, CausalAttentionFromSeed123MatchesNotebook) {
  const auto x = attn::Tensor<float, 2>::from_rows({{0.43f, 0.15f, 0.89f},
                                                    {0.55f, 0.87f, 0.66f},
                                                    {0.57f, 0.85f, 0.64f},
                                                    {0.22f, 0.58f, 0.33f},
                                                    {0.77f, 0.25f, 0.10f},
                                                    {0.05f, 0.80f, 0.55f}});
  attn::manual_seed(123);
  attn::CausalAttention<float> ca(3, 2, 6, 0.0);
  const auto y = ca.forward(x.view());
  EXPECT_THAT(attn::test::row(y, 0), Pointwise(FloatNear(1e-4f), {-0.4519f, 0.2216f}));
  EXPECT_THAT(attn::test::row(y, 5), Pointwise(FloatNear(1e-4f), {-0.5299f, -0.1081f}));
}

}  // namespace

}  // namespace smoke_test

#include "support/bodies_end.hpp"
