// SPDX-License-Identifier: MIT
// tests/attention/masking_test.cpp: what masks mean, on both kernel paths and through the
// modules: fully masked rows give zeros (never NaN), causal outputs ignore later tokens,
// padded keys are ignored, allowed/blocked polarity, additive -inf == blocked, and large
// logits stay finite.
//
// "Does not change" is checked bit for bit: the same computation runs on the same shapes
// and only values that are multiplied by a zero weight (or never read) differ. Comparisons
// between different mask kinds that mean the same thing use ref::kernel_tolerance
// ((d + T_k) eps; see reference_attention.hpp), since the kernels may take different loop
// bounds (and so different product shapes) for them.
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

namespace masking_test {
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

constexpr AttentionPath kPaths[] = {AttentionPath::kMaterialized, AttentionPath::kStreaming};

const char* name(AttentionPath path) {
  return path == AttentionPath::kMaterialized ? "materialized" : "streaming";
}

template <class Scalar>
class Masking : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Masking, Scalars, );

/// Row (b, h, i) of a rank-4 tensor as a vector.
template <class Scalar>
std::vector<Scalar> row4(const Tensor<Scalar, 4>& t, Index b, Index h, Index i) {
  return attn::test::to_vector(
      attn::select(attn::select(attn::select(t.view(), 0, b), 0, h), 0, i));
}

/// Rows [0, rows) of every (b, h) as one tensor (B, H, rows, d).
template <class Scalar>
Tensor<Scalar, 4> first_rows(const Tensor<Scalar, 4>& t, Index rows) {
  return Tensor<Scalar, 4>(attn::slice(t.view(), 2, 0, rows));
}

TYPED_TEST(Masking, FullyMaskedRowGivesZeroOutputAndWeightsOnBothPaths) {
  using Scalar = TypeParam;
  const Index b = 2, h = 2, tq = 150, tk = 140, d = 8;
  const auto q = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tq, d}, 1);
  const auto k = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tk, d}, 2);
  const auto v = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tk, d}, 3);
  const Scalar neg_inf = -std::numeric_limits<Scalar>::infinity();

  // Each case fully masks query rows `rows` of batch item `batch` (every head) and leaves
  // other rows with something visible.
  Tensor<bool, 2> blocked_row({tq, tk});
  for (Index j = 0; j < tk; ++j) blocked_row(70, j) = true;
  Tensor<bool, 2> allowed_none(Shape<2>{tq, tk}, true);
  for (Index j = 0; j < tk; ++j) allowed_none(130, j) = false;
  Tensor<Scalar, 2> additive_row({tq, tk});
  for (Index j = 0; j < tk; ++j) additive_row(3, j) = neg_inf;
  Tensor<bool, 2> padding({b, tk});
  for (Index j = 0; j < tk; ++j) padding(1, j) = true;

  struct Case {
    std::string label;
    AttentionMask<Scalar> mask;
    Index batch, first_row, end_row;   // fully masked rows [first_row, end_row) of `batch`
    Index visible_batch, visible_row;  // a row that does see keys
  };
  std::vector<Case> cases;
  cases.push_back(
      {"blocked row", AttentionMask<Scalar>().blocked(blocked_row.view()), 0, 70, 71, 0, 71});
  cases.push_back(
      {"allowed none", AttentionMask<Scalar>().allowed(allowed_none.view()), 1, 130, 131, 1, 129});
  cases.push_back(
      {"additive -inf row", AttentionMask<Scalar>().additive(additive_row.view()), 0, 3, 4, 0, 4});
  cases.push_back({"key_lengths 0", AttentionMask<Scalar>().key_lengths({tk, 0}), 1, 0, tq, 0, 0});
  cases.push_back(
      {"key_padding all", AttentionMask<Scalar>().key_padding(padding.view()), 1, 0, tq, 0, 0});
  // bottom-right with T_q > T_k: the first T_q - T_k queries see no key
  cases.push_back({"causal bottom-right",
                   AttentionMask<Scalar>().causal(CausalAlignment::kBottomRight), 0, 0, tq - tk, 1,
                   tq - tk});

  for (const Case& c : cases) {
    for (const bool dropout : {false, true}) {
      AttentionOptions options;
      if (dropout) options.dropout = 0.25;
      for (const AttentionPath path : kPaths) {
        SCOPED_TRACE(c.label + ", " + name(path) + (dropout ? ", dropout 0.25" : ""));
        Tensor<Scalar, 4> weights;
        const bool with_weights = path == AttentionPath::kMaterialized;
        const auto out = ref::run_kernel<Scalar>(q.view(), k.view(), v.view(), c.mask, options,
                                                 path, with_weights ? &weights : nullptr);
        EXPECT_TRUE(ref::all_finite(out.view()));
        for (Index hi = 0; hi < h; ++hi) {
          for (Index i = c.first_row; i < c.end_row; ++i) {
            ASSERT_THAT(row4(out, c.batch, hi, i), ::testing::Each(Scalar(0))) << "row " << i;
            if (with_weights) {
              ASSERT_THAT(row4(weights, c.batch, hi, i), ::testing::Each(Scalar(0)));
            }
          }
          // A row with visible keys is not zero (the case masks only what it says).
          EXPECT_THAT(row4(out, c.visible_batch, hi, c.visible_row),
                      ::testing::Contains(::testing::Ne(Scalar(0))));
        }
        if (with_weights) {
          EXPECT_TRUE(ref::all_finite(weights.view()));
        }
      }
    }
  }
}

