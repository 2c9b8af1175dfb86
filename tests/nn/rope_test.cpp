// SPDX-License-Identifier: MIT
// tests/nn/rope_test.cpp: RotaryEmbedding against PyTorch 1.13 fixtures written like Hugging
// Face's, GPT-J's and Meta's code (both pair conventions, partial rotary, float and double,
// positions near 0 and past 5000), every call form, RoPE's identities (the transposed
// rotation the backward uses included), and bad arguments.
#include "attn/nn/rope.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "fixtures/pytorch/rope_cases.hpp"
#include "support/scalar_types.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace rope_test {

namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using attn::Index;
using attn::RopeStyle;
using attn::RotaryEmbedding;
using attn::RotaryOptions;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
using attn::test::pytorch::rope_cases;
using attn::test::pytorch::RopeCase;

template <class Scalar>
RotaryEmbedding<Scalar> embedding_of(const RopeCase<Scalar>& c) {
  return RotaryEmbedding<Scalar>(c.head_dim, /*max_positions=*/8192, c.theta,
                                 c.interleaved ? RopeStyle::kInterleaved : RopeStyle::kHalfSplit,
                                 c.rotary_dim);
}

template <class Scalar>
Tensor<Scalar, 4> input_of(const RopeCase<Scalar>& c) {
  const Shape<4> shape{c.x.shape[0], c.x.shape[1], c.x.shape[2], c.x.shape[3]};
  return Tensor<Scalar, 4>(TensorView<const Scalar, 4>(c.x.values, shape));
}

// The feature a rotation pairs with feature f (f itself outside the rotary features).
Index partner(Index f, Index rotary_dim, bool interleaved) {
  if (f >= rotary_dim) return f;
  if (interleaved) return f ^ 1;
  return f < rotary_dim / 2 ? f + rotary_dim / 2 : f - rotary_dim / 2;
}

// Per-element tolerance, from the inputs a (this feature) and b (its partner):
// - float: attn and the fixture rotate by the same float32 angle (the script asserts that its
//   inverse frequencies are attn's), so only rounding differs: cos/sin within 1 ulp (Sleef
//   vs correctly rounded), two products and a sum (1/2 ulp each): 4 eps (|a| + |b|) bounds it.
// - double: the angle p f itself differs: each side's pow is within 1 ulp, the division and
//   the product add 1/2 ulp each, so |delta angle| <= 3.5 eps p f <= 3.5 eps p (f <= 1), and
//   moves the result by |delta angle| (|a| + |b|); plus the float case's 4 eps.
// Features past rotary_dim pass through and must be exact.
template <class Scalar>
double tolerance(double a, double b, Index position, bool rotated) {
  if (!rotated) return 0.0;
  const double eps = std::numeric_limits<Scalar>::epsilon();
  const double angle_term =
      std::is_same_v<Scalar, double> ? 4.0 * static_cast<double>(position) : 0.0;
  return eps * (4.0 + angle_term) * (std::abs(a) + std::abs(b));
}

template <class Scalar>
void expect_matches_fixture(const RopeCase<Scalar>& c, const Tensor<Scalar, 4>& got,
                            const std::string& form) {
  const Index batch = c.x.shape[0], heads = c.x.shape[1], tokens = c.x.shape[2], hd = c.x.shape[3];
  Index failures = 0;
  double worst_ratio = 0;
  for (Index b = 0; b < batch; ++b) {
    for (Index h = 0; h < heads; ++h) {
      for (Index t = 0; t < tokens; ++t) {
        const Index base = ((b * heads + h) * tokens + t) * hd;
        const Index position = c.positions[static_cast<std::size_t>(b * tokens + t)];
        for (Index f = 0; f < hd; ++f) {
          const double expected = c.expected.values[base + f];
          const double actual = got(b, h, t, f);
          const Index g = partner(f, c.rotary_dim, c.interleaved);
          const double tol = tolerance<Scalar>(c.x.values[base + f], c.x.values[base + g], position,
                                               f < c.rotary_dim);
          const double err = std::abs(actual - expected);
          if (!(err <= tol)) {
            if (++failures <= 5) {
              ADD_FAILURE() << c.name << " (" << form << "): (" << b << ", " << h << ", " << t
                            << ", " << f << ") at position " << position << ": attn " << actual
                            << ", PyTorch " << expected << ", |error| " << err << " > tolerance "
                            << tol;
            }
          } else if (tol > 0) {
            worst_ratio = std::max(worst_ratio, err / tol);
          }
        }
      }
    }
  }
  EXPECT_EQ(failures, 0) << c.name << " (" << form << ")";
  ::testing::Test::RecordProperty(std::string(c.name) + "_" + form + "_worst_error_over_tolerance",
                                  std::to_string(worst_ratio));
}

