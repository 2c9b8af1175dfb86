// SPDX-License-Identifier: MIT
// tests/attention/variants_test.cpp: softcapping, ALiBi (the standard slopes and given ones)
// and learned sinks through scaled_dot_product_attention and its backward. The forward
// against a long-double loop written from the published formulas (Gemma 2's softcap, BLOOM's
// and ggml's ALiBi slopes, gpt-oss's sinks in the softmax denominator), on both paths, every
// kernel set, float and double, with the mask kinds whose key positions ALiBi measures from
// (none, causal square, bottom-right, at an offset, key lengths); the split-keys decode path;
// the backward against central finite differences of the double forward (dq, dk, dv and
// dsinks), and streaming against materialised in float on every set.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "support/finite_difference.hpp"
#include "support/test_support.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace variants_test {
namespace {

using attn::AttentionMask;
using attn::AttentionOptions;
using attn::AttentionPath;
using attn::CausalAlignment;
using attn::Index;
using attn::Isa;
using attn::Shape;
using attn::Tensor;
using Real = long double;

struct Problem {
  Index b, h, tq, tk, d, dv;
};

/// Which variants a case switches on.
struct Variant {
  std::string name;
  double softcap = 0.0;
  double alibi_max_bias = 0.0;
  bool given_slopes = false;
  bool sinks = false;
};

const Variant kVariants[] = {
    {"softcap 2", 2.0, 0.0, false, false},
    {"ALiBi max_bias 8", 0.0, 8.0, false, false},
    {"ALiBi given slopes", 0.0, 0.0, true, false},
    {"sinks", 0.0, 0.0, false, true},
    {"softcap 1.5 + ALiBi + sinks", 1.5, 8.0, false, true},
};

/// How the keys are masked, and so where ALiBi measures its distances from.
enum class MaskKind { kNone, kCausal, kBottomRight, kOffset, kKeyLengths };

const char* name(MaskKind m) {
  switch (m) {
    case MaskKind::kNone:
      return "no mask";
    case MaskKind::kCausal:
      return "causal";
    case MaskKind::kBottomRight:
      return "causal bottom-right";
    case MaskKind::kOffset:
      return "causal at offset 1";
    case MaskKind::kKeyLengths:
      return "key lengths";
  }
  return "?";
}

const char* name(AttentionPath p) {
  return p == AttentionPath::kStreaming ? "streaming" : "materialized";
}

/// The inputs of one case, and the mask and options that describe it (views of its own
/// tensors: keep the case alive while they are used).
template <class Scalar>
struct Case {
  Problem p;
  Tensor<Scalar, 4> q, k, v, grad_out;
  Tensor<Scalar, 1> slopes, sinks;
  std::vector<Index> lengths;
  AttentionMask<Scalar> mask;
  AttentionOptions options;
  MaskKind kind;

  Case(const Problem& problem, const Variant& variant, MaskKind m)
      : p(problem),
        q(attn::test::random_tensor<Scalar>(Shape<4>{p.b, p.h, p.tq, p.d}, 21, -1.5, 1.5)),
        k(attn::test::random_tensor<Scalar>(Shape<4>{p.b, p.h, p.tk, p.d}, 22, -1.5, 1.5)),
        v(attn::test::random_tensor<Scalar>(Shape<4>{p.b, p.h, p.tk, p.dv}, 23)),
        grad_out(attn::test::random_tensor<Scalar>(Shape<4>{p.b, p.h, p.tq, p.dv}, 24)),
        kind(m) {
    options.softcap = variant.softcap;
    options.alibi_max_bias = variant.alibi_max_bias;
    if (variant.given_slopes) {
      slopes = attn::test::random_tensor<Scalar>(Shape<1>{p.h}, 25, 0.05, 0.6);
      options.alibi_slopes = slopes;
    }
    if (variant.sinks) {
      sinks = attn::test::random_tensor<Scalar>(Shape<1>{p.h}, 26, -1.0, 1.0);
      options.sinks = sinks;
    }
    switch (m) {
      case MaskKind::kNone:
        break;
      case MaskKind::kCausal:
        mask.causal(p.tq == p.tk ? CausalAlignment::kSquare : CausalAlignment::kTopLeft);
        break;
      case MaskKind::kBottomRight:
        mask.causal(CausalAlignment::kBottomRight);
        break;
      case MaskKind::kOffset:
        mask.causal(Index{1});
        break;
      case MaskKind::kKeyLengths:
        lengths.assign(static_cast<std::size_t>(p.b), p.tk);
        lengths[0] = p.tk / 2 + 1;
        mask.key_lengths(lengths);
        break;
    }
  }