TYPED_TEST(Masking, EverythingMaskedGivesAllZerosNotNaN) {
  using Scalar = TypeParam;
  const Index b = 1, h = 2, t = 200, d = 8;
  const auto q = attn::test::random_tensor<Scalar>(Shape<4>{b, h, t, d}, 4);
  const Tensor<Scalar, 2> additive(Shape<2>{t, t}, -std::numeric_limits<Scalar>::infinity());
  AttentionMask<Scalar> mask;
  mask.causal().additive(additive.view());
  for (const AttentionPath path : kPaths) {
    SCOPED_TRACE(name(path));
    Tensor<Scalar, 4> weights;
    const auto out =
        ref::run_kernel<Scalar>(q.view(), q.view(), q.view(), mask, {}, path,
                                path == AttentionPath::kMaterialized ? &weights : nullptr);
    EXPECT_THAT(attn::test::to_vector(out.view()), ::testing::Each(Scalar(0)));
    if (path == AttentionPath::kMaterialized) {
      EXPECT_THAT(attn::test::to_vector(weights.view()), ::testing::Each(Scalar(0)));
    }
  }
}

// Query i's output must not depend on keys, values or queries after the causal bound.
template <class Scalar>
void check_causal_ignores_future(Index tq, Index tk, CausalAlignment alignment) {
  const Index b = 2, h = 2, d = 8, dv = 5;
  auto q = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tq, d}, 10);
  auto k = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tk, d}, 11);
  auto v = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tk, dv}, 12);
  const Index offset = alignment == CausalAlignment::kBottomRight ? tk - tq : 0;
  const Index last = 70;                         // query rows [0, last] must not change
  const Index first_hidden = last + offset + 1;  // keys from here on are invisible to them
  AttentionMask<Scalar> mask;
  mask.causal(alignment);
  for (const AttentionPath path : kPaths) {
    SCOPED_TRACE(name(path));
    const auto before = ref::run_kernel<Scalar>(q.view(), k.view(), v.view(), mask, {}, path);
    auto q2 = q, k2 = k, v2 = v;
    for (Index bi = 0; bi < b; ++bi)
      for (Index hi = 0; hi < h; ++hi) {
        for (Index i = last + 1; i < tq; ++i)
          for (Index e = 0; e < d; ++e) q2(bi, hi, i, e) += Scalar(3);
        for (Index j = first_hidden; j < tk; ++j) {
          for (Index e = 0; e < d; ++e) k2(bi, hi, j, e) = -k2(bi, hi, j, e) * Scalar(5);
          for (Index e = 0; e < dv; ++e) v2(bi, hi, j, e) += Scalar(7);
        }
      }
    const auto after = ref::run_kernel<Scalar>(q2.view(), k2.view(), v2.view(), mask, {}, path);
    EXPECT_TRUE(
        ref::same_bits(first_rows(before, last + 1).view(), first_rows(after, last + 1).view()));
    // ... while the later rows did change (the perturbation reached the kernel).
    EXPECT_NE(row4(before, 0, 0, tq - 1), row4(after, 0, 0, tq - 1));
  }
}

