// SPDX-License-Identifier: MIT
// tests/nn/gemm_test.cpp: detail::gemm_nt, the packed GEMM behind Linear and the Q/K/V and
// output projections, on shapes that cross every blocking boundary (several column tiles
// of unequal remainder, several depth blocks, ragged micro-tiles, head-split segments that
// are not a multiple of the micro-panel width), against a long double loop, and
// bit-identical for any thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/detail/gemm.hpp"
#include "support/scalar_types.hpp"
#include "support/test_support.hpp"

namespace {

using attn::Index;

struct GemmCase {
  Index m, n, k;
  Index rows_per_batch;  // 0: plain row-major output
  Index segment;         // 0: one segment
};

std::string describe(const GemmCase& c) {
  return "m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
         " rows_per_batch=" + std::to_string(c.rows_per_batch) +
         " segment=" + std::to_string(c.segment);
}

// Shapes chosen against gemm.hpp's blocking (96-row blocks, tiles of up to 768 columns
// split evenly, depth blocks of up to 512 split evenly, 6 x micro_cols() micro-tiles).
const GemmCase kCases[] = {
    {1, 1, 1, 0, 0},          // smallest
    {7, 37, 19, 0, 0},        // everything ragged, one block
    {97, 769, 513, 0, 0},     // one past every block: 2 row blocks, 2 tiles, 2 depth blocks
    {200, 1536, 64, 0, 0},    // two full tiles, shallow
    {130, 1100, 1300, 0, 0},  // uneven tiles, three depth blocks
    {64, 2304, 768, 0, 0},    // the T2048 D768 fused QKV width and depth
    // Head-split output (B, S, T, segment): segments that do and do not divide the
    // micro-panel width, rows split into batches.
    {2 * 45, 3 * 64, 70, 45, 64},
    {3 * 33, 5 * 24, 33, 33, 24},
    {2 * 50, 7 * 40, 600, 50, 40},
    {2 * 20, 25 * 40, 50, 20, 40},  // 512-column tiles cut a 40-wide segment at column 512
};

template <class Scalar>
struct Operands {
  attn::Tensor<Scalar, 2> a, b;
  attn::Tensor<Scalar, 1> bias;
  explicit Operands(const GemmCase& c)
      : a(attn::test::random_tensor<Scalar, 2>({c.m, c.k}, 11 + c.m)),
        b(attn::test::random_tensor<Scalar, 2>({c.n, c.k}, 23 + c.n)),
        bias(attn::test::random_tensor<Scalar, 1>({c.n}, 37 + c.k)) {}
};

// Runs gemm_nt into a buffer laid out as the case says; returns C as (m, n) row-major.
template <class Scalar>
std::vector<Scalar> run(const GemmCase& c, const Operands<Scalar>& ops, bool with_bias,
                        attn::detail::PackedB<Scalar> prepacked = {}) {
  attn::detail::GemmOutput<Scalar> out;
  std::vector<Scalar> buffer(static_cast<std::size_t>(c.m * c.n),
                             std::numeric_limits<Scalar>::quiet_NaN());
  out.data = buffer.data();
  const Index segment = c.segment > 0 ? c.segment : c.n;
  const Index segments = c.n / segment;
  const Index rows = c.rows_per_batch > 0 ? c.rows_per_batch : c.m;
  if (c.segment > 0) {
    out.ldc = segment;
    out.rows_per_batch = rows;
    out.batch_stride = segments * rows * segment;
    out.segment = segment;
    out.segment_stride = rows * segment;
  } else {
    out.ldc = c.n;
  }
  attn::detail::gemm_nt<Scalar>(c.m, c.n, c.k, ops.a.data(), c.k, ops.b.data(), c.k, out,
                                with_bias ? ops.bias.data() : nullptr, prepacked);
  std::vector<Scalar> result(buffer.size());
  for (Index i = 0; i < c.m; ++i) {
    for (Index j = 0; j < c.n; ++j) {
      result[static_cast<std::size_t>(i * c.n + j)] =
          buffer[static_cast<std::size_t>((i / rows) * segments * rows * segment +
                                          (j / segment) * rows * segment + (i % rows) * segment +
                                          j % segment)];
    }
  }
  return result;
}

template <class Scalar>
class GemmTest : public ::testing::Test {};
TYPED_TEST_SUITE(GemmTest, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

TYPED_TEST(GemmTest, MatchesALongDoubleLoopAcrossEveryBlockBoundary) {
  using Scalar = TypeParam;
  for (const GemmCase& c : kCases) {
    const Operands<Scalar> ops(c);
    for (const bool with_bias : {true, false}) {
      const auto got = run(c, ops, with_bias);
      const double tol = attn::test::reduction_tolerance<Scalar>(c.k);
      Index bad = 0;
      // Every column; rows on both sides of the first micro-tile and of each row block,
      // every 11th and the last (the long double loop is slow, and the sanitizer build
      // runs this too).
      // Raw row pointers: element access through views costs more than the GEMM at -O0.
      const Scalar* a = ops.a.data();
      const Scalar* b = ops.b.data();
      for (Index i = 0; i < c.m && bad < 5; ++i) {
        const Index r = i % 96;
        if (r != 5 && r != 6 && r != 95 && i % 11 != 0 && i != c.m - 1) continue;
        for (Index j = 0; j < c.n && bad < 5; ++j) {
          long double ref = with_bias ? static_cast<long double>(ops.bias.data()[j]) : 0.0L;
          const Scalar* ai = a + i * c.k;
          const Scalar* bj = b + j * c.k;
          for (Index p = 0; p < c.k; ++p) {
            ref += static_cast<long double>(ai[p]) * static_cast<long double>(bj[p]);
          }
          const double value = static_cast<double>(got[static_cast<std::size_t>(i * c.n + j)]);
          const double expected = static_cast<double>(ref);
          if (!(std::abs(value - expected) <= tol * (1.0 + std::abs(expected)))) {
            ADD_FAILURE() << describe(c) << " bias=" << with_bias << " at (" << i << ", " << j
                          << "): " << value << " vs " << expected;
            ++bad;
          }
        }
      }
    }
  }
}

TYPED_TEST(GemmTest, BitIdenticalForAnyThreadCount) {
  using Scalar = TypeParam;
  const int saved = attn::num_threads();
  for (const GemmCase& c : kCases) {
    const Operands<Scalar> ops(c);
    attn::set_num_threads(1);
    const auto one = run(c, ops, true);
    for (const int threads : {2, 3}) {
      attn::set_num_threads(threads);
      EXPECT_EQ(run(c, ops, true), one) << describe(c) << " threads=" << threads;
    }
  }
  attn::set_num_threads(saved);
}

// A B packed once (what a frozen layer holds) gives C bit for bit as packing per call,
// also when the product uses a run of segments inside a larger pack (one projection of a
// fused [W_q; W_k; W_v]): the pack's column groups then differ from the tile's, which must
// not change any element's arithmetic.
TYPED_TEST(GemmTest, PrePackedBIsBitIdenticalToPackingPerCall) {
  using Scalar = TypeParam;
  const int saved = attn::num_threads();
  for (const GemmCase& c : kCases) {
    const Operands<Scalar> ops(c);
    const Index segment = c.segment > 0 ? c.segment : c.n;
    attn::set_num_threads(1);
    const auto expected = run(c, ops, true);
    // B alone, and B as rows [segment, segment + n) of a larger matrix.
    const attn::detail::PackedGemmB<Scalar> alone =
        attn::detail::pack_gemm_b(c.n, c.k, ops.b.data(), c.k, segment);
    attn::Tensor<Scalar, 2> big({c.n + 2 * segment, c.k});
    big.fill(Scalar(7));
    attn::copy(ops.b.view(), attn::slice(big.view(), 0, segment, segment + c.n));
    const attn::detail::PackedGemmB<Scalar> inside =
        attn::detail::pack_gemm_b(big.extent(0), c.k, big.data(), c.k, segment);
    for (const int threads : {1, 2, 3}) {
      attn::set_num_threads(threads);
      EXPECT_EQ(run(c, ops, true, {&alone, 0}), expected) << describe(c) << " threads=" << threads;
      EXPECT_EQ(run(c, ops, true, {&inside, segment}), expected)
          << describe(c) << " inside a larger pack, threads=" << threads;
    }
  }
  attn::set_num_threads(saved);
}

}  // namespace
