// SPDX-License-Identifier: MIT
// tests/attention/kernel_paths_test.cpp: scaled_dot_product_attention's materialised and
// streaming paths against a long double plain-loop reference, for every mask kind, both
// scalar types, tile-multiple and ragged shapes, head dims 1/3/8/64, d_v != d and strided
// (split-head) inputs and outputs.
//
// Tolerance: ref::kernel_tolerance<Scalar>(d, T_k) = (d + T_k) eps (see
// reference_attention.hpp): first-order rounding of a d-term score and a T_k-term weighted
// sum with |q|, |k|, |v| <= 1. For float with d = 64, T_k = 300 that is 4.3e-5 (measured
// <= 1/10 of the tolerance for every shape here); for double 8e-14. A wrong mask, scale
// or tile edge moves outputs by 1e-2 or more. The two paths are compared with the same
// tolerance.
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

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace kernel_paths_test {
namespace {

using attn::AttentionMask;
using attn::AttentionOptions;
using attn::AttentionPath;
using attn::CausalAlignment;
using attn::Index;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
namespace ref = attn::test::ref;

struct Dims {
  Index b, h, tq, tk, d, dv;
};

std::string describe(const Dims& s) {
  return "B=" + std::to_string(s.b) + " H=" + std::to_string(s.h) + " T_q=" + std::to_string(s.tq) +
         " T_k=" + std::to_string(s.tk) + " d=" + std::to_string(s.d) +
         " d_v=" + std::to_string(s.dv);
}

// Shapes: tiles are 64 query rows and 128 key columns; 300 is ragged for both.
const std::vector<Dims> kGeneral = {
    {2, 3, 5, 7, 3, 3},     // smaller than one tile
    {1, 2, 64, 128, 8, 8},  // exact tile multiples
    // several tiles, ragged edges, d = 64 (T_q = 140 in unoptimised builds)
    {1, 1, ref::kOptimizedBuild ? 300 : 140, 300, 64, 64},
    {2, 1, 130, 257, 1, 5},  // d = 1, d_v != d, ragged by one
    {1, 2, 200, 70, 8, 3},   // T_q > T_k
    {2, 1, 70, 300, 3, 16},  // T_q < T_k, d = 3
};
// The same without the d = 64 case, for the tests that try many masks per shape (the
// reference is O(B H T_q T_k d) in long double); in optimised builds each of those also
// runs kLarge once.
const std::vector<Dims> kMaskShapes = {
    {2, 3, 5, 7, 3, 3},    {1, 2, 64, 128, 8, 8},  {2, 1, 130, 257, 1, 5},
    {1, 2, 200, 70, 8, 3}, {2, 1, 70, 300, 3, 16},
};
const Dims kLarge{1, 1, 300, 300, 64, 64};
std::vector<Dims> with_large(std::vector<Dims> shapes) {
  if (ref::kOptimizedBuild) shapes.push_back(kLarge);
  return shapes;
}
const std::vector<Dims> kSquare = {
    {2, 3, 5, 5, 3, 3},
    {1, 2, 128, 128, 8, 8},
    {1, 1, ref::kOptimizedBuild ? 300 : 200, ref::kOptimizedBuild ? 300 : 200, 64, 64},
    {2, 1, 129, 129, 1, 5},
};

/// q, k, v either contiguous (B, H, T, d) or split-head views of (B, T, H, d) storage.
template <class Scalar>
struct Inputs {
  Tensor<Scalar, 4> qs, ks, vs;
  TensorView<const Scalar, 4> q, k, v;
  bool split = false;
};

template <class Scalar>
TensorView<Scalar, 4> heads_view(Tensor<Scalar, 4>& storage, bool split) {
  return split ? attn::permute(storage.view(), {0, 2, 1, 3}) : storage.view();
}

template <class Scalar>
Inputs<Scalar> make_inputs(const Dims& s, bool split, std::uint64_t seed) {
  Inputs<Scalar> in;
  in.split = split;
  const auto shape = [&](Index t, Index d) {
    return split ? Shape<4>{s.b, t, s.h, d} : Shape<4>{s.b, s.h, t, d};
  };
  in.qs = attn::test::random_tensor<Scalar>(shape(s.tq, s.d), seed);
  in.ks = attn::test::random_tensor<Scalar>(shape(s.tk, s.d), seed + 1);
  in.vs = attn::test::random_tensor<Scalar>(shape(s.tk, s.dv), seed + 2);
  in.q = heads_view(in.qs, split);
  in.k = heads_view(in.ks, split);
  in.v = heads_view(in.vs, split);
  return in;
}

const char* name(AttentionPath path) {
  return path == AttentionPath::kMaterialized ? "materialized" : "streaming";
}

/// Runs both paths (and the materialised one with weights) and compares each with the
/// reference and with each other. Outputs start as NaN so unwritten rows show up.
template <class Scalar>
void check_paths(const Dims& s, const AttentionMask<Scalar>& mask, const ref::DenseMask& dense,
                 bool split, std::uint64_t seed, double scale = -1) {
  SCOPED_TRACE(describe(s) + (split ? " split-head views" : " contiguous"));
  const Inputs<Scalar> in = make_inputs<Scalar>(s, split, seed);
  const double used_scale = scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(s.d));
  const ref::Result expected =
      ref::attention(in.q, in.k, in.v, dense, static_cast<ref::Real>(used_scale));
  const double tol = ref::kernel_tolerance<Scalar>(s.d, s.tk);
  const Scalar nan = std::numeric_limits<Scalar>::quiet_NaN();
  const Shape<4> out_shape =
      split ? Shape<4>{s.b, s.tq, s.h, s.dv} : Shape<4>{s.b, s.h, s.tq, s.dv};

  std::vector<Tensor<Scalar, 4>> outs;
  for (const AttentionPath path : {AttentionPath::kMaterialized, AttentionPath::kStreaming}) {
    SCOPED_TRACE(name(path));
    Tensor<Scalar, 4> out(out_shape, nan);
    AttentionOptions options;
    options.path = path;
    if (scale > 0) options.scale = scale;
    attn::scaled_dot_product_attention<Scalar>(in.q, in.k, in.v, heads_view(out, split), mask,
                                               options);
    EXPECT_TRUE(ref::all_near(TensorView<const Scalar, 4>(heads_view(out, split)),
                              expected.output.view(), tol));
    outs.push_back(std::move(out));
  }
  EXPECT_TRUE(ref::all_near(outs[0].view(), outs[1].view(), tol)) << "paths disagree";

  // Weights requested: materialised path, weights (B, H, T_q, T_k) against the reference.
  Tensor<Scalar, 4> out(out_shape, nan);
  Tensor<Scalar, 4> weights({s.b, s.h, s.tq, s.tk}, nan);
  AttentionOptions options;
  if (scale > 0) options.scale = scale;
  attn::scaled_dot_product_attention_with_weights<Scalar>(in.q, in.k, in.v, heads_view(out, split),
                                                          weights.view(), mask, options);
  EXPECT_TRUE(ref::all_near(weights.view(), expected.weights.view(), tol)) << "weights";
  EXPECT_TRUE(ref::all_near(TensorView<const Scalar, 4>(heads_view(out, split)),
                            expected.output.view(), tol))
      << "output with weights";
}

/// Sets the last query row of every (T_q, T_k) slice of a boolean mask to `value`, so a
/// fully masked row occurs (value = false for `allowed`, true for `blocked`).
template <std::size_t Rank>
void set_last_row(Tensor<bool, Rank>& m, bool value) {
  const Index tq = m.extent(Rank - 2), tk = m.extent(Rank - 1);
  for (Index i = 0; i < m.size(); ++i) {
    if ((i / tk) % tq == tq - 1) m.data()[i] = value;
  }
}

// Runs on one thread: these tests compare against the reference, which runs serially
// between kernel calls, and idle OpenMP workers would spin through it. Results for 2 and
// 3 threads are bit-identical to these (dropout_threads_test.cpp), so they match the
// reference too; masking_test.cpp and module_test.cpp run at the default thread count.
template <class Scalar>
class KernelPaths : public ::testing::Test {
 protected:
  void SetUp() override { attn::set_num_threads(1); }
  void TearDown() override { attn::set_num_threads(saved_threads_); }

 private:
  int saved_threads_ = attn::num_threads();
};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(KernelPaths, Scalars, );

TYPED_TEST(KernelPaths, NoMaskMatchesReference) {
  std::uint64_t seed = 100;
  for (const Dims& s : kGeneral) {
    const ref::DenseMask dense(s.b, s.h, s.tq, s.tk);
    check_paths<TypeParam>(s, {}, dense, seed % 2 == 0, seed);
    ++seed;
  }
}

TYPED_TEST(KernelPaths, ExplicitScaleMatchesReference) {
  const Dims s{2, 2, 70, 130, 8, 8};
  const ref::DenseMask dense(s.b, s.h, s.tq, s.tk);
  check_paths<TypeParam>(s, {}, dense, false, 7, /*scale=*/1.0);
  check_paths<TypeParam>(s, {}, dense, true, 8, /*scale=*/0.3);
}

TYPED_TEST(KernelPaths, CausalSquareMatchesReference) {
  std::uint64_t seed = 200;
  for (const Dims& s : kSquare) {
    ref::DenseMask dense(s.b, s.h, s.tq, s.tk);
    dense.causal(CausalAlignment::kSquare);
    AttentionMask<TypeParam> mask;
    mask.causal();
    check_paths<TypeParam>(s, mask, dense, seed % 2 == 1, seed);
    ++seed;
  }
}

TYPED_TEST(KernelPaths, CausalTopLeftMatchesReference) {
  std::uint64_t seed = 300;
  for (const Dims& s : kGeneral) {
    ref::DenseMask dense(s.b, s.h, s.tq, s.tk);
    dense.causal(CausalAlignment::kTopLeft);
    AttentionMask<TypeParam> mask;
    mask.causal(CausalAlignment::kTopLeft);
    check_paths<TypeParam>(s, mask, dense, seed % 2 == 0, seed);
    ++seed;
  }
}

TYPED_TEST(KernelPaths, CausalBottomRightMatchesReference) {
  std::uint64_t seed = 400;
  for (const Dims& s : kGeneral) {
    ref::DenseMask dense(s.b, s.h, s.tq, s.tk);
    dense.causal(CausalAlignment::kBottomRight);
    if (s.tq > s.tk) {
      // The first T_q - T_k queries see nothing: the reference must contain such rows.
      EXPECT_FALSE(dense.visible[dense.at(0, 0, 0, 0)]);
    }
    AttentionMask<TypeParam> mask;
    mask.causal(CausalAlignment::kBottomRight);
    check_paths<TypeParam>(s, mask, dense, seed % 2 == 0, seed);
    ++seed;
  }
}

// Boolean masks of rank 2, 3 and 4, with broadcast extents of 1, in both polarities.
template <class Scalar>
void check_boolean_masks(bool allows, std::uint64_t seed) {
  const auto add = [&](AttentionMask<Scalar>& mask, auto view) {
    if (allows) {
      mask.allowed(view);
    } else {
      mask.blocked(view);
    }
  };
  Index shape_index = 0;
  for (const Dims& s : with_large(kMaskShapes)) {
    const bool large = s.d == kLarge.d;        // only one mask (rank 4, broadcast B) for kLarge
    const double p_true = allows ? 0.7 : 0.3;  // ~70% of keys visible either way
    // Unoptimised builds run every other mask variant, alternating between shapes.
    Index variant = shape_index++;
    const auto runs = [&] { return ref::kOptimizedBuild || variant++ % 2 == 0; };
    // rank 2 (T_q, T_k)
    if (!large && runs()) {
      auto m = ref::random_bools(Shape<2>{s.tq, s.tk}, seed++, p_true);
      set_last_row(m, !allows);
      AttentionMask<Scalar> mask;
      add(mask, m.view());
      ref::DenseMask dense(s.b, s.h, s.tq, s.tk);
      dense.boolean(m.view(), allows);
      SCOPED_TRACE("rank 2");
      check_paths<Scalar>(s, mask, dense, seed % 2 == 0, seed);
    }
    // rank 3 (1, T_q, T_k) and (B, T_q, T_k)
    for (const Index mb : {Index{1}, s.b}) {
      if (large) break;
      if (!runs()) continue;
      auto m = ref::random_bools(Shape<3>{mb, s.tq, s.tk}, seed++, p_true);
      AttentionMask<Scalar> mask;
      add(mask, m.view());
      ref::DenseMask dense(s.b, s.h, s.tq, s.tk);
      dense.boolean(m.view(), allows);
      SCOPED_TRACE("rank 3, B extent " + std::to_string(mb));
      check_paths<Scalar>(s, mask, dense, seed % 2 == 1, seed);
    }
    // rank 4 (1, H, T_q, T_k), (B, 1, T_q, T_k) and (B, H, T_q, T_k)
    for (const Shape<4>& shape : {Shape<4>{1, s.h, s.tq, s.tk}, Shape<4>{s.b, 1, s.tq, s.tk},
                                  Shape<4>{s.b, s.h, s.tq, s.tk}}) {
      if (large && shape[0] != 1) break;
      if (!runs()) continue;
      auto m = ref::random_bools(shape, seed++, p_true);
      AttentionMask<Scalar> mask;
      add(mask, m.view());
      ref::DenseMask dense(s.b, s.h, s.tq, s.tk);
      dense.boolean(m.view(), allows);
      SCOPED_TRACE("rank 4 " + attn::detail::to_string(shape));
      check_paths<Scalar>(s, mask, dense, seed % 2 == 0, seed);
    }
  }
}

TYPED_TEST(KernelPaths, AllowedMasksOfEveryRankMatchReference) {
  check_boolean_masks<TypeParam>(/*allows=*/true, 500);
}

TYPED_TEST(KernelPaths, BlockedMasksOfEveryRankMatchReference) {
  check_boolean_masks<TypeParam>(/*allows=*/false, 600);
}

TYPED_TEST(KernelPaths, TransposedBooleanMaskViewMatchesReference) {
  // A (T_k, T_q) tensor seen through a transpose: the mask's column stride is not 1.
  const Dims s{2, 2, 130, 200, 8, 8};
  auto storage = ref::random_bools(Shape<2>{s.tk, s.tq}, 41, 0.6);
  const auto m = attn::transpose(TensorView<const bool, 2>(storage.view()));
  AttentionMask<TypeParam> mask;
  mask.allowed(m);
  ref::DenseMask dense(s.b, s.h, s.tq, s.tk);
  dense.boolean(m, true);
  check_paths<TypeParam>(s, mask, dense, true, 42);
}

TYPED_TEST(KernelPaths, AdditiveMasksWithNegativeInfinityMatchReference) {
  using Scalar = TypeParam;
  std::uint64_t seed = 700;
  const Scalar neg_inf = -std::numeric_limits<Scalar>::infinity();
  for (const Dims& s : with_large(kMaskShapes)) {
    const bool large = s.d == kLarge.d;  // only one mask (rank 4, broadcast B) for kLarge
    if (!large) {
      auto m = ref::random_additive<Scalar>(Shape<2>{s.tq, s.tk}, seed++);
      for (Index j = 0; j < s.tk; ++j) m(0, j) = neg_inf;  // row 0 fully masked
      AttentionMask<Scalar> mask;
      mask.additive(m.view());
      ref::DenseMask dense(s.b, s.h, s.tq, s.tk);
      dense.additive(m.view());
      SCOPED_TRACE("rank 2");
      check_paths<Scalar>(s, mask, dense, seed % 2 == 0, seed);
    }
    if (!large) {
      auto m = ref::random_additive<Scalar>(Shape<3>{s.b, s.tq, s.tk}, seed++);
      AttentionMask<Scalar> mask;
      mask.additive(m.view());
      ref::DenseMask dense(s.b, s.h, s.tq, s.tk);
      dense.additive(m.view());
      SCOPED_TRACE("rank 3");
      check_paths<Scalar>(s, mask, dense, seed % 2 == 1, seed);
    }
    for (const Shape<4>& shape : {Shape<4>{1, s.h, s.tq, s.tk}, Shape<4>{s.b, 1, s.tq, s.tk}}) {
      if (large && shape[0] != 1) break;
      auto m = ref::random_additive<Scalar>(shape, seed++);
      AttentionMask<Scalar> mask;
      mask.additive(m.view());
      ref::DenseMask dense(s.b, s.h, s.tq, s.tk);
      dense.additive(m.view());
      SCOPED_TRACE("rank 4 " + attn::detail::to_string(shape));
      check_paths<Scalar>(s, mask, dense, seed % 2 == 0, seed);
    }
  }
}

TYPED_TEST(KernelPaths, KeyLengthsMatchReference) {
  std::uint64_t seed = 800;
  for (const Dims& s : kGeneral) {
    std::vector<Index> lengths;
    for (Index b = 0; b < s.b; ++b) lengths.push_back(b == 0 ? s.tk - s.tk / 3 : 1);
    AttentionMask<TypeParam> mask;
    mask.key_lengths(lengths);
    ref::DenseMask dense(s.b, s.h, s.tq, s.tk);
    dense.key_lengths(lengths);
    check_paths<TypeParam>(s, mask, dense, seed % 2 == 0, seed);
    ++seed;
  }
}

TYPED_TEST(KernelPaths, KeyPaddingMatchesReference) {
  std::uint64_t seed = 900;
  for (const Dims& s : kGeneral) {
    const auto pad = ref::random_bools(Shape<2>{s.b, s.tk}, seed++, 0.3);
    AttentionMask<TypeParam> mask;
    mask.key_padding(pad.view());
    ref::DenseMask dense(s.b, s.h, s.tq, s.tk);
    dense.key_padding(pad.view());
    check_paths<TypeParam>(s, mask, dense, seed % 2 == 1, seed);
  }
}

TYPED_TEST(KernelPaths, CombinedMasksMatchReference) {
  using Scalar = TypeParam;
  std::uint64_t seed = 1000;
  for (const Dims& s : kGeneral) {
    // causal (bottom-right) + blocked (1, H, ...) + additive (B, ...) + lengths + padding
    auto blocked = ref::random_bools(Shape<4>{1, s.h, s.tq, s.tk}, seed++, 0.2);
    auto additive = ref::random_additive<Scalar>(Shape<3>{s.b, s.tq, s.tk}, seed++);
    const auto pad = ref::random_bools(Shape<2>{s.b, s.tk}, seed++, 0.2);
    std::vector<Index> lengths;
    for (Index b = 0; b < s.b; ++b) lengths.push_back(s.tk - b * (s.tk / 4));
    AttentionMask<Scalar> mask;
    mask.causal(CausalAlignment::kBottomRight)
        .blocked(blocked.view())
        .additive(additive.view())
        .key_lengths(lengths)
        .key_padding(pad.view());
    ref::DenseMask dense(s.b, s.h, s.tq, s.tk);
    dense.causal(CausalAlignment::kBottomRight)
        .boolean(blocked.view(), false)
        .additive(additive.view())
        .key_lengths(lengths)
        .key_padding(pad.view());
    check_paths<Scalar>(s, mask, dense, seed % 2 == 0, seed);
  }
}

TYPED_TEST(KernelPaths, CausalTopLeftWithAllowedMaskAndPaddingMatchesReference) {
  using Scalar = TypeParam;
  const Dims s{2, 2, 300, 140, 8, 4};
  const auto allowed = ref::random_bools(Shape<2>{s.tq, s.tk}, 51, 0.8);
  const auto pad = ref::random_bools(Shape<2>{s.b, s.tk}, 52, 0.1);
  AttentionMask<Scalar> mask;
  mask.causal(CausalAlignment::kTopLeft).allowed(allowed.view()).key_padding(pad.view());
  ref::DenseMask dense(s.b, s.h, s.tq, s.tk);
  dense.causal(CausalAlignment::kTopLeft).boolean(allowed.view(), true).key_padding(pad.view());
  check_paths<Scalar>(s, mask, dense, true, 53);
}

TYPED_TEST(KernelPaths, FusedQkvBufferViewsMatchReference) {
  // q, k, v as strided views of one (B, T, 3, H, hd) buffer, the layout MultiHeadAttention
  // projects into; out written into a (B, T, H, hd) buffer (heads side by side).
  using Scalar = TypeParam;
  const Index b = 2, t = 150, h = 4, hd = 8, d = h * hd;
  const auto qkv = attn::test::random_tensor<Scalar>(Shape<2>{b * t, 3 * d}, 61);
  const Shape<4> shape{b, h, t, hd}, strides{t * 3 * d, hd, 3 * d, 1};
  const TensorView<const Scalar, 4> q(qkv.data(), shape, strides),
      k(qkv.data() + d, shape, strides), v(qkv.data() + 2 * d, shape, strides);
  ref::DenseMask dense(b, h, t, t);
  dense.causal(CausalAlignment::kSquare);
  const auto expected = ref::attention(q, k, v, dense, 1 / std::sqrt(ref::Real(hd)));
  for (const AttentionPath path : {AttentionPath::kMaterialized, AttentionPath::kStreaming}) {
    SCOPED_TRACE(name(path));
    Tensor<Scalar, 3> ctx({b, t, d}, std::numeric_limits<Scalar>::quiet_NaN());
    const TensorView<Scalar, 4> out(ctx.data(), shape, {t * d, hd, d, 1});
    AttentionOptions options;
    options.path = path;
    AttentionMask<Scalar> mask;
    mask.causal();
    attn::scaled_dot_product_attention<Scalar>(q, k, v, out, mask, options);
    EXPECT_TRUE(ref::all_near(TensorView<const Scalar, 4>(out), expected.output.view(),
                              ref::kernel_tolerance<Scalar>(hd, t)));
  }
}

TYPED_TEST(KernelPaths, LongStridedKeysAreCopiedHeadMajorWithoutChangingResults) {
  // Keys and values whose rows of one head span more than detail::kKeyValueCopyBytes are
  // copied head-major before the streaming kernel walks them (a speed measure for long
  // sequences split out of a fused projection). The copy must change no arithmetic: the
  // output is bit-identical to the same call on contiguous copies, and matches the
  // reference. Row stride 1100 over 2100 keys: 9 MiB in float, 18 MiB in double.
  using Scalar = TypeParam;
  const Index h = 2, hd = 8, tq = 70, tk = 2100, rs = 1100;
  ASSERT_GT(std::size_t(tk * rs) * sizeof(Scalar), attn::detail::kKeyValueCopyBytes);
  const auto q = attn::test::random_tensor<Scalar>(Shape<4>{1, h, tq, hd}, 81);
  const auto buffer = attn::test::random_tensor<Scalar>(Shape<2>{tk, rs}, 82);
  const Shape<4> shape{1, h, tk, hd}, strides{tk * rs, hd, rs, 1};
  const TensorView<const Scalar, 4> k(buffer.data(), shape, strides),
      v(buffer.data() + 2 * hd, shape, strides);
  AttentionMask<Scalar> mask;
  mask.causal(CausalAlignment::kBottomRight).key_lengths({tk - 7});
  AttentionOptions options;
  options.path = AttentionPath::kStreaming;

  attn::Workspace ws_strided, ws_contiguous;
  Tensor<Scalar, 4> out_strided({1, h, tq, hd}), out_contiguous({1, h, tq, hd});
  attn::scaled_dot_product_attention<Scalar>(q.view(), k, v, out_strided.view(), ws_strided, mask,
                                             options);
  const auto k_copy = attn::contiguous(k), v_copy = attn::contiguous(v);
  attn::scaled_dot_product_attention<Scalar>(q.view(), k_copy.view(), v_copy.view(),
                                             out_contiguous.view(), ws_contiguous, mask, options);
  // The strided call held a head-major copy of K and V in its workspace; the other did not.
  const std::size_t kv_bytes = std::size_t(k.size() + v.size()) * sizeof(Scalar);
  EXPECT_GE(ws_strided.bytes(), kv_bytes);
  EXPECT_LT(ws_contiguous.bytes(), kv_bytes);
  EXPECT_EQ(attn::test::max_abs_diff(out_strided.view(), out_contiguous.view()), 0.0);

  ref::DenseMask dense(1, h, tq, tk);
  dense.causal(CausalAlignment::kBottomRight);
  dense.key_lengths({tk - 7});
  const auto expected = ref::attention(q.view(), k, v, dense, 1 / std::sqrt(ref::Real(hd)));
  EXPECT_TRUE(ref::all_near(TensorView<const Scalar, 4>(out_strided.view()), expected.output.view(),
                            ref::kernel_tolerance<Scalar>(hd, tk)));
}

// out may be q itself (same data, shape and strides): every task reads its query rows before
// it writes the same output rows, on both paths, at any thread count. The result is the
// out-of-place one, bit for bit.
TYPED_TEST(KernelPaths, OutExactlyOverQGivesTheOutOfPlaceBits) {
  using Scalar = TypeParam;
  const Index b = 2, h = 2, t = 130, d = 16;  // three query tiles, two key tiles
  const auto k = attn::test::random_tensor<Scalar>(Shape<4>{b, h, t, d}, 91);
  const auto v = attn::test::random_tensor<Scalar>(Shape<4>{b, h, t, d}, 92);
  AttentionMask<Scalar> mask;
  mask.causal();
  for (const bool split : {false, true}) {
    for (const int threads : {1, 2}) {
      attn::set_num_threads(threads);
      for (const AttentionPath path : {AttentionPath::kMaterialized, AttentionPath::kStreaming}) {
        SCOPED_TRACE(std::string(name(path)) + (split ? " split" : " contiguous") +
                     " threads=" + std::to_string(threads));
        AttentionOptions options;
        options.path = path;
        const Shape<4> shape = split ? Shape<4>{b, t, h, d} : Shape<4>{b, h, t, d};
        Tensor<Scalar, 4> storage = attn::test::random_tensor<Scalar>(shape, 93);
        const TensorView<Scalar, 4> q = heads_view(storage, split);
        Tensor<Scalar, 4> expected({b, h, t, d});
        attn::scaled_dot_product_attention<Scalar>(q, k.view(), v.view(), expected.view(), mask,
                                                   options);
        attn::scaled_dot_product_attention<Scalar>(q, k.view(), v.view(), q, mask, options);
        EXPECT_TRUE(ref::same_bits(TensorView<const Scalar, 4>(q), expected.view()));
        if (path == AttentionPath::kStreaming) continue;
        // with weights (materialised), in place too (q refilled where it is: q views storage)
        const Tensor<Scalar, 4> fresh = attn::test::random_tensor<Scalar>(shape, 93);
        attn::copy(fresh.view(), storage.view());
        Tensor<Scalar, 4> weights({b, h, t, t}), expected_weights({b, h, t, t});
        attn::scaled_dot_product_attention_with_weights<Scalar>(
            q, k.view(), v.view(), expected.view(), expected_weights.view(), mask);
        attn::scaled_dot_product_attention_with_weights<Scalar>(q, k.view(), v.view(), q,
                                                                weights.view(), mask);
        EXPECT_TRUE(ref::same_bits(TensorView<const Scalar, 4>(q), expected.view()));
        EXPECT_TRUE(ref::same_bits(weights.view(), expected_weights.view()));
      }
    }
  }
}

TYPED_TEST(KernelPaths, AllocatingRank2And3FormsMatchReference) {
  using Scalar = TypeParam;
  const Index t = 90, tk = 140, d = 3, dv = 5;
  const auto q = attn::test::random_tensor<Scalar>(Shape<2>{t, d}, 71);
  const auto k = attn::test::random_tensor<Scalar>(Shape<2>{tk, d}, 72);
  const auto v = attn::test::random_tensor<Scalar>(Shape<2>{tk, dv}, 73);
  AttentionMask<Scalar> mask;
  mask.causal(CausalAlignment::kBottomRight);
  ref::DenseMask dense(1, 1, t, tk);
  dense.causal(CausalAlignment::kBottomRight);
  const auto expected = ref::attention(attn::unsqueeze(attn::unsqueeze(q.view(), 0), 0),
                                       attn::unsqueeze(attn::unsqueeze(k.view(), 0), 0),
                                       attn::unsqueeze(attn::unsqueeze(v.view(), 0), 0), dense,
                                       1 / std::sqrt(ref::Real(d)));
  const double tol = ref::kernel_tolerance<Scalar>(d, tk);
  const auto out2 = attn::scaled_dot_product_attention(q, k, v, mask);
  EXPECT_TRUE(ref::all_near(out2.view(),
                            attn::select(attn::select(expected.output.view(), 0, 0), 0, 0), tol));
  const auto with_weights = attn::scaled_dot_product_attention_with_weights(q, k, v, mask);
  EXPECT_TRUE(ref::all_near(with_weights.weights.view(),
                            attn::select(attn::select(expected.weights.view(), 0, 0), 0, 0), tol));
  const auto out3 =
      attn::scaled_dot_product_attention(attn::unsqueeze(q.view(), 0), attn::unsqueeze(k.view(), 0),
                                         attn::unsqueeze(v.view(), 0), mask);
  EXPECT_TRUE(ref::all_near(out3.view(), attn::select(expected.output.view(), 1, 0), tol));
}

}  // namespace
}  // namespace kernel_paths_test

#include "support/bodies_end.hpp"