TYPED_TEST(Masking, CausalOutputsIgnoreLaterTokens) {
  SCOPED_TRACE("square");
  check_causal_ignores_future<TypeParam>(200, 200, CausalAlignment::kSquare);
}

TYPED_TEST(Masking, CausalTopLeftOutputsIgnoreLaterKeys) {
  check_causal_ignores_future<TypeParam>(150, 260, CausalAlignment::kTopLeft);
  check_causal_ignores_future<TypeParam>(260, 150, CausalAlignment::kTopLeft);
}

TYPED_TEST(Masking, CausalBottomRightOutputsIgnoreLaterKeys) {
  check_causal_ignores_future<TypeParam>(150, 260, CausalAlignment::kBottomRight);
  check_causal_ignores_future<TypeParam>(200, 140, CausalAlignment::kBottomRight);
}

TYPED_TEST(Masking, CausalModulesIgnoreLaterTokens) {
  using Scalar = TypeParam;
  const Index b = 2, t = 150, d_in = 12, last = 90;
  attn::manual_seed(5);
  attn::CausalAttention<Scalar> single(d_in, 8, t, 0.0);
  attn::MultiHeadAttention<Scalar> multi(d_in, 12, t, 0.0, 3);
  attn::MultiHeadAttentionWrapper<Scalar> wrapper(d_in, 4, t, 0.0, 2);
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{b, t, d_in}, 20);
  auto x2 = x;
  for (Index bi = 0; bi < b; ++bi)
    for (Index i = last + 1; i < t; ++i)
      for (Index e = 0; e < d_in; ++e) x2(bi, i, e) = Scalar(2) - x2(bi, i, e);
  const auto check = [&](const Tensor<Scalar, 3>& before, const Tensor<Scalar, 3>& after) {
    EXPECT_TRUE(ref::same_bits(attn::slice(before.view(), 1, 0, last + 1),
                               attn::slice(after.view(), 1, 0, last + 1)));
    EXPECT_NE(attn::test::row(before, 1, t - 1), attn::test::row(after, 1, t - 1));
  };
  {
    SCOPED_TRACE("CausalAttention");
    check(single.forward(x.view()), single.forward(x2.view()));
  }
  {
    SCOPED_TRACE("MultiHeadAttention");
    check(multi.forward(x.view()), multi.forward(x2.view()));
  }
  {
    SCOPED_TRACE("MultiHeadAttentionWrapper");
    check(wrapper.forward(x.view()), wrapper.forward(x2.view()));
  }
}

