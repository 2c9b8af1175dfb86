// SPDX-License-Identifier: MIT
// tests/nn/exp_subnormal_test.cpp: exp on every kernel set this CPU runs gives the subnormal
// result where the true exp is subnormal, instead of 0: the float exp once flushed
// everything below ln(FLT_MIN) = -87.34 to 0 (exp(-87.4) is 1.07e-38, a subnormal), on all
// four sets, against the promise (docs/accuracy.md) of about 1 ulp. Seen through the public softmax
// (whose weights are exp(x - max) / sum, and sum = 1 here, so a weight is exp itself): each
// subnormal weight is within one subnormal step (2^-149 in float, 2^-1074 in double) of the
// correctly rounded value, and exp is exactly 0 only below ln(2^-150) (float) or ln(2^-1075)
// (double), where the correctly rounded result is 0.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "support/scalar_types.hpp"
#include "support/test_support.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace exp_subnormal_test {

namespace {

using attn::Index;

template <class Scalar>
class ExpSubnormal : public ::testing::Test {};
TYPED_TEST_SUITE(ExpSubnormal, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

/// softmax of a row {0, x, x, ...} of n entries on the active set: the weights of x.
template <class Scalar>
std::vector<Scalar> tiny_weights(Scalar x, Index n) {
  attn::Tensor<Scalar, 1> row({n});
  row(0) = Scalar(0);
  for (Index j = 1; j < n; ++j) row(j) = x;
  attn::softmax_(row.view());
  std::vector<Scalar> out;
  for (Index j = 1; j < n; ++j) out.push_back(row(j));
  return out;
}

TYPED_TEST(ExpSubnormal, ResultsInTheSubnormalRangeAreNotFlushedToZero) {
  using Scalar = TypeParam;
  using Limits = std::numeric_limits<Scalar>;
  const bool is_float = std::is_same_v<Scalar, float>;
  // From just below ln(min normal) to just above ln(min subnormal / 2).
  const std::vector<double> xs =
      is_float ? std::vector<double>{-87.4, -88.0, -90.5, -95.0, -100.0, -102.5, -103.9}
               : std::vector<double>{-708.5, -709.0, -715.0, -725.0, -735.0, -744.0};
  const long double step = Limits::denorm_min();  // one subnormal ulp
  for (const attn::Isa isa : attn::test::runnable_sets()) {
    attn::set_isa(isa);
    for (const double xd : xs) {
      const auto x = static_cast<Scalar>(xd);
      const long double exact = std::exp(static_cast<long double>(x));
      ASSERT_LT(exact, static_cast<long double>(Limits::min()));  // a subnormal result
      // n = 2 runs the tail path only; 70 entries whole vectors of every width too.
      for (const Index n : {Index(2), Index(70)}) {
        for (const Scalar w : tiny_weights(x, n)) {
          EXPECT_GT(w, Scalar(0)) << attn::isa_name(isa) << " exp(" << xd << ") flushed to 0";
          EXPECT_LE(std::fabs(static_cast<long double>(w) - exact), step)
              << attn::isa_name(isa) << " exp(" << xd << ") = " << w << ", exact "
              << static_cast<double>(exact);
        }
      }
    }
  }
  attn::set_isa(attn::best_isa());
}

TYPED_TEST(ExpSubnormal, BelowHalfTheSmallestSubnormalTheResultIsZero) {
  using Scalar = TypeParam;
  const bool is_float = std::is_same_v<Scalar, float>;
  const std::vector<double> xs = is_float ? std::vector<double>{-104.0, -110.0, -1e4}
                                          : std::vector<double>{-745.2, -800.0, -1e6};
  for (const attn::Isa isa : attn::test::runnable_sets()) {
    attn::set_isa(isa);
    for (const double xd : xs) {
      for (const Scalar w : tiny_weights(static_cast<Scalar>(xd), 70)) {
        EXPECT_EQ(w, Scalar(0)) << attn::isa_name(isa) << " exp(" << xd << ")";
      }
    }
  }
  attn::set_isa(attn::best_isa());
}

}  // namespace

}  // namespace exp_subnormal_test

#include "support/bodies_end.hpp"
