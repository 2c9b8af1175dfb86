// SPDX-License-Identifier: MIT
// tests/nn/simd_test.cpp: the SIMD layer's partial loads and stores (detail/simd.hpp), for
// every count from below zero to past the register width. A count of zero or less must
// touch no lane: the micro-kernel asks for register columns that lie wholly past a ragged
// tile's edge. (The AVX-512 mask once shifted by the negative count: UBSan flagged it, and
// x86's shift, which keeps only the low bits of the count, read whole registers past the
// edge.)
#include "attn/detail/simd.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "attn/attn.hpp"
#include "support/scalar_types.hpp"

namespace {

using attn::Index;

template <class Scalar>
class SimdTest : public ::testing::Test {};
TYPED_TEST_SUITE(SimdTest, attn::test::ScalarTypes, );

TYPED_TEST(SimdTest, PartialLoadsAndStoresTouchExactlyTheFirstNLanes) {
  using Scalar = TypeParam;
  using V = attn::detail::simd::Vec<Scalar>;
  constexpr Index W = V::kWidth;
  for (Index n = -2 * W; n <= 2 * W; ++n) {
    const Index valid = n < 0 ? 0 : (n > W ? W : n);
    // Load: lanes past n hold a sentinel in memory, so a load that reads them shows it.
    std::vector<Scalar> src(static_cast<std::size_t>(W), Scalar(99));
    for (Index i = 0; i < valid; ++i) src[static_cast<std::size_t>(i)] = Scalar(i + 1);
    alignas(64) Scalar lanes[W];
    V::store(lanes, V::load_partial(src.data(), n));
    // Store: the destination past n keeps its old value.
    std::vector<Scalar> dst(static_cast<std::size_t>(W), Scalar(-1));
    V::store_partial(dst.data(), V::load(src.data()), n);
    for (Index i = 0; i < W; ++i) {
      const auto at = static_cast<std::size_t>(i);
      EXPECT_EQ(lanes[i], i < valid ? Scalar(i + 1) : Scalar(0)) << "load n=" << n << " lane " << i;
      EXPECT_EQ(dst[at], i < valid ? src[at] : Scalar(-1)) << "store n=" << n << " lane " << i;
    }
  }
}

}  // namespace