TYPED_TEST(Masking, KeyPaddingIgnoresPaddedKeys) {
  using Scalar = TypeParam;
  const Index b = 2, h = 3, tq = 100, tk = 200, d = 8;
  const auto q = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tq, d}, 30);
  const auto k = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tk, d}, 31);
  const auto v = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tk, d}, 32);
  const auto pad = ref::random_bools(Shape<2>{b, tk}, 33, 0.4);
  auto k2 = k, v2 = v;
  for (Index bi = 0; bi < b; ++bi)
    for (Index hi = 0; hi < h; ++hi)
      for (Index j = 0; j < tk; ++j) {
        if (!pad(bi, j)) continue;
        for (Index e = 0; e < d; ++e) {
          k2(bi, hi, j, e) = Scalar(40) * k2(bi, hi, j, e);  // would dominate if visible
          v2(bi, hi, j, e) = Scalar(-9);
        }
      }
  AttentionMask<Scalar> mask;
  mask.key_padding(pad.view());
  for (const AttentionPath path : kPaths) {
    SCOPED_TRACE(name(path));
    const auto before = ref::run_kernel<Scalar>(q.view(), k.view(), v.view(), mask, {}, path);
    const auto after = ref::run_kernel<Scalar>(q.view(), k2.view(), v2.view(), mask, {}, path);
    EXPECT_TRUE(ref::same_bits(before.view(), after.view()));
    const auto unmasked = ref::run_kernel<Scalar>(q.view(), k2.view(), v2.view(), {}, {}, path);
    EXPECT_FALSE(ref::all_near(before.view(), unmasked.view(), 0.1));  // padding mattered
  }
}

TYPED_TEST(Masking, KeyPaddingLengthsAndBooleanMaskAgree) {
  using Scalar = TypeParam;
  const Index b = 3, h = 2, tq = 70, tk = 300, d = 8;
  const auto q = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tq, d}, 40);
  const auto k = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tk, d}, 41);
  const auto v = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tk, d}, 42);
  const std::vector<Index> lengths = {300, 129, 1};
  Tensor<bool, 2> padding({b, tk});
  Tensor<bool, 4> allowed({b, 1, tq, tk});
  for (Index bi = 0; bi < b; ++bi)
    for (Index j = 0; j < tk; ++j) {
      padding(bi, j) = j >= lengths[static_cast<std::size_t>(bi)];
      for (Index i = 0; i < tq; ++i) allowed(bi, 0, i, j) = !padding(bi, j);
    }
  const double tol = ref::kernel_tolerance<Scalar>(d, tk);
  for (const AttentionPath path : kPaths) {
    SCOPED_TRACE(name(path));
    const auto by_lengths = ref::run_kernel<Scalar>(
        q.view(), k.view(), v.view(), AttentionMask<Scalar>().key_lengths(lengths), {}, path);
    const auto by_padding =
        ref::run_kernel<Scalar>(q.view(), k.view(), v.view(),
                                AttentionMask<Scalar>().key_padding(padding.view()), {}, path);
    const auto by_mask = ref::run_kernel<Scalar>(
        q.view(), k.view(), v.view(), AttentionMask<Scalar>().allowed(allowed.view()), {}, path);
    EXPECT_TRUE(ref::all_near(by_lengths.view(), by_padding.view(), tol));
    EXPECT_TRUE(ref::all_near(by_lengths.view(), by_mask.view(), tol));
  }
}

TYPED_TEST(Masking, AllowedMaskEqualsBlockedOfItsNegation) {
  using Scalar = TypeParam;
  const Index b = 2, h = 2, tq = 130, tk = 150, d = 8;
  const auto q = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tq, d}, 50);
  const auto k = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tk, d}, 51);
  const auto v = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tk, d}, 52);
  const auto m = ref::random_bools(Shape<3>{b, tq, tk}, 53, 0.6);
  Tensor<bool, 3> not_m(m.shape());
  for (Index i = 0; i < m.size(); ++i) not_m.data()[i] = !m.data()[i];
  for (const AttentionPath path : kPaths) {
    SCOPED_TRACE(name(path));
    Tensor<Scalar, 4> w_allowed, w_blocked;
    const bool weights = path == AttentionPath::kMaterialized;
    const auto allowed = ref::run_kernel<Scalar>(q.view(), k.view(), v.view(),
                                                 AttentionMask<Scalar>().allowed(m.view()), {},
                                                 path, weights ? &w_allowed : nullptr);
    const auto blocked = ref::run_kernel<Scalar>(q.view(), k.view(), v.view(),
                                                 AttentionMask<Scalar>().blocked(not_m.view()), {},
                                                 path, weights ? &w_blocked : nullptr);
    EXPECT_TRUE(ref::same_bits(allowed.view(), blocked.view()));
    if (weights) {
      EXPECT_TRUE(ref::same_bits(w_allowed.view(), w_blocked.view()));
    }
    // and the opposite polarity is a different mask
    const auto swapped = ref::run_kernel<Scalar>(
        q.view(), k.view(), v.view(), AttentionMask<Scalar>().blocked(m.view()), {}, path);
    EXPECT_FALSE(ref::all_near(allowed.view(), swapped.view(), 0.01));
  }
}