  /// The slope of head h, as the options give it.
  Real slope(Index h) const {
    if (slopes.size() > 0) return static_cast<Real>(slopes(h));
    if (options.alibi_max_bias > 0) {
      return static_cast<Real>(attn::alibi_slopes(p.h, options.alibi_max_bias)[h]);
    }
    return 0;
  }

  /// Query i's causal limit (keys j <= limit are visible) and key position (ALiBi's origin).
  Index position(Index i) const {
    switch (kind) {
      case MaskKind::kCausal:
        return i;
      case MaskKind::kOffset:
        return i + 1;
      default:
        return i + p.tk - p.tq;
    }
  }
  bool visible(Index b, Index i, Index j) const {
    if (kind == MaskKind::kKeyLengths && j >= lengths[static_cast<std::size_t>(b)]) return false;
    const bool causal =
        kind == MaskKind::kCausal || kind == MaskKind::kBottomRight || kind == MaskKind::kOffset;
    return !causal || j <= position(i);
  }

  /// The formulas, in long double: s = scale q.k; s = c tanh(s / c); s -= m_h |pos_i - j|;
  /// softmax over the visible keys with exp(sink_h) added to the denominator only.
  Tensor<double, 4> reference() const {
    Tensor<double, 4> out({p.b, p.h, p.tq, p.dv});
    const Real scale = 1 / std::sqrt(static_cast<Real>(p.d));
    std::vector<Real> s(static_cast<std::size_t>(p.tk));
    for (Index b = 0; b < p.b; ++b) {
      for (Index h = 0; h < p.h; ++h) {
        for (Index i = 0; i < p.tq; ++i) {
          Real max = -INFINITY;
          for (Index j = 0; j < p.tk; ++j) {
            Real x = 0;
            for (Index c = 0; c < p.d; ++c) {
              x += static_cast<Real>(q(b, h, i, c)) * static_cast<Real>(k(b, h, j, c));
            }
            x *= scale;
            if (options.softcap > 0) {
              const Real cap = static_cast<Real>(options.softcap);
              x = cap * std::tanh(x / cap);
            }
            x -= slope(h) * std::abs(static_cast<Real>(position(i) - j));
            s[static_cast<std::size_t>(j)] = visible(b, i, j) ? x : -INFINITY;
            if (visible(b, i, j)) max = std::max(max, x);
          }
          const Real sink = sinks.size() > 0 ? static_cast<Real>(sinks(h)) : -INFINITY;
          for (Index c = 0; c < p.dv; ++c) out(b, h, i, c) = 0;
          if (max == -INFINITY) continue;  // no visible key: zeros
          max = std::max(max, sink);
          Real denominator = std::exp(sink - max);
          for (Index j = 0; j < p.tk; ++j)
            denominator += std::exp(s[static_cast<std::size_t>(j)] - max);
          for (Index c = 0; c < p.dv; ++c) {
            Real total = 0;
            for (Index j = 0; j < p.tk; ++j) {
              total +=
                  std::exp(s[static_cast<std::size_t>(j)] - max) * static_cast<Real>(v(b, h, j, c));
            }
            out(b, h, i, c) = static_cast<double>(total / denominator);
          }
        }
      }
    }
    return out;
  }

