// SPDX-License-Identifier: MIT
// tests/tensor/overlap_test.cpp: attn/tensor/overlap.hpp, the address-range tests behind
// the checks that keep an output from overwriting what a call still reads.
#include "attn/tensor/overlap.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "attn/attn.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace overlap_test {

namespace {

using attn::Index;
using attn::Tensor;
using attn::TensorView;
using attn::detail::has_internal_overlap;
using attn::detail::overlaps;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(Overlap, ByteRangeCoversFirstToLastElement) {
  float x[24] = {};
  const TensorView<float, 2> every_other(x + 1, {3, 4}, {8, 2});  // last element x[1 + 16 + 6]
  const auto range = attn::detail::byte_range(every_other);
  EXPECT_EQ(range.begin, reinterpret_cast<std::uintptr_t>(x + 1));
  EXPECT_EQ(range.end, reinterpret_cast<std::uintptr_t>(x + 24));
  const auto empty = attn::detail::byte_range(TensorView<float, 2>(x, {0, 4}));
  EXPECT_EQ(empty.begin, empty.end);
}

TEST(Overlap, RangesThatShareAByteOverlap) {
  Tensor<float, 2> t({4, 6});
  const auto v = t.view();
  EXPECT_TRUE(overlaps(v, v));
  EXPECT_TRUE(overlaps(attn::slice(v, 0, 0, 2), attn::slice(v, 0, 1, 3)));
  EXPECT_FALSE(overlaps(attn::slice(v, 0, 0, 2), attn::slice(v, 0, 2, 4)));  // adjacent rows
  // the last row of one and the first of the other touch, without sharing a byte
  EXPECT_FALSE(overlaps(attn::slice(v, 0, 3, 4), attn::slice(v, 0, 0, 3)));
  // interleaved columns share no element, but their ranges cross: counted as overlapping
  EXPECT_TRUE(overlaps(attn::slice(v, 1, 0, 3), attn::slice(v, 1, 3, 6)));
  // empty views overlap nothing, whatever their pointer
  EXPECT_FALSE(overlaps(attn::slice(v, 0, 1, 1), v));
  // element types may differ (a mask against an output)
  const TensorView<const bool, 1> bytes(reinterpret_cast<const bool*>(t.data() + 5), {2});
  EXPECT_TRUE(overlaps(v, bytes));
  Tensor<float, 2> other({4, 6});
  EXPECT_FALSE(overlaps(v, other.view()));
}

TEST(Overlap, HugeStridesSaturateInsteadOfWrapping) {
  float x = 0;
  const Index huge = std::numeric_limits<Index>::max() / 2;
  const TensorView<float, 2> far(&x, {2, 2}, {huge, huge});  // reaches past the address space
  const auto range = attn::detail::byte_range(far);
  EXPECT_EQ(range.end, std::numeric_limits<std::uintptr_t>::max());
  float y[2] = {};
  // it overlaps whatever lies above its start
  EXPECT_EQ(overlaps(far, TensorView<float, 1>(y, {2})),
            reinterpret_cast<std::uintptr_t>(&x) < reinterpret_cast<std::uintptr_t>(y + 2));
}

TEST(Overlap, InternalOverlapMeansTwoIndicesShareAnElement) {
  Tensor<float, 3> t({2, 3, 4});
  const auto v = t.view();
  EXPECT_FALSE(has_internal_overlap(v));
  EXPECT_FALSE(has_internal_overlap(attn::permute(v, {2, 0, 1})));
  EXPECT_FALSE(has_internal_overlap(attn::slice(v, 2, 1, 3)));
  EXPECT_FALSE(has_internal_overlap(attn::unsqueeze(v, 1)));
  float x[12] = {};
  // a zero stride on an axis longer than 1: a broadcast
  EXPECT_TRUE(has_internal_overlap(TensorView<float, 2>(x, {3, 4}, {0, 1})));
  // ... but not on an axis of extent 1
  EXPECT_FALSE(has_internal_overlap(TensorView<float, 2>(x, {1, 4}, {0, 1})));
  // rows that overlap: row stride 2 with 4 columns
  EXPECT_TRUE(has_internal_overlap(TensorView<float, 2>(x, {3, 4}, {2, 1})));
  // a transposed 2 x 2 matrix: offsets 0, 2, 1, 3
  EXPECT_FALSE(has_internal_overlap(TensorView<float, 2>(x, {2, 2}, {1, 2})));
  // conservative: strides (2, 3) over (3, 2) give offsets 0, 3, 2, 5, 4, 7, all distinct, but
  // stride 3 does not clear the span 4 of the other axis, so it counts as overlapping
  EXPECT_TRUE(has_internal_overlap(TensorView<float, 2>(x, {3, 2}, {2, 3})));
  EXPECT_FALSE(has_internal_overlap(TensorView<float, 2>(x, {0, 4}, {0, 0})));  // empty
}

TEST(Overlap, RequireDisjointNamesBothViews) {
  Tensor<float, 2> t({4, 6});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                attn::detail::require_disjoint("f", "out", attn::slice(t.view(), 0, 0, 2), "k",
                                               attn::slice(t.view(), 0, 1, 4));
              }),
              HasSubstr("attn::f: out (2, 6) overlaps k (3, 6)"));
  float x[4] = {};
  EXPECT_THAT(
      attn::test::thrown<attn::ShapeError>([&] {
        attn::detail::require_distinct_elements("f", "out",
                                                TensorView<float, 2>(x, {3, 4}, {0, 1}));
      }),
      AllOf(HasSubstr("out has shape (3, 4) and strides (0, 1)"), HasSubstr("share memory")));
}

}  // namespace

}  // namespace overlap_test

#include "support/bodies_end.hpp"
