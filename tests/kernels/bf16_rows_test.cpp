// SPDX-License-Identifier: MIT
// tests/kernels/bf16_rows_test.cpp: the avx512 set's vdpbf16ps kernels of a decode step's few
// query rows over bfloat16 keys and values (avx512/bf16_rows.inl), bit for bit against the
// instruction's definition (each pair of a lane: fma of the high elements, then of the low,
// subnormal inputs and results flushed to zero; tests/kernels/bf16_gemm_test.cpp checks that
// definition against the CPU) in the kernels' order: for the scores, each lane's pairs over
// the row's 32-element chunks, then the lanes' fixed tree; for P V, P rounded to bfloat16
// (vcvtne2ps2bf16), each column's pairs of keys in order from +0, then that tile's sum added
// to the accumulator. Also the edges: odd key counts, widths that are not whole vectors, rows
// of a group past `rows`, and the cases the kernel leaves to the widened form (not finite,
// too many rows, too wide). The attention through them: tests/attention/bf16_attention_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "attn/attn.hpp"
#include "support/test_support.hpp"

namespace bf16_rows_test {

namespace {

using attn::bfloat16;
using attn::Index;

#if ATTN_KERNELS_X86
bool runs_here() {
  const std::vector<attn::Isa> sets = attn::test::runnable_sets();
  return std::find(sets.begin(), sets.end(), attn::Isa::kAvx512) != sets.end() &&
         attn::detail::cpu_has_avx512_bf16();
}

// Subnormals as signed zeros (vdpbf16ps's reading of its inputs and writing of its results).
float flush(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }

// One lane's pair: acc + a1 b1, then + a0 b0, each an FMA, flushed.
float pair_step(float acc, float a0, float b0, float a1, float b1) {
  acc = flush(std::fma(flush(a1), flush(b1), flush(acc)));
  return flush(std::fma(flush(a0), flush(b0), acc));
}

// vcvtne2ps2bf16: a subnormal float reads as zero, then to nearest even.
float round_weight(float p) { return static_cast<float>(bfloat16(flush(p))); }

std::vector<bfloat16> random_rows(Index count, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<bfloat16> out(static_cast<std::size_t>(count));
  for (auto& x : out) x = bfloat16(dist(gen));
  return out;
}

// The score of key `key` (d elements) against query row `q`, times scale, in the kernel's
// order: lane l of chunk c takes the pair at 32 c + 2 l; the 16 lanes summed as sum_4x4()
// does ((l0 + l2) + (l1 + l3) within each group of 4, then (g0 + g1) + (g2 + g3)).
float expected_score(const bfloat16* q, const bfloat16* key, Index d, float scale) {
  float lane[16] = {};
  for (Index c = 0; c * 32 < d; ++c) {
    for (int l = 0; l < 16; ++l) {
      const Index e = 32 * c + 2 * l;
      const auto at = [&](const bfloat16* row, Index i) {
        return i < d ? static_cast<float>(row[i]) : 0.0f;
      };
      lane[l] = pair_step(lane[l], at(key, e), at(q, e), at(key, e + 1), at(q, e + 1));
    }
  }
  float group[4];
  for (int g = 0; g < 4; ++g) {
    const float* x = lane + 4 * g;
    group[g] = (x[0] + x[2]) + (x[1] + x[3]);
  }
  return ((group[0] + group[1]) + (group[2] + group[3])) * scale;
}

TEST(Bf16RowsKernels, ScoresHaveTheInstructionsBits) {
  if (!runs_here()) GTEST_SKIP() << "no avx512 set with AVX512-BF16 here";
  const float scale = 0.125f;
  for (const Index d : {Index(128), Index(64), Index(40), Index(96), Index(130)}) {
    for (const Index rows : {Index(1), Index(3), Index(4), Index(6)}) {
      for (const Index n : {Index(1), Index(3), Index(5), Index(128)}) {
        for (const bool packed : {true, false}) {
          if (packed && rows > 4) continue;
          SCOPED_TRACE(testing::Message() << "d " << d << " rows " << rows << " n " << n
                                          << (packed ? " packed" : " ld 16"));
          const Index k_rs = d + 8;  // rows not back to back
          const auto q = random_rows(rows * d, 1);
          const auto k = random_rows(n * k_rs, 2, 2.0f);
          std::vector<const bfloat16*> qr(static_cast<std::size_t>(rows));
          for (Index r = 0; r < rows; ++r) qr[static_cast<std::size_t>(r)] = q.data() + r * d;
          const Index ld = packed ? 4 : 16;
          const float sentinel = -12345.0f;
          std::vector<float> st(static_cast<std::size_t>((n + 3) * ld), sentinel);
          attn::kernels::avx512::dot_rows_scores(qr.data(), rows, k.data(), k_rs, d, n, scale,
                                                 st.data(), ld, attn::detail::KeyPrefetch());
          for (Index j = 0; j < n; ++j) {
            for (Index r = 0; r < rows; ++r) {
              const float want = expected_score(q.data() + r * d, k.data() + j * k_rs, d, scale);
              ASSERT_EQ(want, st[static_cast<std::size_t>(j * ld + r)])
                  << "key " << j << " row " << r;
            }
            // Columns past `rows`: untouched (ld 16) or the repeated row (packed).
            for (Index r = rows; r < (packed ? 0 : ld); ++r) {
              ASSERT_EQ(sentinel, st[static_cast<std::size_t>(j * ld + r)]);
            }
          }
          for (Index j = n; j < n + 3; ++j) {  // past n: not stored
            for (Index r = 0; r < ld; ++r)
              ASSERT_EQ(sentinel, st[static_cast<std::size_t>(j * ld + r)]);
          }
        }
      }
    }
  }
}

// P V as dot_rows_values() defines it, added into acc (rows, dv).
void expected_values(const std::vector<const bfloat16*>& v, Index n, Index dv, const float* pt,
                     Index ld, Index rows, std::vector<float>& acc) {
  for (Index i = 0; i < rows; ++i) {
    for (Index e = 0; e < dv; ++e) {
      float sum = 0.0f;
      for (Index t = 0; 2 * t < n; ++t) {
        const float w0 = round_weight(pt[2 * t * ld + i]);
        const float w1 = 2 * t + 1 < n ? round_weight(pt[(2 * t + 1) * ld + i]) : 0.0f;
        const float v0 = static_cast<float>(v[static_cast<std::size_t>(2 * t)][e]);
        const float v1 =
            2 * t + 1 < n ? static_cast<float>(v[static_cast<std::size_t>(2 * t + 1)][e]) : 0.0f;
        sum = pair_step(sum, v0, w0, v1, w1);
      }
      acc[static_cast<std::size_t>(i * dv + e)] += sum;
    }
  }
}

struct ValueCase {
  std::vector<bfloat16> rows_data;
  std::vector<const bfloat16*> v;
  std::vector<float> pt;
  std::vector<float> acc;
};

ValueCase value_case(Index n, Index dv, Index ld, Index rows, std::uint32_t seed) {
  ValueCase c;
  const Index v_rs = dv + 24;
  c.rows_data = random_rows(n * v_rs, seed);
  for (Index j = 0; j < n; ++j) c.v.push_back(c.rows_data.data() + j * v_rs);
  std::mt19937 gen(seed + 1);
  std::uniform_real_distribution<float> p(0.0f, 1.0f);
  c.pt.assign(static_cast<std::size_t>(n * ld), std::numeric_limits<float>::quiet_NaN());
  for (Index j = 0; j < n; ++j) {
    for (Index r = 0; r < rows; ++r) c.pt[static_cast<std::size_t>(j * ld + r)] = p(gen);
  }
  c.acc.resize(static_cast<std::size_t>(rows * dv));
  for (auto& x : c.acc) x = p(gen);
  return c;
}

TEST(Bf16RowsKernels, ValuesHaveTheInstructionsBits) {
  if (!runs_here()) GTEST_SKIP() << "no avx512 set with AVX512-BF16 here";
  for (const Index dv : {Index(128), Index(64), Index(40), Index(72), Index(200), Index(256)}) {
    for (const Index rows : {Index(1), Index(2), Index(4)}) {
      for (const Index n : {Index(1), Index(2), Index(7), Index(128)}) {
        for (const Index ld : {Index(4), Index(16)}) {
          SCOPED_TRACE(testing::Message()
                       << "dv " << dv << " rows " << rows << " n " << n << " ld " << ld);
          // The columns of p^T past `rows` are NaN: read, they would spoil the sums.
          ValueCase c = value_case(n, dv, ld, rows, static_cast<std::uint32_t>(dv + n));
          std::vector<float> want = c.acc;
          expected_values(c.v, n, dv, c.pt.data(), ld, rows, want);
          ASSERT_TRUE(attn::kernels::avx512::dot_rows_values(c.v.data(), n, dv, c.pt.data(), ld,
                                                             rows, c.acc.data()));
          for (std::size_t i = 0; i < want.size(); ++i) ASSERT_EQ(want[i], c.acc[i]) << i;
        }
      }
    }
  }
}

// Weights below 2^-126 (subnormal floats) read as zero, and tiny products flush: the
// definition's bits still.
TEST(Bf16RowsKernels, ValuesFlushSubnormalWeights) {
  if (!runs_here()) GTEST_SKIP() << "no avx512 set with AVX512-BF16 here";
  const Index n = 9, dv = 64, ld = 4, rows = 4;
  ValueCase c = value_case(n, dv, ld, rows, 77);
  for (Index j = 0; j < n; ++j) {
    for (Index r = 0; r < rows; ++r)
      c.pt[static_cast<std::size_t>(j * ld + r)] *= 0x1p-120f * float(j % 3 == 0 ? 1e-5 : 1);
  }
  std::vector<float> want = c.acc;
  expected_values(c.v, n, dv, c.pt.data(), ld, rows, want);
  ASSERT_TRUE(attn::kernels::avx512::dot_rows_values(c.v.data(), n, dv, c.pt.data(), ld, rows,
                                                     c.acc.data()));
  for (std::size_t i = 0; i < want.size(); ++i) ASSERT_EQ(want[i], c.acc[i]) << i;
}

// What the kernel leaves to the widened form: false, and the accumulator as it was.
TEST(Bf16RowsKernels, ValuesLeaveNonFiniteRowsAndWideOrManyRowsUntouched) {
  if (!runs_here()) GTEST_SKIP() << "no avx512 set with AVX512-BF16 here";
  const auto untouched = [](ValueCase& c, Index n, Index dv, Index ld, Index rows) {
    const std::vector<float> before = c.acc;
    EXPECT_FALSE(attn::kernels::avx512::dot_rows_values(c.v.data(), n, dv, c.pt.data(), ld, rows,
                                                        c.acc.data()));
    EXPECT_TRUE(before == c.acc);
  };
  {  // an infinity in a value row, in the second 64-column pass (the first is done by then)
    ValueCase c = value_case(6, 128, 4, 4, 5);
    const_cast<bfloat16*>(c.v[3])[100] = bfloat16(std::numeric_limits<float>::infinity());
    untouched(c, 6, 128, 4, 4);
  }
  {  // a NaN weight
    ValueCase c = value_case(6, 128, 4, 3, 6);
    c.pt[2 * 4 + 1] = std::numeric_limits<float>::quiet_NaN();
    untouched(c, 6, 128, 4, 3);
  }
  {  // a NaN value row where the weight is 0 (0 x NaN is NaN: the widened form skips it)
    ValueCase c = value_case(4, 64, 4, 2, 7);
    c.pt[3 * 4 + 0] = 0.0f, c.pt[3 * 4 + 1] = 0.0f;
    const_cast<bfloat16*>(c.v[3])[5] = bfloat16(std::numeric_limits<float>::quiet_NaN());
    untouched(c, 4, 64, 4, 2);
  }
  {  // wider than the kernel takes
    ValueCase c = value_case(3, 264, 4, 4, 8);
    untouched(c, 3, 264, 4, 4);
  }
  {  // more than 4 rows
    ValueCase c = value_case(3, 64, 16, 5, 9);
    untouched(c, 3, 64, 16, 5);
  }
}
#else
TEST(Bf16RowsKernels, ScoresHaveTheInstructionsBits) { GTEST_SKIP() << "x86 kernels only"; }
#endif

}  // namespace

}  // namespace bf16_rows_test