  Tensor<Scalar, 4> forward(AttentionPath path) const {
    Tensor<Scalar, 4> out({p.b, p.h, p.tq, p.dv});
    AttentionOptions o = options;
    o.path = path;
    attn::scaled_dot_product_attention<Scalar>(q.view(), k.view(), v.view(), out.view(), mask, o);
    return out;
  }
};

/// Largest |got - expected| over (1 + max |expected|).
template <class Scalar>
double relative_error(const Tensor<Scalar, 4>& got, const Tensor<double, 4>& expected) {
  double scale = 0;
  for (Index i = 0; i < expected.size(); ++i) scale = std::max(scale, std::abs(expected.data()[i]));
  double worst = 0;
  for (Index i = 0; i < got.size(); ++i) {
    const double d = std::abs(static_cast<double>(got.data()[i]) - expected.data()[i]);
    if (!(d <= worst)) worst = d;
  }
  return worst / (1 + scale);
}

class AttentionVariants : public ::testing::Test {
 protected:
  void TearDown() override { attn::set_isa(attn::best_isa()); }
};

// Tile edges (64-query tiles, 128-key tiles), T_q != T_k, and a single query over more keys
// than one decode chunk (the split-keys path, whose chunks merge the sink once per row).
const Problem kProblems[] = {
    {2, 3, 6, 6, 4, 5},
    {1, 2, 70, 130, 5, 7},
    {2, 2, 1, 1100, 8, 8},
};

template <class Scalar>
void check_forward() {
  for (const Problem& p : kProblems) {
    for (const Variant& variant : kVariants) {
      for (const MaskKind m : {MaskKind::kNone, MaskKind::kCausal, MaskKind::kBottomRight,
                               MaskKind::kOffset, MaskKind::kKeyLengths}) {
        if (m == MaskKind::kBottomRight && p.tq == p.tk) continue;  // the same as kCausal
        const Case<Scalar> c(p, variant, m);
        const auto expected = c.reference();
        const double tol = attn::test::reduction_tolerance<Scalar>(p.d + p.tk);
        for (const Isa isa : attn::test::runnable_sets()) {
          attn::set_isa(isa);
          for (const AttentionPath path :
               {AttentionPath::kStreaming, AttentionPath::kMaterialized}) {
            SCOPED_TRACE(variant.name + ", " + name(m) + ", " + name(path) + ", set " +
                         attn::isa_name(isa) + ", T_q " + std::to_string(p.tq) + ", T_k " +
                         std::to_string(p.tk));
            EXPECT_LE(relative_error(c.forward(path), expected), tol);
          }
        }
      }
    }
  }
}

TEST_F(AttentionVariants, FloatForwardMatchesTheFormulasOnEveryPathAndSet) {
  check_forward<float>();
}

TEST_F(AttentionVariants, DoubleForwardMatchesTheFormulasOnEveryPathAndSet) {
  check_forward<double>();
}

// Without the variant the call is the plain attention: a zero softcap, zero slopes and sinks
// of -inf change nothing, so each term of the reference is the one under test.
TEST_F(AttentionVariants, EachVariantChangesTheOutput) {
  const Problem p{1, 2, 5, 7, 4, 4};
  const Case<double> plain(p, Variant{"plain"}, MaskKind::kNone);
  const auto base = plain.forward(AttentionPath::kStreaming);
  for (const Variant& variant : kVariants) {
    const Case<double> c(p, variant, MaskKind::kNone);
    EXPECT_GT(attn::test::max_abs_diff(c.forward(AttentionPath::kStreaming).view(), base.view()),
              1e-3)
        << variant.name;
  }
}

/// Forward with logsumexp, then the backward into zeroed gradients (dsinks too when the case
/// has sinks).
template <class Scalar>
struct Grads {
  Tensor<Scalar, 4> q, k, v;
  Tensor<Scalar, 1> sinks;
};

template <class Scalar>
Grads<Scalar> backward(const Case<Scalar>& c, AttentionPath path) {
  const Problem& p = c.p;
  AttentionOptions o = c.options;
  o.path = path;
  Tensor<Scalar, 4> out({p.b, p.h, p.tq, p.dv});
  Tensor<Scalar, 3> lse({p.b, p.h, p.tq});
  attn::Workspace ws;
  attn::scaled_dot_product_attention<Scalar>(c.q.view(), c.k.view(), c.v.view(), out.view(),
                                             lse.view(), ws, c.mask, o);
  Grads<Scalar> g{Tensor<Scalar, 4>(c.q.shape()), Tensor<Scalar, 4>(c.k.shape()),
                  Tensor<Scalar, 4>(c.v.shape()), Tensor<Scalar, 1>(Shape<1>{p.h})};
  if (c.sinks.size() > 0) {
    attn::scaled_dot_product_attention_backward<Scalar>(
        c.q.view(), c.k.view(), c.v.view(), out.view(), c.grad_out.view(), lse.view(), g.q.view(),
        g.k.view(), g.v.view(), g.sinks.view(), ws, c.mask, o);
  } else {
    attn::scaled_dot_product_attention_backward<Scalar>(
        c.q.view(), c.k.view(), c.v.view(), out.view(), c.grad_out.view(), lse.view(), g.q.view(),
        g.k.view(), g.v.view(), ws, c.mask, o);
  }
  return g;
}

TEST_F(AttentionVariants, BackwardMatchesFiniteDifferencesOfTheForward) {
  const Problem p{1, 2, 6, 7, 3, 4};
  for (const Variant& variant : kVariants) {
    for (const MaskKind m : {MaskKind::kNone, MaskKind::kBottomRight, MaskKind::kKeyLengths}) {
      for (const AttentionPath path : {AttentionPath::kStreaming, AttentionPath::kMaterialized}) {
        SCOPED_TRACE(variant.name + ", " + name(m) + ", " + name(path));
        Case<double> c(p, variant, m);
        const Grads<double> g = backward(c, path);
        const auto loss = [&] {
          const Tensor<double, 4> out = c.forward(path);
          return attn::test::fd::weighted_sum(out.view(), c.grad_out.view());
        };
        std::vector<attn::test::fd::Variable> variables = {
            attn::test::fd::variable("dq", c.q.view(), g.q.view()),
            attn::test::fd::variable("dk", c.k.view(), g.k.view()),
            attn::test::fd::variable("dv", c.v.view(), g.v.view())};
        if (variant.sinks) {
          variables.push_back(attn::test::fd::variable("dsinks", c.sinks.view(), g.sinks.view()));
        }
        EXPECT_TRUE(attn::test::fd::check(loss, variables));
      }
    }
  }
}

// The two backward paths on every kernel set in float, against the double backward.
TEST_F(AttentionVariants, FloatBackwardMatchesTheDoubleOneOnEveryPathAndSet) {
  const Problem p{2, 2, 70, 130, 5, 7};
  for (const Variant& variant : kVariants) {
    const Case<double> exact(p, variant, MaskKind::kBottomRight);
    const Grads<double> expected = backward(exact, AttentionPath::kMaterialized);
    const Case<float> c(p, variant, MaskKind::kBottomRight);
    const double tol = attn::test::reduction_tolerance<float>(p.d + 2 * p.dv + p.tq + p.tk);
    for (const Isa isa : attn::test::runnable_sets()) {
      attn::set_isa(isa);
      for (const AttentionPath path : {AttentionPath::kStreaming, AttentionPath::kMaterialized}) {
        SCOPED_TRACE(variant.name + ", " + name(path) + ", set " + attn::isa_name(isa));
        const Grads<float> g = backward(c, path);
        EXPECT_LE(relative_error(g.q, expected.q), tol) << "dq";
        EXPECT_LE(relative_error(g.k, expected.k), tol) << "dk";
        EXPECT_LE(relative_error(g.v, expected.v), tol) << "dv";
        if (variant.sinks) {
          double scale = 0, worst = 0;
          for (Index h = 0; h < p.h; ++h) {
            scale = std::max(scale, std::abs(expected.sinks(h)));
            worst = std::max(worst, std::abs(static_cast<double>(g.sinks(h)) - expected.sinks(h)));
          }
          EXPECT_LE(worst / (1 + scale), tol) << "dsinks";
        }
      }
    }
  }
}

}  // namespace
}  // namespace variants_test

#include "support/bodies_end.hpp"