template <class Scalar>
class RopeTyped : public ::testing::Test {};
TYPED_TEST_SUITE(RopeTyped, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

TYPED_TEST(RopeTyped, MatchesPyTorchWithPerTokenPositions) {
  using S = TypeParam;
  for (const RopeCase<S>& c : rope_cases<S>()) {
    const RotaryEmbedding<S> rope = embedding_of(c);
    Tensor<S, 4> x = input_of(c);
    const Tensor<Index, 2> positions(
        TensorView<const Index, 2>(c.positions.data(), {x.extent(0), x.extent(2)}));
    rope.apply(x.view(), positions.view());
    expect_matches_fixture(c, x, "positions");
  }
}

TYPED_TEST(RopeTyped, MatchesPyTorchWithFirstPositionAndRows) {
  using S = TypeParam;
  for (const RopeCase<S>& c : rope_cases<S>()) {
    const RotaryEmbedding<S> rope = embedding_of(c);
    // Per-row positions through the low-level form, one (T, hd) block per (b, h).
    Tensor<S, 4> rows = input_of(c);
    const Index heads = rows.extent(1), tokens = rows.extent(2), hd = rows.extent(3);
    for (Index b = 0; b < rows.extent(0); ++b) {
      for (Index h = 0; h < heads; ++h) {
        rope.apply(&rows(b, h, 0, 0), tokens, hd, c.positions.data() + b * tokens);
      }
    }
    expect_matches_fixture(c, rows, "row_positions");
    if (c.first_position < 0) continue;
    Tensor<S, 4> x = input_of(c);
    rope.apply(x.view(), c.first_position);
    expect_matches_fixture(c, x, "first_position");
    Tensor<S, 4> per_item = input_of(c);
    const std::vector<Index> firsts(static_cast<std::size_t>(x.extent(0)), c.first_position);
    rope.apply(per_item.view(), TensorView<const Index, 1>(firsts.data(), {x.extent(0)}));
    EXPECT_EQ(attn::test::to_vector(per_item), attn::test::to_vector(x)) << c.name;
  }
}

TYPED_TEST(RopeTyped, StridedViewEqualsContiguous) {
  using S = TypeParam;
  // (B, T, H, hd) storage rotated through its (B, H, T, hd) permutation.
  const RotaryEmbedding<S> rope(8, 64, 10000.0, RopeStyle::kHalfSplit, 6);
  const Tensor<S, 4> bthd = attn::test::random_tensor<S, 4>({2, 5, 3, 8}, 11);
  Tensor<S, 4> strided = bthd;
  rope.apply(attn::permute(strided.view(), {0, 2, 1, 3}), 7);
  Tensor<S, 4> contiguous(attn::permute(bthd.view(), {0, 2, 1, 3}));
  rope.apply(contiguous.view(), 7);
  EXPECT_EQ(attn::test::to_vector(attn::permute(strided.view(), {0, 2, 1, 3})),
            attn::test::to_vector(contiguous));
}

TYPED_TEST(RopeTyped, PositionZeroIsTheIdentityAndNormsArePreserved) {
  using S = TypeParam;
  for (const RopeStyle style : {RopeStyle::kHalfSplit, RopeStyle::kInterleaved}) {
    const RotaryEmbedding<S> rope(16, 4096, 10000.0, style);
    const Tensor<S, 4> x = attn::test::random_tensor<S, 4>({1, 2, 1, 16}, 5);
    Tensor<S, 4> y = x;
    rope.apply(y.view(), 0);
    EXPECT_EQ(attn::test::to_vector(y), attn::test::to_vector(x));  // cos 0 = 1, sin 0 = 0
    y = x;
    rope.apply(y.view(), 4000);
    for (Index h = 0; h < 2; ++h) {
      double nx = 0, ny = 0;
      for (Index f = 0; f < 16; ++f) {
        nx += static_cast<double>(x(0, h, 0, f)) * x(0, h, 0, f);
        ny += static_cast<double>(y(0, h, 0, f)) * y(0, h, 0, f);
      }
      // Each pair's norm is kept to a few roundings (cos^2 + sin^2 = 1 within 2 eps).
      EXPECT_NEAR(ny, nx, 8 * std::numeric_limits<S>::epsilon() * nx);
    }
  }
}

TEST(Rope, ScoresDependOnlyOnTheRelativePosition) {
  // <R(m) q, R(n) k> = <q, R(n - m) k>: the reason RoPE exists. In double, with positions
  // 1000 apart, the scores agree to the angle rounding (p eps per pair, see tolerance()).
  for (const RopeStyle style : {RopeStyle::kHalfSplit, RopeStyle::kInterleaved}) {
    const RotaryEmbedding<double> rope(32, 2048, 10000.0, style);
    const Tensor<double, 4> q = attn::test::random_tensor<double, 4>({1, 1, 1, 32}, 1);
    const Tensor<double, 4> k = attn::test::random_tensor<double, 4>({1, 1, 1, 32}, 2);
    const auto score = [&](Index m, Index n) {
      Tensor<double, 4> qr = q, kr = k;
      rope.apply(qr.view(), m);
      rope.apply(kr.view(), n);
      double s = 0;
      for (Index f = 0; f < 32; ++f) s += qr(0, 0, 0, f) * kr(0, 0, 0, f);
      return s;
    };
    EXPECT_NEAR(score(3, 1), score(1003, 1001), 1e-11);
    EXPECT_NEAR(score(7, 12), score(1507, 1512), 1e-11);
    EXPECT_GT(std::abs(score(3, 1) - score(3, 2)), 1e-3);  // and it does depend on it
  }
}

TEST(Rope, TransposedRotationIsTheAdjoint) {
  // The backward's identity: <R x, y> = <x, R^T y> for every position, both conventions and
  // partial rotary (the features past rotary_dim pass through both), and R^T R x = x.
  for (const RopeStyle style : {RopeStyle::kHalfSplit, RopeStyle::kInterleaved}) {
    for (const Index rotary : {Index{0}, Index{4}}) {
      const RotaryEmbedding<double> rope(8, 64, 50.0, style, rotary);
      const Tensor<double, 4> x = attn::test::random_tensor<double, 4>({2, 3, 5, 8}, 3);
      const Tensor<double, 4> y = attn::test::random_tensor<double, 4>({2, 3, 5, 8}, 4);
      Tensor<double, 4> rx = x, rty = y, back = x;
      rope.apply(rx.view(), 7);
      rope.apply_transposed(rty.view(), 7);
      rope.apply(back.view(), 7);
      rope.apply_transposed(back.view(), 7);
      double lhs = 0, rhs = 0, moved = 0;
      for (Index i = 0; i < x.size(); ++i) {
        lhs += rx.data()[i] * y.data()[i];
        rhs += x.data()[i] * rty.data()[i];
        moved = std::max(moved, std::abs(rx.data()[i] - x.data()[i]));
        EXPECT_NEAR(back.data()[i], x.data()[i], 1e-15) << "element " << i;
      }
      EXPECT_NEAR(lhs, rhs, 1e-13);
      EXPECT_GT(moved, 0.1);  // the rotation did move x
    }
  }
  const RotaryEmbedding<float> rope(8, 16);
  Tensor<float, 4> x({1, 1, 4, 8});
  EXPECT_THROW(rope.apply_transposed(x.view(), 13), attn::ConfigError);  // past the table
}

TEST(Rope, FloatTablesFollowHuggingFacesFloat32Steps) {
  // Hugging Face: inv_freq = 1.0 / (10000 ** (arange(0, 128, 2).float() / 128)) and the
  // angle as one float32 product. Entry 1: exponent float(2/128) = 0.015625 (exact), so
  // 10000^0.015625 correctly rounded, then 1 / that, both in float32.
  const RotaryEmbedding<float> rope(128, 8192);
  const float power = static_cast<float>(std::pow(10000.0, 0.015625));
  EXPECT_EQ(rope.inverse_frequencies()(1), 1.0f / power);
  const float angle = 8191.0f * (1.0f / power);
  EXPECT_EQ(rope.cos_row(8191)[1], static_cast<float>(std::cos(static_cast<double>(angle))));
  EXPECT_EQ(rope.sin_row(8191)[1], static_cast<float>(std::sin(static_cast<double>(angle))));
  // A float64 angle would differ here: the float32 rounding is visible at this position.
  EXPECT_NE(static_cast<double>(angle), 8191.0 / std::pow(10000.0, 0.015625));
}

TEST(Rope, ReservePositionsExtendsTheSameTables) {
  RotaryEmbedding<float> grown(64, 10, 500000.0, RopeStyle::kInterleaved);
  grown.reserve_positions(300);
  grown.reserve_positions(20);  // never shrinks
  EXPECT_EQ(grown.max_positions(), 300);
  const RotaryEmbedding<float> direct(64, 300, 500000.0, RopeStyle::kInterleaved);
  for (const Index p : {0, 9, 10, 299}) {
    for (Index i = 0; i < 32; ++i) {
      EXPECT_EQ(grown.cos_row(p)[i], direct.cos_row(p)[i]);
      EXPECT_EQ(grown.sin_row(p)[i], direct.sin_row(p)[i]);
    }
  }
}

TEST(Rope, BadConfigurationsNameTheValues) {
  using attn::ConfigError;
  const auto make = [](Index hd, Index rd, double theta, Index max_positions) {
    return [=] {
      RotaryEmbedding<float>(RotaryOptions{hd, rd, theta, RopeStyle::kHalfSplit, max_positions});
    };
  };
  EXPECT_THAT(
      attn::test::thrown<ConfigError>(make(8, 5, 1e4, 16)),
      AllOf(HasSubstr("attn::RotaryEmbedding"), HasSubstr("rotary_dim=5"), HasSubstr("even")));
  EXPECT_THAT(attn::test::thrown<ConfigError>(make(8, 10, 1e4, 16)),
              AllOf(HasSubstr("head_dim=8"), HasSubstr("rotary_dim=10")));
  EXPECT_THAT(attn::test::thrown<ConfigError>(make(8, -2, 1e4, 16)), HasSubstr("rotary_dim=-2"));
  EXPECT_THAT(attn::test::thrown<ConfigError>(make(7, 0, 1e4, 16)),
              AllOf(HasSubstr("head_dim=7"), HasSubstr("even")));
  EXPECT_THAT(attn::test::thrown<ConfigError>(make(0, 0, 1e4, 16)), HasSubstr("head_dim=0"));
  EXPECT_THAT(attn::test::thrown<ConfigError>(make(8, 0, 0.0, 16)), HasSubstr("theta=0"));
  EXPECT_THAT(attn::test::thrown<ConfigError>(make(8, 0, std::nan(""), 16)),
              HasSubstr("theta=nan"));
  EXPECT_THAT(attn::test::thrown<ConfigError>(make(8, 0, 1e4, -1)), HasSubstr("max_positions=-1"));
}

TEST(Rope, PositionsOutsideTheTablesAreErrorsNamingThem) {
  using attn::ConfigError;
  const RotaryEmbedding<float> rope(8, 100);
  Tensor<float, 4> x({1, 1, 4, 8});
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { rope.apply(x.view(), 97); }),
              AllOf(HasSubstr("positions [97, 101)"), HasSubstr("[0, 100)")));
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { rope.apply(x.view(), -1); }),
              HasSubstr("positions [-1, 3)"));
  const Tensor<Index, 2> positions({1, 4}, {0, 5, 100, 2});
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { rope.apply(x.view(), positions.view()); }),
              HasSubstr("position 100 is outside the table [0, 100)"));
  rope.apply(x.view(), 96);  // the last valid start
}

