// SPDX-License-Identifier: MIT
// tests/kernels/simd_test.cpp: every kernel set's primitives (attn/kernels/<set>/vec.inl) that the
// kernels rely on beyond plain arithmetic, for each set this CPU runs:
//  - partial loads and stores, for every count from below zero to past the register width.
//    A count of zero or less must touch no lane: the micro-kernel asks for register columns
//    that lie wholly past a ragged tile's edge. (The AVX-512 mask once shifted by the
//    negative count: UBSan flagged it, and x86's shift, which keeps only the low bits of the
//    count, read whole registers past the edge.)
//  - exp: accuracy against long double (subnormal results included), and IEEE's edges.
//    NaN must stay NaN: the AVX2 and AVX-512 exp once clamped NaN to 88.4 and returned
//    2.4e38, so a NaN key got weight 1 and every query returned that key's value, finite
// The helpers that touch registers are compiled inside each set's target region (like the
// kernels themselves); the test bodies only see arrays.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attn/attn.hpp"
#include "attn/kernels/dispatch.hpp"
#include "support/scalar_types.hpp"
#include "support/test_support.hpp"

namespace simd_test {

namespace {

using attn::Index;
using attn::Isa;

// Per set: one partial load and one partial store of n lanes, exp over an array, and
// vexp_normal() and vexp_nonpositive() over an array.
#define ATTN_SIMD_TEST_HELPERS(set)                                                           \
  namespace set##_helpers {                                                                   \
    template <class Scalar>                                                                   \
    int width() {                                                                             \
      return attn::kernels::set::Vec<Scalar>::kWidth;                                         \
    }                                                                                         \
    template <class Scalar>                                                                   \
    void partial(const Scalar* src, Index n, Scalar* loaded, Scalar* dst) {                   \
      using V = attn::kernels::set::Vec<Scalar>;                                              \
      V::store(loaded, V::load_partial(src, n));                                              \
      V::store_partial(dst, V::load(src), n);                                                 \
    }                                                                                         \
    template <class Scalar>                                                                   \
    void exp_array(const Scalar* x, Scalar* y, Index n) {                                     \
      using V = attn::kernels::set::Vec<Scalar>;                                              \
      for (Index i = 0; i < n; i += V::kWidth) {                                              \
        V::store_partial(y + i, attn::kernels::set::vexp<V>(V::load_partial(x + i, n - i)),   \
                         n - i);                                                              \
      }                                                                                       \
    }                                                                                         \
    template <class Scalar>                                                                   \
    void exp_shifted(const Scalar* x, Scalar* normal, Scalar* nonpositive, Index n) {         \
      using V = attn::kernels::set::Vec<Scalar>;                                              \
      for (Index i = 0; i < n; i += V::kWidth) {                                              \
        const auto v = V::load_partial(x + i, n - i);                                         \
        V::store_partial(normal + i, attn::kernels::set::vexp_normal<V>(v), n - i);           \
        V::store_partial(nonpositive + i, attn::kernels::set::vexp_nonpositive<V>(v), n - i); \
      }                                                                                       \
    }                                                                                         \
  }

ATTN_TARGET_SCALAR_BEGIN
ATTN_SIMD_TEST_HELPERS(scalar)
ATTN_TARGET_SCALAR_END
#if ATTN_KERNELS_X86
ATTN_TARGET_SSE2_BEGIN
ATTN_SIMD_TEST_HELPERS(sse2)
ATTN_TARGET_END
ATTN_TARGET_AVX2_BEGIN
ATTN_SIMD_TEST_HELPERS(avx2)
ATTN_TARGET_END
ATTN_TARGET_AVX512_BEGIN
ATTN_SIMD_TEST_HELPERS(avx512)
ATTN_TARGET_END
#endif

template <class Scalar>
struct SetHelpers {
  Isa isa;
  int (*width)();
  void (*partial)(const Scalar*, Index, Scalar*, Scalar*);
  void (*exp_array)(const Scalar*, Scalar*, Index);
  void (*exp_shifted)(const Scalar*, Scalar*, Scalar*, Index);
};

/// The helpers of every set this CPU can run.
template <class Scalar>
std::vector<SetHelpers<Scalar>> runnable_sets() {
  std::vector<SetHelpers<Scalar>> sets = {
      {Isa::kScalar, &scalar_helpers::width<Scalar>, &scalar_helpers::partial<Scalar>,
       &scalar_helpers::exp_array<Scalar>, &scalar_helpers::exp_shifted<Scalar>}};
#if ATTN_KERNELS_X86
  sets.push_back({Isa::kSse2, &sse2_helpers::width<Scalar>, &sse2_helpers::partial<Scalar>,
                  &sse2_helpers::exp_array<Scalar>, &sse2_helpers::exp_shifted<Scalar>});
  if (attn::best_isa() >= Isa::kAvx2) {
    sets.push_back({Isa::kAvx2, &avx2_helpers::width<Scalar>, &avx2_helpers::partial<Scalar>,
                    &avx2_helpers::exp_array<Scalar>, &avx2_helpers::exp_shifted<Scalar>});
  }
  if (attn::best_isa() >= Isa::kAvx512) {
    sets.push_back({Isa::kAvx512, &avx512_helpers::width<Scalar>, &avx512_helpers::partial<Scalar>,
                    &avx512_helpers::exp_array<Scalar>, &avx512_helpers::exp_shifted<Scalar>});
  }
#endif
  // only the sets attn::test::runnable_sets() names (the run's own set in a narrowed run)
  const std::vector<Isa> wanted = attn::test::runnable_sets();
  std::vector<SetHelpers<Scalar>> kept;
  for (const auto& set : sets) {
    if (std::find(wanted.begin(), wanted.end(), set.isa) != wanted.end()) kept.push_back(set);
  }
  return kept;
}

template <class Scalar>
class SimdTest : public ::testing::Test {};
TYPED_TEST_SUITE(SimdTest, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

TYPED_TEST(SimdTest, PartialLoadsAndStoresTouchExactlyTheFirstNLanes) {
  using Scalar = TypeParam;
  for (const auto& set : runnable_sets<Scalar>()) {
    const Index W = set.width();
    for (Index n = -2 * W; n <= 2 * W; ++n) {
      const Index valid = n < 0 ? 0 : (n > W ? W : n);
      // Load: lanes past n hold a sentinel in memory, so a load that reads them shows it.
      std::vector<Scalar> src(static_cast<std::size_t>(W), Scalar(99));
      for (Index i = 0; i < valid; ++i) src[static_cast<std::size_t>(i)] = Scalar(i + 1);
      std::vector<Scalar> loaded(static_cast<std::size_t>(W));
      // Store: the destination past n keeps its old value.
      std::vector<Scalar> dst(static_cast<std::size_t>(W), Scalar(-1));
      set.partial(src.data(), n, loaded.data(), dst.data());
      for (Index i = 0; i < W; ++i) {
        const auto at = static_cast<std::size_t>(i);
        EXPECT_EQ(loaded[at], i < valid ? Scalar(i + 1) : Scalar(0))
            << attn::isa_name(set.isa) << " load n=" << n << " lane " << i;
        EXPECT_EQ(dst[at], i < valid ? src[at] : Scalar(-1))
            << attn::isa_name(set.isa) << " store n=" << n << " lane " << i;
      }
    }
  }
}

TYPED_TEST(SimdTest, ExpIsAccurateToAFewUlpsOverTheWholeRange) {
  using Scalar = TypeParam;
  using Limits = std::numeric_limits<Scalar>;
  // From exp's underflow edge (ln of half the smallest subnormal: below it the correctly
  // rounded exp is 0), through the subnormal results (an ulp there is the smallest
  // subnormal), to its overflow edge, densely around 0 where softmax lives. Cephes' float
  // polynomial is good to about 1 ulp before the final scaling; the double Taylor polynomial
  // to below 1e-17 relative.
  using Edges = attn::kernels::scalar::ExpConstants<Scalar>;
  const double lo = Edges::kLo, hi = Edges::kHi;
  std::vector<Scalar> x;
  for (int i = 0; i <= 20000; ++i) x.push_back(static_cast<Scalar>(lo + (hi - lo) * i / 20000.0));
  for (int i = -2000; i <= 2000; ++i) x.push_back(static_cast<Scalar>(i * 1e-3));
  std::vector<Scalar> y(x.size());
  const double max_ulps = 2.0;
  for (const auto& set : runnable_sets<Scalar>()) {
    set.exp_array(x.data(), y.data(), static_cast<Index>(x.size()));
    double worst = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const long double ref = std::exp(static_cast<long double>(x[i]));
      if (ref > static_cast<long double>(Limits::max())) continue;  // rounds up past max
      const long double ulp =
          std::nextafter(static_cast<Scalar>(ref), Limits::infinity()) - static_cast<Scalar>(ref);
      const double err = static_cast<double>(std::fabs(static_cast<long double>(y[i]) - ref) / ulp);
      worst = std::max(worst, err);
      ASSERT_LE(err, max_ulps) << attn::isa_name(set.isa) << " exp(" << x[i] << ") = " << y[i]
                               << ", expected " << static_cast<double>(ref);
    }
    this->RecordProperty(std::string("worst_ulps_") + attn::isa_name(set.isa),
                         std::to_string(worst));
  }
}

TYPED_TEST(SimdTest, ExpFollowsIeeeAtTheEdges) {
  using Scalar = TypeParam;
  using Limits = std::numeric_limits<Scalar>;
  const Scalar nan = Limits::quiet_NaN(), inf = Limits::infinity();
  const Scalar hi = std::log(Limits::max());
  // NaN in any lane position, with finite neighbours: every NaN lane stays NaN.
  const std::vector<Scalar> x = {
      nan,          Scalar(0), inf,       -inf, Scalar(1e4),  Scalar(-1e4), nan,  hi * Scalar(1.01),
      Scalar(-745), Scalar(0), Scalar(1), nan,  Scalar(-0.0), Scalar(2),    -nan, Scalar(-1)};
  std::vector<Scalar> y(x.size());
  for (const auto& set : runnable_sets<Scalar>()) {
    set.exp_array(x.data(), y.data(), static_cast<Index>(x.size()));
    for (std::size_t i = 0; i < x.size(); ++i) {
      const std::string at =
          std::string(attn::isa_name(set.isa)) + " exp(" + std::to_string(x[i]) + ")";
      if (std::isnan(x[i])) {
        EXPECT_TRUE(std::isnan(y[i])) << at << " = " << y[i];
      } else if (x[i] > hi) {
        EXPECT_EQ(y[i], inf) << at;
      } else if (x[i] < std::log(Limits::denorm_min()) - std::log(Scalar(2))) {
        EXPECT_EQ(y[i], Scalar(0)) << at;           // exp(-inf) is exactly 0: masked scores vanish
      } else if (x[i] < std::log(Limits::min())) {  // a subnormal result, not flushed to 0
        const long double ref = std::exp(static_cast<long double>(x[i]));
        EXPECT_LE(std::fabs(static_cast<long double>(y[i]) - ref), Limits::denorm_min()) << at;
      } else if (x[i] == Scalar(0)) {
        EXPECT_EQ(y[i], Scalar(1)) << at;
      }
    }
  }
}

// vexp_normal() is vexp() where the result is at least 2^-125 (2^-1021), else 0; and
// vexp_nonpositive() has its bits wherever x <= 0 or is NaN (what the attention's softmax
// feeds it): the same bits, not just close ones, as both are meant to compute the same
// instructions' results with fewer edges handled. Above 0 (a softmax row whose maximum missed
// a score next to a NaN) vexp_nonpositive() gives exp(0) = 1, never an out-of-range exponent.
TYPED_TEST(SimdTest, ShiftedExpsHaveVexpBits) {
  using Scalar = TypeParam;
  using Limits = std::numeric_limits<Scalar>;
  const Scalar floor = std::log(Limits::min()) + Scalar(1);
  std::vector<Scalar> x = {Limits::quiet_NaN(),
                           -Limits::quiet_NaN(),
                           -Limits::infinity(),
                           Scalar(0),
                           Scalar(-0.0),
                           -Limits::denorm_min(),
                           -Limits::min(),
                           floor,
                           std::nextafter(floor, Scalar(0)),
                           std::nextafter(floor, -Limits::infinity())};
  const std::size_t positives = x.size();
  for (const Scalar p : {Limits::denorm_min(), Scalar(1), Scalar(88), Scalar(1e30), Limits::max(),
                         Limits::infinity()}) {
    x.push_back(p);
  }
  const std::size_t nonpositives = x.size();
  for (int i = 0; i <= 4000; ++i) x.push_back(static_cast<Scalar>(-800.0 * i / 4000.0));
  for (int i = 0; i <= 2000; ++i) x.push_back(static_cast<Scalar>(-1e-3 * i));
  const Index n = static_cast<Index>(x.size());
  std::vector<Scalar> full(x.size()), normal(x.size()), nonpositive(x.size());
  const auto same_bits = [](Scalar a, Scalar b) { return std::memcmp(&a, &b, sizeof a) == 0; };
  for (const auto& set : runnable_sets<Scalar>()) {
    set.exp_array(x.data(), full.data(), n);
    set.exp_shifted(x.data(), normal.data(), nonpositive.data(), n);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const std::string at = std::string(attn::isa_name(set.isa)) + " x = " + std::to_string(x[i]);
      if (std::isnan(x[i])) {
        EXPECT_TRUE(std::isnan(normal[i]) && std::isnan(nonpositive[i])) << at;
        continue;
      }
      const Scalar expected = x[i] < floor ? Scalar(0) : full[i];
      EXPECT_TRUE(same_bits(normal[i], expected)) << at << " " << normal[i];
      if (i >= positives && i < nonpositives) {
        EXPECT_EQ(nonpositive[i], Scalar(1)) << at;
      } else {
        EXPECT_TRUE(same_bits(nonpositive[i], expected)) << at << " " << nonpositive[i];
      }
    }
  }
}

}  // namespace

}  // namespace simd_test

#undef ATTN_SIMD_TEST_HELPERS
