// SPDX-License-Identifier: MIT
// tests/attention/reference_attention_backward_test.cpp: the long-double reference backward of
// scaled dot-product attention (reference_attention_backward.hpp), the yardstick of attn's
// backward kernels, checked by central finite differences of the reference forward for every
// mask kind: none, boolean allowed / blocked, additive with -inf, key padding, key lengths,
// causal square / top-left / bottom-right, fully masked rows (zero gradients), dropout with
// given keep decisions, a custom scale.
#include "attention/reference_attention_backward.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "attention/reference_attention.hpp"
#include "attn/attn.hpp"
#include "support/finite_difference.hpp"
#include "support/test_support.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace reference_attention_backward_test {

namespace {

using attn::CausalAlignment;
using attn::Index;
using attn::Shape;
using attn::Tensor;
namespace ref = attn::test::ref;
namespace fd = attn::test::fd;

struct Problem {
  Index b = 2, h = 2, tq = 5, tk = 6, d = 3, dv = 4;
};

/// Checks ref::attention_backward against finite differences of ref::attention on random
/// q, k, v and upstream gradient, for the mask that `make_mask` builds.
void expect_matches_finite_differences(const Problem& p,
                                       const std::function<ref::DenseMask()>& make_mask,
                                       ref::Real scale, const std::vector<char>* keep = nullptr,
                                       ref::Real dropout = 0) {
  auto q = attn::test::random_tensor<double>(Shape<4>{p.b, p.h, p.tq, p.d}, 1);
  auto k = attn::test::random_tensor<double>(Shape<4>{p.b, p.h, p.tk, p.d}, 2);
  auto v = attn::test::random_tensor<double>(Shape<4>{p.b, p.h, p.tk, p.dv}, 3);
  const auto w = attn::test::random_tensor<double>(Shape<4>{p.b, p.h, p.tq, p.dv}, 4);
  const ref::DenseMask mask = make_mask();
  const auto grads =
      ref::attention_backward(q.view(), k.view(), v.view(), w.view(), mask, scale, keep, dropout);
  const auto loss = [&] {
    const auto r = ref::attention(q.view(), k.view(), v.view(), mask, scale, keep, dropout);
    return fd::weighted_sum(r.output.view(), w.view());
  };
  EXPECT_TRUE(fd::check(loss, {fd::variable("dq", q.view(), grads.query.view()),
                               fd::variable("dk", k.view(), grads.key.view()),
                               fd::variable("dv", v.view(), grads.value.view())}));
}

ref::Real default_scale(const Problem& p) { return 1 / std::sqrt(static_cast<ref::Real>(p.d)); }

TEST(ReferenceAttentionBackward, NoMask) {
  const Problem p;
  expect_matches_finite_differences(
      p, [&] { return ref::DenseMask(p.b, p.h, p.tq, p.tk); }, default_scale(p));
}

TEST(ReferenceAttentionBackward, BooleanMasksBothPolarities) {
  const Problem p;
  const auto allowed = ref::random_bools(Shape<4>{p.b, p.h, p.tq, p.tk}, 5, 0.7);
  expect_matches_finite_differences(
      p,
      [&] { return ref::DenseMask(p.b, p.h, p.tq, p.tk).boolean(allowed.view(), /*allows=*/true); },
      default_scale(p));
  const auto blocked = ref::random_bools(Shape<2>{p.tq, p.tk}, 6, 0.3);
  expect_matches_finite_differences(
      p,
      [&] {
        return ref::DenseMask(p.b, p.h, p.tq, p.tk).boolean(blocked.view(), /*allows=*/false);
      },
      default_scale(p));
}

TEST(ReferenceAttentionBackward, AdditiveMaskWithMinusInfinity) {
  const Problem p;
  const auto additive = ref::random_additive<double>(Shape<3>{p.b, p.tq, p.tk}, 7);
  expect_matches_finite_differences(
      p, [&] { return ref::DenseMask(p.b, p.h, p.tq, p.tk).additive(additive.view()); },
      default_scale(p));
}

TEST(ReferenceAttentionBackward, KeyPaddingAndKeyLengths) {
  const Problem p;
  Tensor<bool, 2> pad({p.b, p.tk});
  pad(0, 1) = pad(1, 5) = pad(1, 2) = true;
  expect_matches_finite_differences(
      p, [&] { return ref::DenseMask(p.b, p.h, p.tq, p.tk).key_padding(pad.view()); },
      default_scale(p));
  expect_matches_finite_differences(
      p,
      [&] {
        return ref::DenseMask(p.b, p.h, p.tq, p.tk).key_lengths({4, 6});
      },
      default_scale(p));
}

TEST(ReferenceAttentionBackward, CausalEveryAlignment) {
  Problem square;
  square.tk = square.tq;
  expect_matches_finite_differences(
      square,
      [&] {
        return ref::DenseMask(square.b, square.h, square.tq, square.tk)
            .causal(CausalAlignment::kSquare);
      },
      default_scale(square));
  const Problem wide;  // T_q = 5 < T_k = 6
  for (const auto alignment : {CausalAlignment::kTopLeft, CausalAlignment::kBottomRight}) {
    expect_matches_finite_differences(
        wide, [&] { return ref::DenseMask(wide.b, wide.h, wide.tq, wide.tk).causal(alignment); },
        default_scale(wide));
  }
}

TEST(ReferenceAttentionBackward, FullyMaskedRowsGetZeroGradientsAndNoNaN) {
  Problem tall;  // T_q = 7 > T_k = 4, bottom-right: queries 0-2 see no key
  tall.tq = 7;
  tall.tk = 4;
  const auto make = [&] {
    return ref::DenseMask(tall.b, tall.h, tall.tq, tall.tk).causal(CausalAlignment::kBottomRight);
  };
  expect_matches_finite_differences(tall, make, default_scale(tall));
  const auto q = attn::test::random_tensor<double>(Shape<4>{tall.b, tall.h, tall.tq, tall.d}, 8);
  const auto k = attn::test::random_tensor<double>(Shape<4>{tall.b, tall.h, tall.tk, tall.d}, 9);
  const auto w = attn::test::random_tensor<double>(Shape<4>{tall.b, tall.h, tall.tq, tall.d}, 10);
  const auto g =
      ref::attention_backward(q.view(), k.view(), k.view(), w.view(), make(), default_scale(tall));
  EXPECT_TRUE(ref::all_finite(g.query.view()) && ref::all_finite(g.key.view()));
  for (Index b = 0; b < tall.b; ++b) {
    for (Index h = 0; h < tall.h; ++h) {
      for (Index i = 0; i < 3; ++i) {
        for (Index e = 0; e < tall.d; ++e) EXPECT_EQ(g.query(b, h, i, e), 0.0);
      }
    }
  }
  // Every key masked for one batch item: its dK and dV are zero too.
  Tensor<bool, 2> pad({tall.b, tall.tk});
  for (Index j = 0; j < tall.tk; ++j) pad(1, j) = true;
  const auto padded = ref::attention_backward(
      q.view(), k.view(), k.view(), w.view(),
      ref::DenseMask(tall.b, tall.h, tall.tq, tall.tk).key_padding(pad.view()),
      default_scale(tall));
  for (Index h = 0; h < tall.h; ++h) {
    for (Index j = 0; j < tall.tk; ++j) {
      for (Index e = 0; e < tall.d; ++e) {
        EXPECT_EQ(padded.key(1, h, j, e), 0.0);
        EXPECT_EQ(padded.value(1, h, j, e), 0.0);
      }
    }
  }
}

TEST(ReferenceAttentionBackward, DropoutWithGivenKeepDecisionsAndCustomScale) {
  const Problem p;
  const auto keep_mask = ref::random_bools(Shape<4>{p.b, p.h, p.tq, p.tk}, 11, 0.7);
  const std::vector<char> keep(keep_mask.data(), keep_mask.data() + keep_mask.size());
  const auto make = [&] {
    return ref::DenseMask(p.b, p.h, p.tq, p.tk).causal(CausalAlignment::kBottomRight);
  };
  expect_matches_finite_differences(p, make, default_scale(p), &keep, 0.3);
  expect_matches_finite_differences(p, make, 0.7);  // unscaled-style custom scale
}

}  // namespace

}  // namespace reference_attention_backward_test

#include "support/bodies_end.hpp"
