// SPDX-License-Identifier: MIT
// tests/kernels/gemm_test.cpp: detail::gemm_nt, the packed GEMM behind Linear and the Q/K/V and
// output projections, and its backward forms gemm_nn (dX = dY W, dW = dY^T X, A row-major
// or head-major, plain or transposed) and column_sums (bias gradients), on shapes that cross every
// blocking boundary (several column tiles of unequal remainder, several depth blocks, ragged
// micro-tiles, head-split segments that are not a multiple of the micro-panel width), against a
// long double loop, and bit-identical for any thread count.
#include "attn/ops/gemm.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attn/attn.hpp"
#include "kernels/gemm_case.hpp"
#include "support/scalar_types.hpp"
#include "support/test_support.hpp"

namespace gemm_test {

namespace {

using attn::Index;
using attn::Isa;

using attn::test::describe;
using attn::test::GemmCase;

// Shapes chosen against gemm.hpp's blocking (96-row blocks, tiles of up to 768 columns, or
// 512 on CPUs with a 2 MiB L2 other than AMD's, split evenly, depth blocks of up to 512 split
// evenly, 6 x micro_cols() micro-tiles).
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
      result[static_cast<std::size_t>(i * c.n + j)] = buffer[static_cast<std::size_t>(
          (i / rows) * segments * rows * segment + (j / segment) * rows * segment +
          (i % rows) * segment + j % segment)];
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

// ---- the backward forms: C (+)= op(A) B with B stored (k, n) ----

struct NnCase {
  Index m, n, k;
  bool transposed;       // op(A) = A^T, A stored (k, m)
  Index rows_per_batch;  // A's stored layout: 0 plain row-major, else head-major
  Index segment;         // of A's stored columns
};

std::string describe(const NnCase& c) {
  return "m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
         (c.transposed ? " A^T" : " A") + " rows_per_batch=" + std::to_string(c.rows_per_batch) +
         " segment=" + std::to_string(c.segment);
}

// dX = dY W shapes (A (tokens, out), plain or head-major (B, S, T, hd)) and dW = dY^T X shapes
// (k = tokens, A^T of a plain or head-major dY), across the same blocking boundaries as above.
const NnCase kNnCases[] = {
    {1, 1, 1, false, 0, 0},
    {7, 37, 19, false, 0, 0},
    {97, 769, 513, false, 0, 0},          // 2 row blocks, 2 tiles, 2 depth blocks
    {2 * 45, 70, 3 * 64, false, 45, 64},  // dX of a fused projection: head-major dQKV
    {3 * 33, 50, 5 * 24, false, 33, 24},
    {37, 19, 7, true, 0, 0},
    {130, 1100, 1300, true, 0, 0},       // dW, k = 1300 tokens in three depth blocks
    {3 * 64, 70, 2 * 45, true, 45, 64},  // dW of a fused projection: (3 D, d_in) += dQKV^T X
    {5 * 24, 50, 3 * 33, true, 33, 24},
    {6 * 40, 33, 2 * 300, true, 300, 40},  // 600 tokens: two depth blocks crossing a batch
};

// A's storage and its layout; element (i, j) of the stored (rows, cols) matrix is at(i, j).
template <class Scalar>
struct StoredA {
  std::vector<Scalar> data;
  attn::detail::GemmOutput<const Scalar> layout;
  Index rows, cols;
  Index offset(Index i, Index j) const {
    const Index seg = layout.segment > 0 ? layout.segment : cols;
    return layout.row(i) - data.data() + layout.column(j, seg);
  }
  Scalar at(Index i, Index j) const { return data[static_cast<std::size_t>(offset(i, j))]; }
};

template <class Scalar>
StoredA<Scalar> stored_a(const NnCase& c) {
  StoredA<Scalar> a;
  a.rows = c.transposed ? c.k : c.m;
  a.cols = c.transposed ? c.m : c.k;
  const auto values = attn::test::random_tensor<Scalar, 1>({a.rows * a.cols}, 5 + c.m * c.k);
  a.data.assign(values.data(), values.data() + values.size());
  a.layout.data = a.data.data();
  if (c.rows_per_batch > 0) {
    a.layout.ldc = c.segment;
    a.layout.rows_per_batch = c.rows_per_batch;
    a.layout.batch_stride = c.rows_per_batch * a.cols;
    a.layout.segment = c.segment;
    a.layout.segment_stride = c.rows_per_batch * c.segment;
  } else {
    a.layout.ldc = a.cols;
  }
  return a;
}

// C (m, n) row-major with leading dimension n + 3, starting from `initial`.
template <class Scalar>
std::vector<Scalar> run_nn(const NnCase& c, const StoredA<Scalar>& a,
                           const attn::Tensor<Scalar, 2>& b, const std::vector<Scalar>& initial,
                           bool accumulate) {
  std::vector<Scalar> out = initial;
  attn::detail::gemm_nn<Scalar>(c.m, c.n, c.k, a.layout, c.transposed, b.data(), c.n,
                                attn::detail::GemmOutput<Scalar>::row_major(out.data(), c.n + 3),
                                accumulate);
  return out;
}

class GemmBackwardForms : public ::testing::Test {
 protected:
  void TearDown() override {
    attn::set_isa(attn::best_isa());
    attn::set_num_threads(threads_);
  }
  int threads_ = attn::num_threads();
};

template <class Scalar>
void check_nn_against_loop() {
  const std::vector<Isa> sets = attn::test::runnable_sets();
  for (const NnCase& c : kNnCases) {
    const StoredA<Scalar> a = stored_a<Scalar>(c);
    const auto b = attn::test::random_tensor<Scalar, 2>({c.k, c.n}, 17 + c.n);
    const auto init = attn::test::random_tensor<Scalar, 1>({c.m * (c.n + 3)}, 3);
    const std::vector<Scalar> initial(init.data(), init.data() + init.size());
    const double tol = attn::test::reduction_tolerance<Scalar>(c.k + 1);
    for (const bool accumulate : {false, true}) {
      // The sampled elements and their long-double sums, computed once for every set: rows
      // 5, 6 and 95 of each 96, every 7th and the last; in them every 5th column, both sides
      // of each micro-panel edge and the last two; the 3 columns past each row stay untouched.
      std::vector<std::pair<std::size_t, double>> expected;
      for (Index i = 0; i < c.m; ++i) {
        const Index r = i % 96;
        if (r != 5 && r != 6 && r != 95 && i % 7 != 0 && i != c.m - 1) continue;
        for (Index j = 0; j < c.n + 3; ++j) {
          const std::size_t o = static_cast<std::size_t>(i * (c.n + 3) + j);
          if (j >= c.n) {
            expected.emplace_back(o, static_cast<double>(initial[o]));
            continue;
          }
          if (j % 5 != 0 && j % 16 > 1 && j % 16 < 15 && j < c.n - 2) continue;
          long double ref = accumulate ? static_cast<long double>(initial[o]) : 0.0L;
          const Scalar* b_col = b.data() + j;  // B (k, n) row-major: B(p, j) = b_col[p n]
          for (Index p = 0; p < c.k; ++p) {
            const Scalar av = c.transposed ? a.at(p, i) : a.at(i, p);
            ref += static_cast<long double>(av) * static_cast<long double>(b_col[p * c.n]);
          }
          expected.emplace_back(o, static_cast<double>(ref));
        }
      }
      for (const Isa isa : sets) {
        attn::set_isa(isa);
        const auto got = run_nn(c, a, b, initial, accumulate);
        Index bad = 0;
        for (const auto& [o, want] : expected) {
          const Index j = static_cast<Index>(o) % (c.n + 3);
          if (j >= c.n) {  // past the row: untouched
            EXPECT_EQ(got[o], initial[o]);
            continue;
          }
          if (!(std::abs(static_cast<double>(got[o]) - want) <= tol * (1.0 + std::abs(want)))) {
            ADD_FAILURE() << describe(c) << " set " << attn::isa_name(isa)
                          << " accumulate=" << accumulate << " at ("
                          << static_cast<Index>(o) / (c.n + 3) << ", " << j << "): " << got[o]
                          << " vs " << want;
            if (++bad == 5) break;
          }
        }
      }
    }
  }
}

TEST_F(GemmBackwardForms, MatchLongDoubleLoopsOnEverySet) {
  check_nn_against_loop<float>();
  check_nn_against_loop<double>();
}

template <class Scalar>
void check_nn_threads() {
  for (const Isa isa : attn::test::runnable_sets()) {
    attn::set_isa(isa);
    for (const NnCase& c : kNnCases) {
      const StoredA<Scalar> a = stored_a<Scalar>(c);
      const auto b = attn::test::random_tensor<Scalar, 2>({c.k, c.n}, 17 + c.n);
      const std::vector<Scalar> initial(static_cast<std::size_t>(c.m * (c.n + 3)), Scalar(0.5));
      attn::set_num_threads(1);
      const auto one = run_nn(c, a, b, initial, true);
      for (const int threads : {2, 3}) {
        attn::set_num_threads(threads);
        EXPECT_EQ(run_nn(c, a, b, initial, true), one)
            << describe(c) << " set " << attn::isa_name(isa) << " threads=" << threads;
      }
    }
  }
}

TEST_F(GemmBackwardForms, BitIdenticalForAnyThreadCount) {
  check_nn_threads<float>();
  check_nn_threads<double>();
}

// A transposed product reads the same numbers as the plain one on the transposed matrix:
// A^T B with A stored (k, m) equals A' B with A' = A^T stored (m, k), bit for bit (the
// micro-kernel sums each element over p in the same order either way).
TEST_F(GemmBackwardForms, TransposedAIsBitIdenticalToATransposedCopy) {
  using Scalar = float;
  for (const NnCase& c : kNnCases) {
    if (!c.transposed) continue;
    const StoredA<Scalar> a = stored_a<Scalar>(c);
    NnCase plain{c.m, c.n, c.k, false, 0, 0};
    StoredA<Scalar> copy = stored_a<Scalar>(plain);
    for (Index i = 0; i < c.m; ++i) {
      for (Index p = 0; p < c.k; ++p) copy.data[static_cast<std::size_t>(i * c.k + p)] = a.at(p, i);
    }
    const auto b = attn::test::random_tensor<Scalar, 2>({c.k, c.n}, 17 + c.n);
    const std::vector<Scalar> initial(static_cast<std::size_t>(c.m * (c.n + 3)), Scalar(0));
    EXPECT_EQ(run_nn(c, a, b, initial, false), run_nn(plain, copy, b, initial, false))
        << describe(c);
  }
}

TEST_F(GemmBackwardForms, ColumnSumsAddEveryRowInOrder) {
  using Scalar = double;
  for (const Isa isa : attn::test::runnable_sets()) {
    attn::set_isa(isa);
    for (const NnCase& c : kNnCases) {
      // the stored A of the case as an (rows, cols) matrix: plain or head-major
      const StoredA<Scalar> a = stored_a<Scalar>(c);
      std::vector<Scalar> sums(static_cast<std::size_t>(a.cols), Scalar(0.25));
      attn::detail::column_sums<Scalar>(a.rows, a.cols, a.layout, sums.data());
      for (Index j = 0; j < a.cols; ++j) {
        long double ref = 0.25L;
        for (Index i = 0; i < a.rows; ++i) ref += static_cast<long double>(a.at(i, j));
        EXPECT_NEAR(sums[static_cast<std::size_t>(j)], static_cast<double>(ref),
                    attn::test::reduction_tolerance<Scalar>(a.rows) * (1 + std::abs(double(ref))))
            << describe(c) << " set " << attn::isa_name(isa) << " column " << j;
      }
    }
  }
}

// The blocking follows the L2 the CPU reports: AMD keeps the tiles measured on Zen whatever
// its L2, as do CPUs with less than 2 MiB of it or that report none; a 2 MiB L2 of another
// vendor (Emerald Rapids) takes the widest tile whose packed panel fills half of it. The depth
// never follows the L2: it orders the sums, and a kernel set gives the same bits on every CPU.
// (micro-panel width, word bytes, L2 bytes, AMD) -> rows, cols, depth.
TEST(GemmBlocking, FollowsTheCacheSizesTheCpuReports) {
  constexpr long kMiB = 1L << 20;
  struct Row {
    Index micro_cols, word_bytes;
    long l2;
    bool amd;
    Index rows, cols, depth;
  };
  const Row table[] = {
      {64, 4, kMiB, true, 96, 768, 512},       // Zen 4 / 5, avx512 set, float
      {64, 4, 2 * kMiB, true, 96, 768, 512},   // AMD with a larger L2: as measured on Zen
      {64, 4, 2 * kMiB, false, 96, 512, 512},  // Emerald Rapids, float: 512 x 512 x 4 = 1 MiB
      {32, 8, 2 * kMiB, false, 96, 256, 512},  // the same, double: 256 x 512 x 8 = 1 MiB
      {16, 4, 2 * kMiB, false, 96, 512, 512},  // the avx2 set there
      {64, 4, 0, false, 96, 768, 512},         // nothing reported: the constants
      {16, 4, kMiB / 2, false, 96, 768, 512},  // the 512 KiB AVX2 machine
      {64, 4, kMiB / 4, false, 96, 768, 512},  // 256 KiB: the same depth as everywhere
      {8, 8, 2 * kMiB, false, 96, 256, 512},   // 8 doubles: 2048 deep clamped to 512
  };
  for (const Row& r : table) {
    const attn::detail::GemmBlocking b =
        attn::detail::gemm_blocking(r.micro_cols, r.word_bytes, r.l2, r.amd);
    EXPECT_EQ(b.rows, r.rows) << r.micro_cols << " x " << r.word_bytes << " B, L2 " << r.l2;
    EXPECT_EQ(b.cols, r.cols) << r.micro_cols << " x " << r.word_bytes << " B, L2 " << r.l2;
    EXPECT_EQ(b.depth, r.depth) << r.micro_cols << " x " << r.word_bytes << " B, L2 " << r.l2;
  }
  // This CPU's: whole micro-panels per tile, on every set.
  for (const Isa isa : attn::test::runnable_sets()) {
    const attn::detail::GemmBlocking b = attn::detail::with_kernels(
        isa, [](auto set) { return decltype(set)::template gemm_blocking<float>(); });
    const Index group = attn::detail::with_kernels(
        isa, [](auto set) { return decltype(set)::template micro_cols<float>(); });
    EXPECT_EQ(b.cols % group, 0) << attn::isa_name(isa);
    EXPECT_GE(b.depth, 128) << attn::isa_name(isa);
    EXPECT_LE(b.depth, 512) << attn::isa_name(isa);
  }
}

}  // namespace

}  // namespace gemm_test