TYPED_TEST(Masking, AdditiveNegativeInfinityEqualsBlocked) {
  using Scalar = TypeParam;
  const Index b = 2, h = 2, tq = 100, tk = 270, d = 8;
  const auto q = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tq, d}, 60);
  const auto k = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tk, d}, 61);
  const auto v = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tk, d}, 62);
  const auto blocked = ref::random_bools(Shape<4>{1, h, tq, tk}, 63, 0.5);
  Tensor<Scalar, 4> additive(blocked.shape());
  for (Index i = 0; i < blocked.size(); ++i) {
    additive.data()[i] = blocked.data()[i] ? -std::numeric_limits<Scalar>::infinity() : Scalar(0);
  }
  for (const AttentionPath path : kPaths) {
    SCOPED_TRACE(name(path));
    Tensor<Scalar, 4> w_add, w_blocked;
    const bool weights = path == AttentionPath::kMaterialized;
    const auto by_add = ref::run_kernel<Scalar>(q.view(), k.view(), v.view(),
                                                AttentionMask<Scalar>().additive(additive.view()),
                                                {}, path, weights ? &w_add : nullptr);
    const auto by_blocked = ref::run_kernel<Scalar>(q.view(), k.view(), v.view(),
                                                    AttentionMask<Scalar>().blocked(blocked.view()),
                                                    {}, path, weights ? &w_blocked : nullptr);
    EXPECT_TRUE(ref::same_bits(by_add.view(), by_blocked.view()));
    if (weights) {
      EXPECT_TRUE(ref::same_bits(w_add.view(), w_blocked.view()));
    }
  }
}

TYPED_TEST(Masking, LargeLogitsStayFinite) {
  using Scalar = TypeParam;
  const Index b = 1, h = 2, tq = 90, tk = 200, d = 8;
  // |q . k| * scale reaches ~1e4: q, k in [-60, 60), d = 8.
  const auto q = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tq, d}, 70, -60, 60);
  const auto k = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tk, d}, 71, -60, 60);
  const auto v = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tk, d}, 72);
  ref::DenseMask dense(b, h, tq, tk);
  const auto expected =
      ref::attention(q.view(), k.view(), v.view(), dense, 1 / std::sqrt(ref::Real(d)));
  // The score of a d-term product of size ~|s| carries a rounding error ~ d |s| eps, which
  // the softmax turns into a relative weight error of the same size.
  double max_logit = 0;
  for (Index i = 0; i < tq; ++i)
    for (Index j = 0; j < tk; ++j) {
      ref::Real dot = 0;
      for (Index e = 0; e < d; ++e) dot += ref::Real(q(0, 0, i, e)) * ref::Real(k(0, 0, j, e));
      max_logit = std::max(max_logit, std::abs(static_cast<double>(dot)) / std::sqrt(8.0));
    }
  EXPECT_GT(max_logit, 5e3);
  const double tol = 2.0 * (static_cast<double>(d) * max_logit + static_cast<double>(tk)) *
                     std::numeric_limits<Scalar>::epsilon();
  for (const AttentionPath path : kPaths) {
    SCOPED_TRACE(name(path));
    Tensor<Scalar, 4> weights;
    const bool with_weights = path == AttentionPath::kMaterialized;
    const auto out = ref::run_kernel<Scalar>(q.view(), k.view(), v.view(), {}, {}, path,
                                             with_weights ? &weights : nullptr);
    EXPECT_TRUE(ref::all_finite(out.view()));
    EXPECT_TRUE(ref::all_near(out.view(), expected.output.view(), tol));
    if (with_weights) {
      EXPECT_TRUE(ref::all_finite(weights.view()));
      for (Index hi = 0; hi < h; ++hi)
        for (Index i = 0; i < tq; ++i) {
          double sum = 0;
          for (const Scalar w : row4(weights, 0, hi, i)) sum += static_cast<double>(w);
          ASSERT_NEAR(sum, 1.0, ref::kernel_tolerance<Scalar>(d, tk)) << "row " << i;
        }
    }
  }
}

