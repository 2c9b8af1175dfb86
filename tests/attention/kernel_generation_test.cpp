// SPDX-License-Identifier: MIT
// tests/attention/kernel_generation_test.cpp: the kernel features generation needs, against
// the long double reference (tests/attention/reference_attention.hpp): grouped-query and
// multi-query attention (K/V with H_kv heads, the reference repeats them with repeat_kv),
// per-item bottom-right causal alignment over ragged key lengths (also given as a view, not
// copied), sliding windows, and the split-keys path of short queries (T_q <= 8: keys in
// 512-key chunks merged in order). Both paths, every kernel set the CPU runs, and the same
// bits for 1, 2 and 3 threads.
//
// Tolerance: ref::kernel_tolerance<Scalar>(d, T_k) = (d + T_k) eps, as kernel_paths_test.cpp
// (first-order rounding of a d-term score and a T_k-term weighted sum with inputs in
// [-1, 1]). A wrong head mapping, bound or chunk merge moves outputs by 1e-2 or more.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attention/reference_attention.hpp"
#include "attn/attn.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace kernel_generation_test {

namespace {

using attn::AttentionMask;
using attn::AttentionOptions;
using attn::AttentionPath;
using attn::CausalAlignment;
using attn::Index;
using attn::Isa;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
namespace ref = attn::test::ref;

struct Dims {
  Index b, h, hkv, tq, tk, d, dv;
};

std::string describe(const Dims& s) {
  return "B=" + std::to_string(s.b) + " H=" + std::to_string(s.h) +
         " H_kv=" + std::to_string(s.hkv) + " T_q=" + std::to_string(s.tq) +
         " T_k=" + std::to_string(s.tk) + " d=" + std::to_string(s.d) +
         " d_v=" + std::to_string(s.dv);
}

// Grouped (H_kv < H), multi-query (H_kv = 1) and plain shapes; T_q <= 8 takes the split-keys
// path (more than one 512-key chunk from T_k = 600 on), the others the tiled one.
const std::vector<Dims> kShapes = {
    {2, 4, 2, 5, 7, 3, 3},       // tiny, split keys, one chunk
    {1, 8, 2, 64, 128, 8, 8},    // tile multiples, group of 4
    {2, 6, 1, 70, 257, 16, 5},   // multi-query, ragged tiles, d_v != d
    {2, 8, 2, 1, 1100, 16, 16},  // decoding: three key chunks
    {1, 4, 1, 3, 700, 8, 8},     // multi-query chunked prefill of 3
    {2, 12, 3, 8, 600, 8, 8},    // the largest split-keys T_q
    {1, 3, 3, 20, 90, 8, 8},     // H_kv = H, short queries stacked per head
    {1, 64, 1, 2, 130, 4, 4},    // 64 heads of one group: two head chunks of rows
};

using attn::test::runnable_sets;

template <class Scalar>
struct Inputs {
  Tensor<Scalar, 4> q, k, v;
};

template <class Scalar>
Inputs<Scalar> make_inputs(const Dims& s, std::uint64_t seed) {
  return {attn::test::random_tensor<Scalar>(Shape<4>{s.b, s.h, s.tq, s.d}, seed),
          attn::test::random_tensor<Scalar>(Shape<4>{s.b, s.hkv, s.tk, s.d}, seed + 1),
          attn::test::random_tensor<Scalar>(Shape<4>{s.b, s.hkv, s.tk, s.dv}, seed + 2)};
}

/// Runs both paths on each of `sets` (default: the set in use) and checks them against the
/// reference (K/V repeated to H heads), computed once.
template <class Scalar>
void check(const Dims& s, const AttentionMask<Scalar>& mask, const ref::DenseMask& dense,
           std::uint64_t seed, const std::vector<Isa>& sets = {}) {
  SCOPED_TRACE(describe(s));
  const Inputs<Scalar> in = make_inputs<Scalar>(s, seed);
  const auto k_rep = ref::repeat_kv(in.k.view(), s.h);
  const auto v_rep = ref::repeat_kv(in.v.view(), s.h);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  const ref::Result expected =
      ref::attention(in.q.view(), k_rep.view(), v_rep.view(), dense, static_cast<ref::Real>(scale));
  const double tol = ref::kernel_tolerance<Scalar>(s.d, s.tk);
  for (const Isa isa : sets.empty() ? std::vector<Isa>{attn::active_isa()} : sets) {
    attn::set_isa(isa);
    SCOPED_TRACE(attn::isa_name(isa));
    for (const AttentionPath path : {AttentionPath::kMaterialized, AttentionPath::kStreaming}) {
      SCOPED_TRACE(path == AttentionPath::kMaterialized ? "materialized" : "streaming");
      const Tensor<Scalar, 4> out =
          ref::run_kernel<Scalar>(in.q.view(), in.k.view(), in.v.view(), mask, {}, path);
      EXPECT_TRUE(ref::all_near(out.view(), expected.output.view(), tol));
    }
    Tensor<Scalar, 4> weights;
    ref::run_kernel<Scalar>(in.q.view(), in.k.view(), in.v.view(), mask, {},
                            AttentionPath::kMaterialized, &weights);
    EXPECT_TRUE(ref::all_near(weights.view(), expected.weights.view(), tol)) << "weights";
  }
}

template <class Scalar>
class KernelGeneration : public ::testing::Test {
 protected:
  void SetUp() override { attn::set_num_threads(1); }
  void TearDown() override {
    attn::set_num_threads(saved_threads_);
    attn::set_isa(attn::best_isa());
  }

