// SPDX-License-Identifier: MIT
// tests/nn/rope_range_test.cpp: RotaryEmbedding refuses a theta whose tables are not finite in
// the scalar type they are computed in. theta = 1e-50 is finite and positive as a double (the
// only check there was), but 0 as a float: 1 / 0^e is infinite and the angle 0 * inf NaN, so
// every output of a module with such a RoPE was NaN with no error. The tables are checked in
// the arithmetic that builds them: theta, each inverse frequency, and the angle of the last
// position, for both scalar types; a module carrying such a RoPE is refused when built.
// (In double every finite positive theta gives finite tables for any position that fits in
// memory; the same checks run there.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "attn/attn.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace rope_range_test {

namespace {

using attn::ConfigError;
using attn::Index;
using attn::RopeStyle;
using attn::RotaryEmbedding;
using attn::RotaryOptions;
using ::testing::AllOf;
using ::testing::HasSubstr;

template <class Scalar>
void make(double theta, Index max_positions = 16) {
  RotaryEmbedding<Scalar>(RotaryOptions{8, 0, theta, RopeStyle::kHalfSplit, max_positions});
}

TEST(RopeRange, ThetaThatUnderflowsInFloatIsRefused) {
  EXPECT_THAT(attn::test::thrown<ConfigError>([] { make<float>(1e-50); }),
              AllOf(HasSubstr("theta=1e-50"), HasSubstr("float")));
  EXPECT_THAT(attn::test::thrown<ConfigError>([] { make<float>(1e39); }),  // infinite as a float
              AllOf(HasSubstr("theta=1e+39"), HasSubstr("float")));
  // Representable (a subnormal float), but the angles past position 77935 overflow float.
  EXPECT_NO_THROW(make<float>(1e-45, 16));
  EXPECT_THAT(
      attn::test::thrown<ConfigError>([] { make<float>(1e-45, 1 << 17); }),
      AllOf(HasSubstr("theta=1e-45"), HasSubstr("float"), HasSubstr("max_positions=131072")));
}

TEST(RopeRange, EveryTableEntryIsFiniteForThetasThatPass) {
  for (const double theta : {1e-30, 1e-6, 0.5, 1.0, 10000.0, 5e5, 1e30}) {
    SCOPED_TRACE(theta);
    const RotaryEmbedding<float> f(RotaryOptions{8, 0, theta, RopeStyle::kHalfSplit, 64});
    const RotaryEmbedding<double> d(RotaryOptions{8, 0, theta, RopeStyle::kHalfSplit, 64});
    for (Index p = 0; p < 64; ++p) {
      for (Index i = 0; i < 4; ++i) {
        ASSERT_TRUE(std::isfinite(f.cos_row(p)[i]) && std::isfinite(f.sin_row(p)[i])) << p;
        ASSERT_TRUE(std::isfinite(d.cos_row(p)[i]) && std::isfinite(d.sin_row(p)[i])) << p;
      }
    }
  }
}

TEST(RopeRange, GrowingTheTablesChecksTheNewAngles) {
  RotaryEmbedding<float> r(RotaryOptions{8, 0, 1e-45, RopeStyle::kHalfSplit, 1});
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { r.reserve_positions(1 << 17); }),
              HasSubstr("max_positions=131072"));
  EXPECT_EQ(r.max_positions(), 1);  // unchanged
}

TEST(RopeRange, AModuleWithSuchARopeIsRefusedWhenBuilt) {
  attn::MultiHeadAttentionOptions o;
  o.d_in = 16;
  o.num_heads = 2;
  o.causal = true;
  o.rope = RotaryOptions{8, 0, 1e-50, RopeStyle::kHalfSplit, 32};
  EXPECT_THROW(attn::MultiHeadAttention<float>{o}, ConfigError);
  EXPECT_NO_THROW(attn::MultiHeadAttention<double>{o});  // 1e-50 is fine in double
}

}  // namespace

}  // namespace rope_range_test

#include "support/bodies_end.hpp"