TYPED_TEST(Masking, HugeEqualLogitsGiveUniformWeightsAndOneDominantKeyWins) {
  // Scores all -1e4 (through an additive mask on q = 0): exp without subtracting the max
  // underflows to 0/0; with it, weights are uniform. One key at +1e4: weights one-hot.
  using Scalar = TypeParam;
  const Index tq = 3, tk = 150, d = 4;
  const Tensor<Scalar, 4> q(Shape<4>{1, 1, tq, d}, Scalar(0));
  const auto k = attn::test::random_tensor<Scalar>(Shape<4>{1, 1, tk, d}, 80);
  const auto v = attn::test::random_tensor<Scalar>(Shape<4>{1, 1, tk, d}, 81);
  Tensor<Scalar, 2> additive(Shape<2>{tq, tk}, Scalar(-1e4));
  additive(1, 77) = Scalar(1e4);
  additive(2, 140) = Scalar(1e4);
  for (Index j = 0; j < tk; ++j) additive(2, j) += Scalar(-1e4);  // row 2: -2e4 and one 0
  const AttentionMask<Scalar> mask = AttentionMask<Scalar>().additive(additive.view());
  for (const AttentionPath path : kPaths) {
    SCOPED_TRACE(name(path));
    const auto out = ref::run_kernel<Scalar>(q.view(), k.view(), v.view(), mask, {}, path);
    ASSERT_TRUE(ref::all_finite(out.view()));
    for (Index e = 0; e < d; ++e) {
      double mean = 0;
      for (Index j = 0; j < tk; ++j) mean += static_cast<double>(v(0, 0, j, e)) / tk;
      EXPECT_NEAR(out(0, 0, 0, e), mean, ref::kernel_tolerance<Scalar>(d, tk));
      EXPECT_NEAR(out(0, 0, 1, e), v(0, 0, 77, e), ref::kernel_tolerance<Scalar>(d, tk));
      EXPECT_NEAR(out(0, 0, 2, e), v(0, 0, 140, e), ref::kernel_tolerance<Scalar>(d, tk));
    }
  }
}

TYPED_TEST(Masking, ModuleWithFullyPaddedBatchItemGivesOutputBiasNotNaN) {
  // nn.MultiheadAttention returns NaN here; attn returns a zero context, so the output is
  // out_proj's bias.
  using Scalar = TypeParam;
  const Index b = 2, t = 40, d = 16;
  attn::manual_seed(9);
  attn::MultiHeadAttention<Scalar> mha(attn::MultiHeadAttentionOptions::pytorch(d, 4));
  attn::TorchGenerator gen(3);
  gen.fill_uniform(mha.out_proj().bias(), -1.0, 1.0);
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{b, t, d}, 90);
  Tensor<bool, 2> padding({b, t});
  for (Index j = 0; j < t; ++j) padding(1, j) = true;
  const auto y = mha.forward(x.view(), AttentionMask<Scalar>().key_padding(padding.view()));
  ASSERT_TRUE(ref::all_finite(y.view()));
  const auto bias = attn::test::to_vector(mha.out_proj().bias());
  for (Index i = 0; i < t; ++i) EXPECT_EQ(attn::test::row(y, 1, i), bias) << "token " << i;
  EXPECT_NE(attn::test::row(y, 0, 0), bias);
}

}  // namespace
}  // namespace masking_test

#include "support/bodies_end.hpp"