TEST(Rope, WrongShapesAreShapeErrors) {
  using attn::ShapeError;
  const RotaryEmbedding<float> rope(8, 100);
  Tensor<float, 4> x({2, 1, 4, 6});
  EXPECT_THAT(attn::test::thrown<ShapeError>([&] { rope.apply(x.view(), 0); }),
              AllOf(HasSubstr("(2, 1, 4, 6)"), HasSubstr("head_dim=8")));
  Tensor<float, 4> y({2, 1, 4, 8});
  const Tensor<Index, 2> positions({2, 3});
  EXPECT_THAT(attn::test::thrown<ShapeError>([&] { rope.apply(y.view(), positions.view()); }),
              AllOf(HasSubstr("(2, 3)"), HasSubstr("(B, T) = (2, 4)")));
  const Tensor<Index, 1> firsts({3});
  EXPECT_THAT(attn::test::thrown<ShapeError>([&] { rope.apply(y.view(), firsts.view()); }),
              HasSubstr("first_positions has shape (3)"));
  Tensor<float, 4> wide({1, 1, 2, 16});
  const TensorView<float, 4> strided(wide.data(), {1, 1, 2, 8}, {32, 32, 16, 2});
  EXPECT_THAT(attn::test::thrown<ShapeError>([&] { rope.apply(strided, 0); }),
              HasSubstr("unit last stride"));
}

}  // namespace

}  // namespace rope_test

#include "support/bodies_end.hpp"
