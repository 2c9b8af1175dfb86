// SPDX-License-Identifier: MIT
// tests/kernels/bf16_gemm_test.cpp: detail::gemm_nt and pack_gemm_b on bfloat16 operands with
// float results, on every kernel set and every path the CPU has on the avx512 set (widening to
// float, AVX512-BF16's vdpbf16ps dot product, AMX's tdpbf16ps): against a double sum of the
// same bfloat16 inputs, bit for bit against a scalar model of each path's rounding, on shapes
// that are not multiples of the tiles (k odd, k = 1, head-split outputs), with B packed once
// or per call, for any thread count, and with NaN and infinity propagated as the float GEMM
// does. The same GEMM on float16 operands: the float GEMM on the widened values, bit for bit,
// on every set. The bfloat16 backward's staging transposes of its operands, on every set.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/ops/gemm.hpp"
#include "kernels/gemm_case.hpp"
#include "support/test_support.hpp"

namespace bf16_gemm_test {

namespace {

using attn::Bf16Path;
using attn::bfloat16;
using attn::float16;
using attn::Index;
using attn::Isa;

using attn::test::describe;
using attn::test::GemmCase;

// Against the blocking (96-row blocks, tiles of up to 768 columns, depth blocks of up to 512,
// 6 x 64 micro-tiles on AVX-512 and narrower ones elsewhere; the k-pair packing transposes
// blocks of 16 columns x 16 pairs).
const GemmCase kCases[] = {
    {1, 1, 1, 0, 0},                // smallest: one odd pair
    {5, 3, 1, 0, 0},                // k = 1: only the odd tail
    {7, 37, 19, 0, 0},              // everything ragged, k odd
    {13, 70, 34, 0, 0},             // a full 16-pair block plus one pair
    {97, 769, 513, 0, 0},           // one past every block; the second depth block is one element
    {30, 200, 1027, 0, 0},          // three depth blocks, the last odd
    {64, 2304, 96, 0, 0},           // the fused QKV width: three 768-column tiles
    {2 * 45, 3 * 64, 71, 45, 64},   // head-split output, k odd
    {3 * 33, 5 * 24, 33, 33, 24},   // segments narrower than a micro-panel
    {2 * 20, 25 * 40, 50, 20, 40},  // 512-column tiles cut a 40-wide segment
    {2 * 20, 6 * 8, 70, 20, 8},     // segments narrower than an AMX tile
    {2 * 10, 19 * 72, 40, 10, 72},  // 704-column tiles cut a 72-wide segment's 64-column
                                    // group 8 columns into a 16-column AMX tile
};

template <class Element>
struct OperandsOf {
  std::vector<Element> a, b;  // (m, lda) and (n, ldb), the columns past k poisoned
  std::vector<float> bias;
  Index lda, ldb;
  // The same values in another type (widened exactly to float).
  template <class Other>
  explicit OperandsOf(const OperandsOf<Other>& o)
      : a(o.a.begin(), o.a.end()),
        b(o.b.begin(), o.b.end()),
        bias(o.bias),
        lda(o.lda),
        ldb(o.ldb) {}
  explicit OperandsOf(const GemmCase& c)
      : lda(c.k + 3), ldb(c.k + 1) {  // odd and even leading dimensions
    const auto fa = attn::test::random_tensor<float, 1>({c.m * lda}, 11 + c.m);
    const auto fb = attn::test::random_tensor<float, 1>({c.n * ldb}, 23 + c.n);
    const auto fbias = attn::test::random_tensor<float, 1>({c.n}, 37 + c.k);
    for (Index i = 0; i < fa.size(); ++i) {
      a.push_back(i % lda < c.k ? Element(fa.data()[i])
                                : Element(std::numeric_limits<float>::quiet_NaN()));
    }
    for (Index i = 0; i < fb.size(); ++i) {
      b.push_back(i % ldb < c.k ? Element(fb.data()[i])
                                : Element(std::numeric_limits<float>::infinity()));
    }
    bias.assign(fbias.data(), fbias.data() + fbias.size());
  }
  float at_a(Index i, Index p) const { return a[static_cast<std::size_t>(i * lda + p)]; }
  float at_b(Index j, Index p) const { return b[static_cast<std::size_t>(j * ldb + p)]; }
};
using Operands = OperandsOf<bfloat16>;

// Runs gemm_nt into a buffer laid out as the case says; returns C as (m, n) row-major.
template <class Element>
std::vector<float> run(const GemmCase& c, const OperandsOf<Element>& ops, bool with_bias,
                       attn::detail::PackedB<Element> prepacked = {}) {
  attn::detail::GemmOutput<float> out;
  std::vector<float> buffer(static_cast<std::size_t>(c.m * c.n),
                            std::numeric_limits<float>::quiet_NaN());
  out.data = buffer.data();
  const Index segment = c.segment > 0 ? c.segment : c.n;
  const Index segments = c.n / segment;
  const Index rows = c.rows_per_batch > 0 ? c.rows_per_batch : c.m;
  if (c.segment > 0) {
    out = attn::detail::GemmOutput<float>::head_major(buffer.data(), rows, c.n, segment);
  } else {
    out.ldc = c.n;
  }
  attn::detail::gemm_nt(c.m, c.n, c.k, ops.a.data(), ops.lda, ops.b.data(), ops.ldb, out,
                        with_bias ? ops.bias.data() : static_cast<const float*>(nullptr),
                        prepacked);
  std::vector<float> result(buffer.size());
  for (Index i = 0; i < c.m; ++i) {
    for (Index j = 0; j < c.n; ++j) {
      result[static_cast<std::size_t>(i * c.n + j)] = buffer[static_cast<std::size_t>(
          (i / rows) * segments * rows * segment + (j / segment) * rows * segment +
          (i % rows) * segment + j % segment)];
    }
  }
  return result;
}

// The paths `isa` runs on this CPU: widening always; on the avx512 set the dot product where
// the CPU has AVX512-BF16 and AMX where the operating system grants it.
std::vector<Bf16Path> paths(Isa isa) {
  std::vector<Bf16Path> out{Bf16Path::kWiden};
  if (isa == Isa::kAvx512 && attn::detail::cpu_has_avx512_bf16()) out.push_back(Bf16Path::kDot);
  if (isa == Isa::kAvx512 && attn::detail::amx_support().usable) out.push_back(Bf16Path::kAmx);
  return out;
}

// Every runnable set and path, with `f(isa, path)` run while it is selected.
template <class F>
void for_each_path(F&& f) {
  for (const Isa isa : attn::test::runnable_sets()) {
    attn::set_isa(isa);
    for (const Bf16Path path : paths(isa)) {
      EXPECT_EQ(attn::set_bf16_path(path), path) << attn::isa_name(isa);
      SCOPED_TRACE(std::string(attn::isa_name(isa)) + " " + attn::bf16_path_name(path));
      f(isa, path);
    }
  }
}

// The kernel set, bf16 path and thread count a test sets are restored around every test by
// tests/support/test_main.cpp.
class Bf16Gemm : public ::testing::Test {};

bool sampled_row(Index i, Index m) {
  const Index r = i % 96;
  return r == 5 || r == 6 || r == 95 || i % 11 == 0 || i == m - 1;
}

TEST_F(Bf16Gemm, QueryAndSwitch) {
  for (const Isa isa : attn::test::runnable_sets()) {
    attn::set_isa(isa);
    const bool avx512 = isa == Isa::kAvx512;
    const bool dot = avx512 && attn::detail::cpu_has_avx512_bf16();
    const bool amx = avx512 && attn::detail::amx_support().usable;
    // By default the CPU's fastest path: AMX where it runs, else the dot product on AMD, else
    // widening.
    const Bf16Path fastest = amx                                           ? Bf16Path::kAmx
                             : dot && attn::detail::cpu_prefers_bf16_dot() ? Bf16Path::kDot
                                                                           : Bf16Path::kWiden;
    EXPECT_EQ(attn::set_bf16_path(std::nullopt), fastest) << attn::isa_name(isa);
    EXPECT_EQ(attn::bf16_path(), fastest);
    EXPECT_EQ(attn::set_bf16_path(Bf16Path::kWiden), Bf16Path::kWiden);
    EXPECT_EQ(attn::bf16_path(), Bf16Path::kWiden);
    // A path that cannot run falls back to widening.
    EXPECT_EQ(attn::set_bf16_path(Bf16Path::kDot), dot ? Bf16Path::kDot : Bf16Path::kWiden);
    EXPECT_EQ(attn::bf16_path_available(Bf16Path::kDot), dot);
    EXPECT_EQ(attn::set_bf16_path(Bf16Path::kAmx), amx ? Bf16Path::kAmx : Bf16Path::kWiden);
    EXPECT_EQ(attn::bf16_path_available(Bf16Path::kAmx), amx);
  }
  // The support query explains itself either way.
  const auto& support = attn::detail::amx_support();
  EXPECT_EQ(std::string(support.reason).empty(), support.usable) << support.reason;
}

// The exact sum of the same bfloat16 products (each exact in double, 16 significant bits; the
// double sum's own error, k 2^-53 relative, is negligible), against a bound on float
// accumulation: every path adds each product to a float accumulator with one rounding (an
// FMA, or an exact product and an add; vdpbf16ps is two FMAs per pair), or, on AMX, each
// tdpbf16ps rounds its 32 products' two sums of 16 (15 roundings each), their sum and its
// addition to the accumulator (32 roundings for 32 products, fewer for a shorter tail), then
// adds the bias and the depth blocks' partial sums: k + ceil(k / 512) <= k + 3 roundings here
// (k <= 1027).
// Each rounding is off by at most u = 2^-24 of the partial sum it rounds, and every partial
// sum is at most sum |a_p b_p| + |bias|, so |error| <= (k + 4) u (sum |a_p b_p| + |bias|)
// (to first order: (k + 4) u < 1e-4 here). The inputs have no subnormals, so the dot
// product's and AMX's flushing plays no part.
TEST_F(Bf16Gemm, MatchesADoubleSumOfTheSameInputsOnEveryPath) {
  for_each_path([&](Isa, Bf16Path) {
    for (const GemmCase& c : kCases) {
      const Operands ops(c);
      for (const bool with_bias : {true, false}) {
        const auto got = run(c, ops, with_bias);
        Index bad = 0;
        for (Index i = 0; i < c.m && bad < 5; ++i) {
          if (!sampled_row(i, c.m)) continue;
          for (Index j = 0; j < c.n && bad < 5; ++j) {
            double ref = with_bias ? static_cast<double>(ops.bias[static_cast<std::size_t>(j)]) : 0;
            double size = std::abs(ref);
            for (Index p = 0; p < c.k; ++p) {
              const double product =
                  static_cast<double>(ops.at_a(i, p)) * static_cast<double>(ops.at_b(j, p));
              ref += product;
              size += std::abs(product);
            }
            const double tol = static_cast<double>(c.k + 4) * std::ldexp(1.0, -24) * size;
            const double value = got[static_cast<std::size_t>(i * c.n + j)];
            if (!(std::abs(value - ref) <= tol)) {
              ADD_FAILURE() << describe(c) << " bias=" << with_bias << " at (" << i << ", " << j
                            << "): " << value << " vs " << ref << " (tolerance " << tol << ")";
              ++bad;
            }
          }
        }
      }
    }
  });
}

// ---- scalar models of the paths' rounding (docs/precision.md) ----

std::uint32_t bits(float x) {
  std::uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
// Subnormals as signed zeros: vdpbf16ps's reading of its inputs and writing of its results.
float flush(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }

// One element of C on the AMX path: per depth block, a float accumulator from +0 takes one
// tdpbf16ps per 32 depth (from the block's start; zeros past its end), each as measured on
// Emerald Rapids: the even-indexed products of the 16 pairs summed in k order into one float,
// the odd-indexed ones into another (each addition rounded to nearest even), those two sums
// added (rounded), and that added to the accumulator (rounded); subnormal inputs and results
// flushed to zero. Then the bias and the depth blocks as the other paths.
float amx_model(const Operands& ops, Index i, Index j, Index k, Index depth_block,
                const float* bias) {
  float c = 0;
  for (Index p0 = 0; p0 < k; p0 += depth_block) {
    const Index end = std::min(p0 + depth_block, k);
    float acc = 0;
    for (Index s = p0; s < end; s += 32) {
      float sums[2] = {0.0f, 0.0f};  // even, odd
      for (Index p = s; p < std::min(s + 32, end); ++p) {
        float& sum = sums[(p - s) % 2];
        sum = flush(std::fma(flush(ops.at_a(i, p)), flush(ops.at_b(j, p)), flush(sum)));
      }
      acc = flush(flush(acc) + flush(sums[0] + sums[1]));
    }
    const float block = acc + (bias != nullptr && p0 == 0 ? bias[j] : 0.0f);
    c = p0 == 0 ? block : block + c;
  }
  return c;
}

// One element of C on `path`: per depth block (the set's blocking), a float accumulator from
// +0 takes every product in one rounding, in k order (widening: fma(a, b, acc), the product
// exact), or in k-pairs as vdpbf16ps does (the odd element first, then the even one, each an
// FMA with subnormal inputs and results flushed to zero; an odd depth's last pair is
// (a, +0) x (b, +0)); the first block's sum then adds the bias (+0 without), each later one
// adds the previous C.
float model(const Operands& ops, Index i, Index j, Index k, Index depth_block, const float* bias,
            Bf16Path path) {
  const bool dot = path == Bf16Path::kDot;
  if (path == Bf16Path::kAmx) return amx_model(ops, i, j, k, depth_block, bias);
  float c = 0;
  for (Index p0 = 0; p0 < k; p0 += depth_block) {
    const Index depth = std::min(depth_block, k - p0);
    float acc = 0;
    if (!dot) {
      for (Index p = p0; p < p0 + depth; ++p) acc = std::fma(ops.at_a(i, p), ops.at_b(j, p), acc);
    } else {
      for (Index p = p0; p < p0 + depth; p += 2) {
        const bool pair = p + 1 < p0 + depth;
        const float a1 = pair ? ops.at_a(i, p + 1) : 0.0f, b1 = pair ? ops.at_b(j, p + 1) : 0.0f;
        acc = flush(std::fma(flush(a1), flush(b1), flush(acc)));
        acc = flush(std::fma(flush(ops.at_a(i, p)), flush(ops.at_b(j, p)), acc));
      }
    }
    const float block = acc + (bias != nullptr && p0 == 0 ? bias[j] : 0.0f);
    c = p0 == 0 ? block : block + c;
  }
  return c;
}

Index depth_block_of(Isa isa, Bf16Path path, Index k) {
  const Index limit = attn::detail::with_kernels(
      isa, [](auto set) { return decltype(set)::template gemm_depth<float>(); });
  return attn::detail::even_block(k, attn::detail::gemm_depth_limit(limit, path),
                                  attn::detail::gemm_depth_multiple(path));
}

// Every path gives exactly its model's bits on every set: the widening path because every
// product of two bfloat16 is exact in float (16 significant bits), so a set with FMA and one
// without round the same sums; the dot product as the Intel SDM defines vdpbf16ps; AMX as
// tdpbf16ps was measured to round (not the SDM's pseudocode: see amx_model()). The dot product
// and AMX also with inputs whose products and sums are subnormal (their flushing) and with
// subnormal inputs (there the widening path's products are no longer exact, and the sets
// without FMA round them).
TEST_F(Bf16Gemm, EveryPathGivesTheBitsOfItsScalarModel) {
  std::vector<GemmCase> cases(std::begin(kCases), std::end(kCases));
  cases.push_back({9, 70, 45, 0, 0});  // the tiny-value case below
  for_each_path([&](Isa isa, Bf16Path path) {
    const bool flushes = path != Bf16Path::kWiden;
    for (std::size_t index = 0; index < cases.size(); ++index) {
      const GemmCase& c = cases[index];
      Operands ops(c);
      if (index + 1 == cases.size()) {  // products near 2^-126..2^-140, some inputs subnormal
        for (bfloat16& x : ops.a) x = bfloat16(std::ldexp(static_cast<float>(x), -120));
        for (bfloat16& x : ops.b) x = bfloat16(std::ldexp(static_cast<float>(x), -12));
        ops.a[3] = bfloat16::from_bits(0x0041);  // subnormal
        ops.b[ops.ldb + 2] = bfloat16::from_bits(0x8003);
      }
      if (index + 1 == cases.size() && !flushes) continue;
      const Index depth_block = depth_block_of(isa, path, c.k);
      for (const bool with_bias : {true, false}) {
        const float* bias = with_bias ? ops.bias.data() : nullptr;
        if (index + 1 == cases.size() && with_bias) continue;  // the bias would hide the tiny sums
        const auto got = run(c, ops, with_bias);
        Index bad = 0;
        for (Index i = 0; i < c.m && bad < 5; ++i) {
          if (!sampled_row(i, c.m)) continue;
          for (Index j = 0; j < c.n && bad < 5; ++j) {
            const float want = model(ops, i, j, c.k, depth_block, bias, path);
            const float value = got[static_cast<std::size_t>(i * c.n + j)];
            if (bits(value) != bits(want)) {
              ADD_FAILURE() << describe(c) << " bias=" << with_bias << " at (" << i << ", " << j
                            << "): " << value << " vs the model's " << want;
              ++bad;
            }
          }
        }
      }
    }
  });
}

TEST_F(Bf16Gemm, BitIdenticalForAnyThreadCount) {
  for_each_path([&](Isa, Bf16Path) {
    for (const GemmCase& c : kCases) {
      const Operands ops(c);
      attn::set_num_threads(1);
      const auto one = run(c, ops, true);
      for (const int threads : {2, 3}) {
        attn::set_num_threads(threads);
        EXPECT_EQ(run(c, ops, true), one) << describe(c) << " threads=" << threads;
      }
    }
  });
}

// B packed once gives C bit for bit as packing per call, alone or as a run of segments inside
// a larger pack; a pack made for the other path (or set) is ignored, not misread.
TEST_F(Bf16Gemm, PrePackedBIsBitIdenticalToPackingPerCall) {
  for_each_path([&](Isa isa, Bf16Path path) {
    for (const GemmCase& c : kCases) {
      const Operands ops(c);
      const Index segment = c.segment > 0 ? c.segment : c.n;
      attn::set_num_threads(1);
      const auto expected = run(c, ops, true);
      const auto alone =
          attn::detail::pack_gemm_b(c.n, c.k, ops.b.data(), ops.ldb, c.segment > 0 ? segment : 0);
      EXPECT_EQ(alone.path(), path);
      std::vector<bfloat16> big(static_cast<std::size_t>((c.n + 2 * segment) * ops.ldb),
                                bfloat16(7.0f));
      std::copy(ops.b.begin(), ops.b.end(), big.begin() + segment * ops.ldb);
      const auto inside =
          attn::detail::pack_gemm_b(c.n + 2 * segment, c.k, big.data(), ops.ldb, segment);
      for (const int threads : {1, 2}) {
        attn::set_num_threads(threads);
        EXPECT_EQ(run(c, ops, true, {&alone, 0}), expected)
            << describe(c) << " threads=" << threads;
        EXPECT_EQ(run(c, ops, true, {&inside, segment}), expected)
            << describe(c) << " inside a larger pack, threads=" << threads;
      }
      attn::set_num_threads(1);
      for (const Bf16Path other_path : paths(isa)) {
        if (other_path == path) continue;
        // The pack of another path: ignored, so C is this path's per-call result.
        attn::set_bf16_path(other_path);
        const auto other = attn::detail::pack_gemm_b(c.n, c.k, ops.b.data(), ops.ldb, 0);
        attn::set_bf16_path(path);
        EXPECT_EQ(other.path(), other_path);
        if (c.segment == 0) {
          EXPECT_EQ(run(c, ops, true, {&other, 0}), expected)
              << describe(c) << " with a pack for " << attn::bf16_path_name(other_path);
        }
      }
    }
  });
}

// NaN and infinity in A or B reach C as in the float GEMM (and the double sum of the same
// products): a NaN makes its row or column NaN, an infinity times a nonzero finite value an
// infinity of the product's sign, infinity times zero and infinities of both signs NaN.
TEST_F(Bf16Gemm, PropagatesNanAndInfinityAsTheFloatGemm) {
  const GemmCase c{9, 70, 37, 0, 0};
  Operands ops(c);
  const float inf = std::numeric_limits<float>::infinity();
  const auto set_a = [&](Index i, Index p, float v) {
    ops.a[static_cast<std::size_t>(i * ops.lda + p)] = bfloat16(v);
  };
  const auto set_b = [&](Index j, Index p, float v) {
    ops.b[static_cast<std::size_t>(j * ops.ldb + p)] = bfloat16(v);
  };
  set_a(1, 3, std::numeric_limits<float>::quiet_NaN());  // row 1 NaN
  set_a(2, 5, inf);                                      // row 2 +-inf ...
  set_b(4, 5, 0.0f);                                     // ... but NaN at (2, 4): inf * 0
  set_b(6, 36, -inf);                                    // column 6 -+inf (p = 36: the odd tail)
  set_a(2, 36, 0.5f);                                    // (2, 6): inf + -inf: NaN
  set_b(6, 5, 1.0f);
  set_a(7, 0, -inf);  // row 7 +-inf, but NaN at (7, 8): -inf * 1 + 1 * inf
  set_b(8, 0, 1.0f);
  set_a(7, 1, 1.0f);
  set_b(8, 1, inf);
  for_each_path([&](Isa, Bf16Path) {
    attn::set_num_threads(1);
    const auto got = run(c, ops, true);
    // The float GEMM on the same values, widened.
    std::vector<float> fa(ops.a.begin(), ops.a.end()), fb(ops.b.begin(), ops.b.end());
    std::vector<float> want(static_cast<std::size_t>(c.m * c.n));
    attn::detail::gemm_nt(c.m, c.n, c.k, fa.data(), ops.lda, fb.data(), ops.ldb, want.data(), c.n,
                          ops.bias.data());
    Index nan = 0, infinite = 0;
    for (Index i = 0; i < c.m; ++i) {
      for (Index j = 0; j < c.n; ++j) {
        const float g = got[static_cast<std::size_t>(i * c.n + j)];
        const float w = want[static_cast<std::size_t>(i * c.n + j)];
        double ref = ops.bias[static_cast<std::size_t>(j)];
        for (Index p = 0; p < c.k; ++p) {
          ref += static_cast<double>(ops.at_a(i, p)) * static_cast<double>(ops.at_b(j, p));
        }
        EXPECT_EQ(std::isnan(g), std::isnan(w)) << "(" << i << ", " << j << "): " << g << " " << w;
        EXPECT_EQ(std::isnan(g), std::isnan(ref)) << "(" << i << ", " << j << ")";
        if (std::isinf(w) || std::isinf(ref)) {
          EXPECT_EQ(g, w) << "(" << i << ", " << j << ")";
          EXPECT_EQ(g, ref) << "(" << i << ", " << j << ")";
        }
        nan += std::isnan(g);
        infinite += std::isinf(g);
      }
    }
    EXPECT_GE(nan, c.n + 3);  // row 1, (2, 4), (2, 6), (7, 8)
    EXPECT_GE(infinite, c.n + c.m - 6);
  });
}

// The rounded form the bfloat16 modules project with (gemm_nt_rounded): each float result
// rounded once, to nearest even, into a bfloat16 C in the GemmOutput's layout, on every path.
// The AMX path rounds as it stores (not through the float buffer): the bits must still be the
// float GEMM's result rounded by the scalar rule, with a bias, head-split and narrow segments,
// two depth blocks (the second adds the first's C before rounding) and a NaN row.
TEST_F(Bf16Gemm, RoundedProductRoundsTheFloatResultOnceOnEveryPath) {
  const GemmCase cases[] = {kCases[4], kCases[7], kCases[8], kCases[9], kCases[10]};
  for_each_path([&](Isa, Bf16Path) {
    for (const GemmCase& c : cases) {
      Operands ops(c);
      ops.a[1] = bfloat16(std::numeric_limits<float>::quiet_NaN());  // row 0 all NaN
      const std::vector<bfloat16> bias16(ops.bias.begin(), ops.bias.end());
      const std::vector<float> bias_wide(bias16.begin(), bias16.end());
      const Index segment = c.segment > 0 ? c.segment : c.n;
      const Index rows = c.rows_per_batch > 0 ? c.rows_per_batch : c.m;
      const auto layout = [&](float* w) {
        return c.segment > 0 ? attn::detail::GemmOutput<float>::head_major(w, rows, c.n, segment)
                             : attn::detail::GemmOutput<float>::row_major(w, c.n);
      };
      std::vector<float> want(static_cast<std::size_t>(c.m * c.n));
      attn::detail::gemm_nt(c.m, c.n, c.k, ops.a.data(), ops.lda, ops.b.data(), ops.ldb,
                            layout(want.data()), bias_wide.data());
      std::vector<bfloat16> got(want.size());
      attn::Workspace ws;
      attn::detail::gemm_nt_rounded(c.m, c.n, c.k, ops.a.data(), ops.lda, ops.b.data(), ops.ldb,
                                    got.data(), layout, bias16.data(),
                                    attn::detail::PackedB<bfloat16>{}, ws);
      for (std::size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(got[i].bits(), bfloat16(want[i]).bits()) << describe(c) << " at " << i;
      }
    }
  });
}

// C of 8 MiB or more goes to memory with non-temporal stores on the AMX path (run_gemm()):
// the same bits as a product too small for them (a 40-column slice of B: each element of C
// depends only on its row of A and column of B), float and rounded to bfloat16, on the
// avx512 set's paths. 2056 x 2048: a float C of 16 MiB, a bfloat16 one of 8 MiB, both
// 64-byte aligned (so that whole vectors, and pairs of them rounded into 64 bytes of bfloat16,
// take the non-temporal stores).
TEST_F(Bf16Gemm, LargeOutputsGiveTheBitsOfSmallOnes) {
  const std::vector<Isa> sets = attn::test::runnable_sets();
  if (std::find(sets.begin(), sets.end(), Isa::kAvx512) == sets.end()) {
    GTEST_SKIP() << "the avx512 set does not run here";
  }
  attn::set_isa(Isa::kAvx512);
  const GemmCase c{2056, 2048, 40, 0, 0};
  const Operands ops(c);
  const std::vector<bfloat16> bias16(ops.bias.begin(), ops.bias.end());
  const std::vector<float> bias_wide(bias16.begin(), bias16.end());
  for (const Bf16Path path : paths(Isa::kAvx512)) {
    attn::set_bf16_path(path);
    SCOPED_TRACE(attn::bf16_path_name(path));
    const std::size_t size = static_cast<std::size_t>(c.m * c.n);
    const attn::detail::AlignedBuffer<float> big(size);
    attn::detail::gemm_nt(c.m, c.n, c.k, ops.a.data(), ops.lda, ops.b.data(), ops.ldb, big.data(),
                          c.n, bias_wide.data());
    const Index j0 = 1000, width = 40;
    std::vector<float> slice(static_cast<std::size_t>(c.m * width));
    attn::detail::gemm_nt(c.m, width, c.k, ops.a.data(), ops.lda, ops.b.data() + j0 * ops.ldb,
                          ops.ldb, slice.data(), width, bias_wide.data() + j0);
    for (Index i = 0; i < c.m; ++i) {
      for (Index j = 0; j < width; ++j) {
        ASSERT_EQ(bits(big.data()[i * c.n + j0 + j]),
                  bits(slice[static_cast<std::size_t>(i * width + j)]))
            << "at (" << i << ", " << j0 + j << ")";
      }
    }
    const attn::detail::AlignedBuffer<bfloat16> rounded(size);
    attn::Workspace ws;
    attn::detail::gemm_nt_rounded(
        c.m, c.n, c.k, ops.a.data(), ops.lda, ops.b.data(), ops.ldb, rounded.data(),
        [&](float* w) { return attn::detail::GemmOutput<float>::row_major(w, c.n); }, bias16.data(),
        attn::detail::PackedB<bfloat16>{}, ws);
    for (std::size_t i = 0; i < size; ++i) {
      ASSERT_EQ(rounded.data()[i].bits(), bfloat16(big.data()[i]).bits()) << "at " << i;
    }
  }
  attn::set_bf16_path(std::nullopt);
}

// ---- float16 operands ----

// float16 operands are widened to float on every set (vcvtph2ps on the avx2 and avx512 sets,
// integer steps on SSE2, the scalar rule on the scalar set) into the float GEMM's blocking and
// micro-kernel. A product of two float16 values has at most 22 significant bits and lies in
// [2^-48, 2^32], so it is exact in float: the sets with FMA and without give the same sums,
// and C is the float GEMM's on the widened values bit for bit, on every set, with B packed
// per call or once, for 1 or 2 threads, with the head-split layout, subnormal float16 inputs
// (their products stay normal floats) and a NaN (quiet, payload kept) and infinities past k
// that must not be read.
// The bfloat16 backward's staging transposes (detail::transpose_tiles, the set's
// transpose_16bit()): every element moved exactly, on every set, for shapes of whole 32 x 32
// tiles (the avx512 set's register transposes), ragged edges and single rows or columns,
// with leading dimensions wider than the rows; the padding past each row stays untouched.
TEST_F(Bf16Gemm, StagingTransposeMovesEveryElementOnEverySet) {
  const Index shapes[][2] = {{64, 96}, {96, 64}, {33, 70}, {70, 33}, {1, 5}, {5, 1}, {32, 32}};
  for (const Isa isa : attn::test::runnable_sets()) {
    attn::set_isa(isa);
    for (const auto& shape : shapes) {
      const Index rows = shape[0], cols = shape[1], lds = cols + 3, ldd = rows + 5;
      std::vector<bfloat16> src(static_cast<std::size_t>(rows * lds));
      for (std::size_t e = 0; e < src.size(); ++e) {  // distinct bit patterns
        src[e] = bfloat16::from_bits(static_cast<std::uint16_t>(e * 40503u + 17u));
      }
      const bfloat16 pad = bfloat16::from_bits(0x7fc1);
      std::vector<bfloat16> dst(static_cast<std::size_t>(cols * ldd), pad);
      attn::detail::transpose_tiles(rows, cols, src.data(), lds, dst.data(), ldd);
      Index wrong = 0;
      for (Index c = 0; c < cols; ++c) {
        for (Index r = 0; r < ldd; ++r) {
          const bfloat16 want = r < rows ? src[static_cast<std::size_t>(r * lds + c)] : pad;
          wrong += dst[static_cast<std::size_t>(c * ldd + r)].bits() != want.bits();
        }
      }
      EXPECT_EQ(wrong, 0) << attn::isa_name(isa) << " " << rows << " x " << cols;
    }
  }
}

TEST_F(Bf16Gemm, Float16IsTheFloatGemmOnTheWidenedValues) {
  for (const Isa isa : attn::test::runnable_sets()) {
    attn::set_isa(isa);
    SCOPED_TRACE(attn::isa_name(isa));
    for (const GemmCase& c : kCases) {
      OperandsOf<float16> ops(c);
      if (c.k > 2) ops.a[2] = float16::from_bits(0x0003);  // subnormals
      if (c.n > 1) ops.b[static_cast<std::size_t>(ops.ldb)] = float16::from_bits(0x83FF);
      const OperandsOf<float> wide(ops);
      const Index segment = c.segment > 0 ? c.segment : c.n;
      const auto pack =
          attn::detail::pack_gemm_b(c.n, c.k, ops.b.data(), ops.ldb, c.segment > 0 ? segment : 0);
      EXPECT_EQ(pack.path(), Bf16Path::kWiden);
      for (const bool with_bias : {true, false}) {
        attn::set_num_threads(1);
        const auto want = run(c, wide, with_bias);
        EXPECT_EQ(run(c, ops, with_bias), want) << describe(c) << " bias=" << with_bias;
        attn::set_num_threads(2);
        EXPECT_EQ(run(c, ops, with_bias, {&pack, 0}), want)
            << describe(c) << " packed, 2 threads, bias=" << with_bias;
      }
    }
  }
}

// The rounded form the float16 modules project with: C = round(A B^T + bias) to float16,
// each float result rounded once, to nearest even (the float GEMM's result rounded by the
// scalar rule), in any layout the GemmOutput gives.
TEST_F(Bf16Gemm, Float16RoundedProductRoundsTheFloatResultOnce) {
  const GemmCase c{37, 70, 45, 0, 0};
  const OperandsOf<float16> ops(c);
  const OperandsOf<float> wide(ops);
  std::vector<float16> bias16(ops.bias.begin(), ops.bias.end());
  for (float16& x : bias16) x = float16(static_cast<float>(x));
  std::vector<float> bias_wide(bias16.begin(), bias16.end());
  for (const Isa isa : attn::test::runnable_sets()) {
    attn::set_isa(isa);
    std::vector<float> want(static_cast<std::size_t>(c.m * c.n));
    attn::detail::gemm_nt(c.m, c.n, c.k, wide.a.data(), ops.lda, wide.b.data(), ops.ldb,
                          want.data(), c.n, bias_wide.data());
    std::vector<float16> got(want.size());
    attn::Workspace ws;
    attn::detail::gemm_nt_rounded(
        c.m, c.n, c.k, ops.a.data(), ops.lda, ops.b.data(), ops.ldb, got.data(),
        [&](float* w) { return attn::detail::GemmOutput<float>::row_major(w, c.n); }, bias16.data(),
        attn::detail::PackedB<float16>{}, ws);
    for (std::size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i].bits(), float16(want[i]).bits()) << attn::isa_name(isa) << " " << i;
    }
  }
}

}  // namespace
}  // namespace bf16_gemm_test