 private:
  int saved_threads_ = attn::num_threads();
};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(KernelGeneration, Scalars, );

std::vector<Index> ragged_lengths(const Dims& s) {
  std::vector<Index> lengths;
  for (Index b = 0; b < s.b; ++b) lengths.push_back(std::max<Index>(s.tq, s.tk - 37 * b));
  return lengths;
}

TYPED_TEST(KernelGeneration, GroupedQueryMatchesRepeatedKeysOnEverySet) {
  using S = TypeParam;
  const std::vector<Isa> sets = runnable_sets();
  for (const Dims& s : kShapes) {
    check<S>(s, {}, ref::DenseMask(s.b, s.h, s.tq, s.tk), 11, sets);
    AttentionMask<S> causal;
    causal.causal(CausalAlignment::kBottomRight);
    check<S>(s, causal, ref::DenseMask(s.b, s.h, s.tq, s.tk).causal(CausalAlignment::kBottomRight),
             12, sets);
  }
}

TYPED_TEST(KernelGeneration, PerItemBottomRightFollowsEachItemsKeyLength) {
  using S = TypeParam;
  for (const Dims& s : kShapes) {
    const std::vector<Index> lengths = ragged_lengths(s);
    std::vector<Index> offsets;
    for (const Index l : lengths) offsets.push_back(l - s.tq);
    ref::DenseMask dense(s.b, s.h, s.tq, s.tk);
    dense.key_lengths(lengths).causal_window(offsets, 0);
    AttentionMask<S> owned;
    owned.key_lengths(lengths).causal(CausalAlignment::kBottomRightPerItem);
    check<S>(s, owned, dense, 21);
    // The same lengths as a view of the caller's memory (not copied).
    AttentionMask<S> viewed;
    viewed.key_lengths(TensorView<const Index, 1>(lengths.data(), {s.b}))
        .causal(CausalAlignment::kBottomRightPerItem);
    check<S>(s, viewed, dense, 21);
  }
}

TYPED_TEST(KernelGeneration, SlidingWindowIsALowerBoundOnTheDiagonal) {
  using S = TypeParam;
  for (const Dims& s : kShapes) {
    for (const Index window : {Index{1}, Index{5}, Index{130}, Index{600}}) {
      SCOPED_TRACE("window " + std::to_string(window));
      // Bottom-right over the whole key range.
      AttentionMask<S> whole;
      whole.causal(CausalAlignment::kBottomRight).sliding_window(window);
      check<S>(s, whole,
               ref::DenseMask(s.b, s.h, s.tq, s.tk)
                   .causal_window(std::vector<Index>(s.b, s.tk - s.tq), window),
               31);
      // Per item over ragged lengths, with an additive mask and key padding on top.
      const std::vector<Index> lengths = ragged_lengths(s);
      std::vector<Index> offsets;
      for (const Index l : lengths) offsets.push_back(l - s.tq);
      const auto additive = ref::random_additive<S>(Shape<2>{s.tq, s.tk}, 32);
      const auto padding = ref::random_bools(Shape<2>{s.b, s.tk}, 33, 0.1);
      AttentionMask<S> ragged;
      ragged.key_lengths(lengths)
          .causal(CausalAlignment::kBottomRightPerItem)
          .sliding_window(window)
          .additive(additive.view())
          .key_padding(padding.view());
      ref::DenseMask dense(s.b, s.h, s.tq, s.tk);
      dense.key_lengths(lengths).causal_window(offsets, window).additive(additive.view());
      dense.key_padding(padding.view());
      check<S>(s, ragged, dense, 34);
    }
  }
}

TYPED_TEST(KernelGeneration, SameBitsForAnyThreadCountWithDropout) {
  using S = TypeParam;
  for (const Dims& s : kShapes) {
    SCOPED_TRACE(describe(s));
    const Inputs<S> in = make_inputs<S>(s, 41);
    const std::vector<Index> lengths = ragged_lengths(s);
    AttentionMask<S> mask;
    mask.key_lengths(lengths).causal(CausalAlignment::kBottomRightPerItem).sliding_window(300);
    AttentionOptions options;
    options.dropout = 0.25;
    options.dropout_seed = 7;
    std::vector<Tensor<S, 4>> outs;
    for (const int threads : {1, 2, 3}) {
      attn::set_num_threads(threads);
      outs.push_back(ref::run_kernel<S>(in.q.view(), in.k.view(), in.v.view(), mask, options,
                                        AttentionPath::kStreaming));
    }
    EXPECT_TRUE(ref::same_bits(outs[0].view(), outs[1].view()));
    EXPECT_TRUE(ref::same_bits(outs[0].view(), outs[2].view()));
    EXPECT_TRUE(ref::all_finite(outs[0].view()));
  }
}

TYPED_TEST(KernelGeneration, NonFiniteValuesReachOnlyTheQueriesThatSeeThem) {
  using S = TypeParam;
  // Decoding over three key chunks with a window: an inf value outside every window and a
  // NaN one inside item 0's (feature 2 of key/value head 1: query heads 2 and 3).
  const Dims s{2, 4, 2, 1, 1100, 8, 8};
  Inputs<S> in = make_inputs<S>(s, 51);
  in.v(0, 0, 100, 3) = std::numeric_limits<S>::infinity();
  in.v(0, 1, 1050, 2) = std::numeric_limits<S>::quiet_NaN();
  AttentionMask<S> mask;
  mask.causal(CausalAlignment::kBottomRight).sliding_window(200);
  const Tensor<S, 4> out = ref::run_kernel<S>(in.q.view(), in.k.view(), in.v.view(), mask, {},
                                              AttentionPath::kStreaming);
  for (Index h = 0; h < s.h; ++h) {
    for (Index b = 0; b < s.b; ++b) {
      const bool sees_nan = b == 0 && h / 2 == 1;
      for (Index e = 0; e < s.dv; ++e) {
        EXPECT_EQ(std::isnan(out(b, h, 0, e)), sees_nan && e == 2) << b << " " << h << " " << e;
      }
    }
  }
}

TYPED_TEST(KernelGeneration, HeadCountsThatDoNotGroupAreShapeErrors) {
  using S = TypeParam;
  const Tensor<S, 4> q({1, 6, 3, 4}), k4({1, 4, 5, 4}), k3({1, 3, 5, 4}), v2({1, 2, 5, 4});
  Tensor<S, 4> out({1, 6, 3, 4});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                attn::scaled_dot_product_attention<S>(q.view(), k4.view(), k4.view(), out.view());
              }),
              ::testing::HasSubstr(
                  "number of heads in key and value must divide the number of heads in query"));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                attn::scaled_dot_product_attention<S>(q.view(), k3.view(), v2.view(), out.view());
              }),
              ::testing::HasSubstr("key and value must have the same number of heads"));
  AttentionMask<S> bad;
  EXPECT_THROW(bad.sliding_window(0), attn::ConfigError);
}

}  // namespace

}  // namespace kernel_generation_test

#include "support/bodies_end.hpp"
