// SPDX-License-Identifier: MIT
// tests/attention/scaled_dot_product_backward_test.cpp: scaled_dot_product_attention_backward
// on both paths and the forward's logsumexp: against the long-double reference backward
// (reference_attention_backward.hpp) for every mask kind, dropout (the forward's keep
// decisions) and tile edges, on every kernel set; streaming against materialised; central
// finite differences of attn's own double forward; fully masked rows; bit-identical results
// for 1, 2 and 3 threads; accumulation into the gradients; non-finite keys and values a query
// cannot see leave its gradient; the checks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "attention/reference_attention.hpp"
#include "attention/reference_attention_backward.hpp"
#include "attn/attn.hpp"
#include "support/finite_difference.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace scaled_dot_product_backward_test {
namespace {

using attn::AttentionMask;
using attn::AttentionOptions;
using attn::AttentionPath;
using attn::CausalAlignment;
using attn::Index;
using attn::Isa;
using attn::Shape;
using attn::Tensor;
namespace ref = attn::test::ref;

struct Problem {
  Index b, h, tq, tk, d, dv;
};

/// One mask kind, built both as attn's mask and as the reference's dense one. The tensors it
/// owns back the views in `mask`.
template <class Scalar>
struct MaskCase {
  std::string name;
  AttentionMask<Scalar> mask;
  ref::DenseMask dense;
  Tensor<bool, 4> bools;
  Tensor<Scalar, 4> additive;
  Tensor<bool, 2> padding;
  MaskCase(std::string n, const Problem& p) : name(std::move(n)), dense(p.b, p.h, p.tq, p.tk) {}
};

/// Every mask kind, for problem p (fresh objects: masks hold views of the case's tensors).
template <class Scalar>
std::vector<std::unique_ptr<MaskCase<Scalar>>> mask_cases(const Problem& p) {
  std::vector<std::unique_ptr<MaskCase<Scalar>>> all;
  const auto add = [&](const std::string& name) {
    all.push_back(std::make_unique<MaskCase<Scalar>>(name, p));
    return all.back().get();
  };
  add("none");
  {
    auto* c = add("boolean allowed (B, 1, T_q, T_k)");
    c->bools = ref::random_bools(Shape<4>{p.b, 1, p.tq, p.tk}, 5, 0.8);
    c->mask.allowed(c->bools.view());
    c->dense.boolean(c->bools.view(), true);
  }
  {
    auto* c = add("boolean blocked (B, H, T_q, T_k) with a fully blocked row");
    c->bools = ref::random_bools(Shape<4>{p.b, p.h, p.tq, p.tk}, 6, 0.25);
    for (Index j = 0; j < p.tk; ++j) c->bools(0, p.h - 1, p.tq / 2, j) = true;
    c->mask.blocked(c->bools.view());
    c->dense.boolean(c->bools.view(), false);
  }
  {
    auto* c = add("additive with -inf (1, H, T_q, T_k)");
    c->additive = ref::random_additive<Scalar>(Shape<4>{1, p.h, p.tq, p.tk}, 7);
    c->mask.additive(c->additive.view());
    c->dense.additive(c->additive.view());
  }
  {
    auto* c = add("key padding");
    c->padding = Tensor<bool, 2>({p.b, p.tk});
    const auto r = ref::random_bools(Shape<2>{p.b, p.tk}, 8, 0.3);
    attn::copy(r.view(), c->padding.view());
    c->mask.key_padding(c->padding.view());
    c->dense.key_padding(c->padding.view());
  }
  {
    auto* c = add("key lengths, one batch item with none");
    std::vector<Index> lengths(static_cast<std::size_t>(p.b), p.tk);
    lengths[0] = 0;
    if (p.b > 1) lengths[1] = p.tk / 2 + 1;
    c->mask.key_lengths(lengths);
    c->dense.key_lengths(lengths);
  }
  const CausalAlignment alignments[] = {CausalAlignment::kTopLeft, CausalAlignment::kBottomRight};
  for (const CausalAlignment a : alignments) {
    if (p.tq == p.tk && a == CausalAlignment::kBottomRight) continue;
    auto* c = add(a == CausalAlignment::kTopLeft ? "causal top-left" : "causal bottom-right");
    c->mask.causal(p.tq == p.tk ? CausalAlignment::kSquare : a);
    c->dense.causal(a);
  }
  {
    auto* c = add("causal and key padding");
    c->padding = Tensor<bool, 2>({p.b, p.tk});
    const auto r = ref::random_bools(Shape<2>{p.b, p.tk}, 9, 0.2);
    attn::copy(r.view(), c->padding.view());
    const CausalAlignment a = p.tq == p.tk ? CausalAlignment::kSquare : CausalAlignment::kTopLeft;
    c->mask.causal(a).key_padding(c->padding.view());
    c->dense.causal(CausalAlignment::kTopLeft).key_padding(c->padding.view());
  }
  return all;
}

template <class Scalar>
struct Inputs {
  Tensor<Scalar, 4> q, k, v, grad_out;
  explicit Inputs(const Problem& p, double spread = 1.5)
      : q(attn::test::random_tensor<Scalar>(Shape<4>{p.b, p.h, p.tq, p.d}, 11, -spread, spread)),
        k(attn::test::random_tensor<Scalar>(Shape<4>{p.b, p.h, p.tk, p.d}, 12, -spread, spread)),
        v(attn::test::random_tensor<Scalar>(Shape<4>{p.b, p.h, p.tk, p.dv}, 13)),
        grad_out(attn::test::random_tensor<Scalar>(Shape<4>{p.b, p.h, p.tq, p.dv}, 14)) {}
};

template <class Scalar>
struct Grads {
  Tensor<Scalar, 4> q, k, v;
};

/// The forward (with logsumexp on the streaming path), then the backward into gradients
/// that start at `start` (zero when null).
template <class Scalar>
Grads<Scalar> backward(const Inputs<Scalar>& in, const AttentionMask<Scalar>& mask,
                       const AttentionOptions& options, const Grads<Scalar>* start = nullptr) {
  const Index b = in.q.extent(0), h = in.q.extent(1), tq = in.q.extent(2);
  Tensor<Scalar, 4> out({b, h, tq, in.v.extent(3)});
  Tensor<Scalar, 3> lse({b, h, tq});
  attn::Workspace ws;
  attn::scaled_dot_product_attention<Scalar>(in.q.view(), in.k.view(), in.v.view(), out.view(),
                                             lse.view(), ws, mask, options);
  Grads<Scalar> g{Tensor<Scalar, 4>(in.q.shape()), Tensor<Scalar, 4>(in.k.shape()),
                  Tensor<Scalar, 4>(in.v.shape())};
  if (start != nullptr) {
    attn::copy(start->q.view(), g.q.view());
    attn::copy(start->k.view(), g.k.view());
    attn::copy(start->v.view(), g.v.view());
  }
  attn::scaled_dot_product_attention_backward<Scalar>(
      in.q.view(), in.k.view(), in.v.view(), out.view(), in.grad_out.view(), lse.view(), g.q.view(),
      g.k.view(), g.v.view(), ws, mask, options);
  return g;
}

/// The keep decisions attn's kernel draws for `options` (B*H*T_q*T_k, DenseMask order).
std::vector<char> keep_decisions(const Problem& p, const AttentionOptions& options) {
  std::vector<char> keep(static_cast<std::size_t>(p.b * p.h * p.tq * p.tk));
  for (Index b = 0; b < p.b; ++b) {
    for (Index h = 0; h < p.h; ++h) {
      const auto s = attn::detail::make_dropout_stream(options.dropout, options.dropout_seed,
                                                       options.dropout_call, b, h);
      for (Index i = 0; i < p.tq; ++i) {
        for (Index j = 0; j < p.tk; ++j) {
          keep[static_cast<std::size_t>(((b * p.h + h) * p.tq + i) * p.tk + j)] =
              attn::detail::DropoutStream::keep(s.row_key(i), j, s.threshold);
        }
      }
    }
  }
  return keep;
}

/// |got - expected| <= tol (1 + max |expected|) element by element (the gradients are sums
/// of products whose terms are bounded by the largest gradient's scale).
template <class Scalar>
::testing::AssertionResult near(const Tensor<Scalar, 4>& got, const Tensor<double, 4>& expected,
                                double tol) {
  double scale = 0;
  for (Index i = 0; i < expected.size(); ++i) scale = std::max(scale, std::abs(expected.data()[i]));
  const double allowed = tol * (1 + scale);
  for (Index i = 0; i < got.size(); ++i) {
    const double diff = std::abs(static_cast<double>(got.data()[i]) - expected.data()[i]);
    if (!(diff <= allowed)) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << got.data()[i] << " vs " << expected.data()[i]
             << " (|diff| " << diff << " > " << allowed << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

constexpr AttentionPath kPaths[] = {AttentionPath::kStreaming, AttentionPath::kMaterialized};
const char* name(AttentionPath p) {
  return p == AttentionPath::kStreaming ? "streaming" : "materialized";
}

class SdpaBackward : public ::testing::Test {
 protected:
  void TearDown() override {
    attn::set_isa(attn::best_isa());
    attn::set_num_threads(threads_);
  }
  int threads_ = attn::num_threads();
};

// Shapes across the tile edges: 64-query tiles, 128-key tiles, ragged head dims.
const Problem kProblems[] = {
    {2, 2, 5, 6, 3, 4},
    {1, 2, 70, 130, 5, 7},
    {2, 1, 130, 130, 16, 16},
};

template <class Scalar>
void check_against_reference(double dropout) {
  for (const Problem& p : kProblems) {
    if (!ref::kOptimizedBuild && p.tq > 100) continue;
    const Inputs<Scalar> in(p);
    for (const auto& mc : mask_cases<Scalar>(p)) {
      AttentionOptions options;
      options.dropout = dropout;
      options.dropout_seed = 77;
      options.dropout_call = 3;
      const auto keep = keep_decisions(p, options);
      const ref::Real scale = 1 / std::sqrt(static_cast<ref::Real>(p.d));
      const auto expected =
          ref::attention_backward(in.q.view(), in.k.view(), in.v.view(), in.grad_out.view(),
                                  mc->dense, scale, dropout > 0 ? &keep : nullptr, dropout);
      // The reductions: scores over d, dP over d_v, D over d_v, then T_k (dQ) or T_q (dK, dV).
      const double tol = attn::test::reduction_tolerance<Scalar>(p.d + 2 * p.dv + p.tq + p.tk);
      for (const Isa isa : attn::test::runnable_sets()) {
        attn::set_isa(isa);
        for (const AttentionPath path : kPaths) {
          options.path = path;
          SCOPED_TRACE(mc->name + ", " + name(path) + ", set " + attn::isa_name(isa) + ", T_q " +
                       std::to_string(p.tq) + ", T_k " + std::to_string(p.tk));
          const Grads<Scalar> g = backward(in, mc->mask, options);
          EXPECT_TRUE(near(g.q, expected.query, tol)) << "dq";
          EXPECT_TRUE(near(g.k, expected.key, tol)) << "dk";
          EXPECT_TRUE(near(g.v, expected.value, tol)) << "dv";
        }
      }
    }
  }
}

TEST_F(SdpaBackward, MatchesTheReferenceForEveryMaskKindPathAndSet) {
  check_against_reference<float>(0.0);
  check_against_reference<double>(0.0);
}

TEST_F(SdpaBackward, MatchesTheReferenceWithDropoutsKeepDecisions) {
  check_against_reference<float>(0.3);
  check_against_reference<double>(0.3);
}

// Central differences of attn's own double forward (loss = sum(w * out)).
TEST_F(SdpaBackward, MatchesFiniteDifferencesOfTheForward) {
  const Problem p{1, 2, 6, 7, 3, 4};
  for (const double dropout : {0.0, 0.25}) {
    for (const AttentionPath path : kPaths) {
      const auto masks = mask_cases<double>(p);
      for (std::size_t m = 0; m < masks.size(); ++m) {
        // with dropout: no mask and the last (causal with padding) are enough
        if (dropout > 0 && m != 0 && m + 1 != masks.size()) continue;
        const auto& mc = masks[m];
        SCOPED_TRACE(mc->name + ", " + name(path) + ", dropout " + std::to_string(dropout));
        Inputs<double> in(p);
        AttentionOptions options;
        options.path = path;
        options.dropout = dropout;
        const Grads<double> g = backward(in, mc->mask, options);
        const auto loss = [&] {
          Tensor<double, 4> out({p.b, p.h, p.tq, p.dv});
          attn::scaled_dot_product_attention<double>(in.q.view(), in.k.view(), in.v.view(),
                                                     out.view(), mc->mask, options);
          return attn::test::fd::weighted_sum(out.view(), in.grad_out.view());
        };
        EXPECT_TRUE(
            attn::test::fd::check(loss, {attn::test::fd::variable("dq", in.q.view(), g.q.view()),
                                         attn::test::fd::variable("dk", in.k.view(), g.k.view()),
                                         attn::test::fd::variable("dv", in.v.view(), g.v.view())}));
      }
    }
  }
}

// Grouped-query attention (K/V with H_kv < H heads: each dK, dV row sums its group's
// shares) and sliding windows (a lower loop bound the backward must honour as the forward
// does), per-item bottom-right alignment, on both paths and every set: against the reference
// on repeat_kv'd keys and values, its dK, dV summed over each group.
TEST_F(SdpaBackward, GroupedQueryAndWindowsMatchTheReference) {
  struct Case {
    Problem p;
    Index kv_heads, window;
  };
  const Case cases[] = {
      {{2, 4, 5, 6, 3, 4}, 2, 0},     {{2, 4, 5, 6, 3, 4}, 1, 2},        {{1, 4, 7, 7, 4, 3}, 4, 3},
      {{2, 6, 70, 200, 8, 8}, 3, 50}, {{1, 2, 130, 130, 16, 16}, 1, 40},
  };
  for (const Case& c : cases) {
    const Problem& p = c.p;
    if (!ref::kOptimizedBuild && p.tq > 100) continue;
    const Problem kv_problem{p.b, c.kv_heads, p.tq, p.tk, p.d, p.dv};
    const Inputs<double> kv(kv_problem);
    Inputs<double> in(p);
    in.k = Tensor<double, 4>(kv.k.shape());
    in.v = Tensor<double, 4>(kv.v.shape());
    attn::copy(kv.k.view(), in.k.view());
    attn::copy(kv.v.view(), in.v.view());
    const auto k_rep = ref::repeat_kv(in.k.view(), p.h);
    const auto v_rep = ref::repeat_kv(in.v.view(), p.h);
    // Item 1 holds fewer keys; bottom-right per item puts its last query on its last key.
    std::vector<Index> lengths(static_cast<std::size_t>(p.b), p.tk);
    if (p.b > 1) lengths[1] = p.tk - 2;
    AttentionMask<double> mask;
    mask.key_lengths(lengths).causal(CausalAlignment::kBottomRightPerItem);
    if (c.window > 0) mask.sliding_window(c.window);
    std::vector<Index> offsets;
    for (const Index n : lengths) offsets.push_back(n - p.tq);
    ref::DenseMask dense(p.b, p.h, p.tq, p.tk);
    dense.key_lengths(lengths).causal_window(offsets, c.window);
    const ref::Real scale = 1 / std::sqrt(static_cast<ref::Real>(p.d));
    const auto expected = ref::attention_backward(in.q.view(), k_rep.view(), v_rep.view(),
                                                  in.grad_out.view(), dense, scale);
    const Index group = p.h / c.kv_heads;
    const auto grouped = [&](const Tensor<double, 4>& per_head) {
      Tensor<double, 4> sum({p.b, c.kv_heads, per_head.extent(2), per_head.extent(3)});
      for (Index b = 0; b < p.b; ++b)
        for (Index h = 0; h < p.h; ++h)
          for (Index t = 0; t < per_head.extent(2); ++t)
            for (Index e = 0; e < per_head.extent(3); ++e)
              sum(b, h / group, t, e) += per_head(b, h, t, e);
      return sum;
    };
    const auto expected_k = grouped(expected.key), expected_v = grouped(expected.value);
    const double tol =
        attn::test::reduction_tolerance<double>(p.d + 2 * p.dv + p.tq + p.tk + group);
    for (const Isa isa : attn::test::runnable_sets()) {
      attn::set_isa(isa);
      for (const AttentionPath path : kPaths) {
        AttentionOptions options;
        options.path = path;
        SCOPED_TRACE(std::string(name(path)) + ", set " + attn::isa_name(isa) + ", H " +
                     std::to_string(p.h) + "/" + std::to_string(c.kv_heads) + ", window " +
                     std::to_string(c.window) + ", T_q " + std::to_string(p.tq));
        const Grads<double> g = backward(in, mask, options);
        EXPECT_TRUE(near(g.q, expected.query, tol)) << "dq";
        EXPECT_TRUE(near(g.k, expected_k, tol)) << "dk";
        EXPECT_TRUE(near(g.v, expected_v, tol)) << "dv";
      }
    }
  }
}

TEST_F(SdpaBackward, StreamingMatchesMaterialisedOnALongCausalHead) {
  const Problem p =
      ref::kOptimizedBuild ? Problem{1, 2, 300, 300, 32, 32} : Problem{1, 1, 140, 140, 8, 8};
  const Inputs<float> in(p);
  AttentionMask<float> mask;
  mask.causal();
  for (const double dropout : {0.0, 0.2}) {
    AttentionOptions options;
    options.dropout = dropout;
    options.path = AttentionPath::kStreaming;
    const Grads<float> s = backward(in, mask, options);
    options.path = AttentionPath::kMaterialized;
    const Grads<float> m = backward(in, mask, options);
    const double tol = attn::test::reduction_tolerance<float>(p.d + 2 * p.dv + 2 * p.tk);
    const auto widen = [](const Tensor<float, 4>& t) {
      Tensor<double, 4> d(t.shape());
      for (Index i = 0; i < t.size(); ++i) d.data()[i] = t.data()[i];
      return d;
    };
    EXPECT_TRUE(near(s.q, widen(m.q), tol)) << "dq, dropout " << dropout;
    EXPECT_TRUE(near(s.k, widen(m.k), tol)) << "dk, dropout " << dropout;
    EXPECT_TRUE(near(s.v, widen(m.v), tol)) << "dv, dropout " << dropout;
  }
}

TEST_F(SdpaBackward, BitIdenticalForAnyThreadCount) {
  const Problem p =
      ref::kOptimizedBuild ? Problem{2, 3, 150, 260, 16, 8} : Problem{1, 2, 70, 140, 8, 8};
  const Inputs<float> in(p);
  for (const auto& mc : mask_cases<float>(p)) {
    for (const AttentionPath path : kPaths) {
      AttentionOptions options;
      options.path = path;
      options.dropout = 0.1;
      attn::set_num_threads(1);
      const Grads<float> one = backward(in, mc->mask, options);
      for (const int threads : {2, 3}) {
        attn::set_num_threads(threads);
        const Grads<float> many = backward(in, mc->mask, options);
        EXPECT_EQ(attn::test::to_vector(many.q), attn::test::to_vector(one.q))
            << mc->name << " " << name(path) << " threads " << threads;
        EXPECT_EQ(attn::test::to_vector(many.k), attn::test::to_vector(one.k))
            << mc->name << " " << name(path) << " threads " << threads;
        EXPECT_EQ(attn::test::to_vector(many.v), attn::test::to_vector(one.v))
            << mc->name << " " << name(path) << " threads " << threads;
      }
    }
  }
}

TEST_F(SdpaBackward, AddsIntoTheGradients) {
  const Problem p{2, 2, 9, 11, 4, 5};
  const Inputs<double> in(p);
  const AttentionMask<double> mask;
  const Grads<double> start{attn::test::random_tensor<double>(in.q.shape(), 1),
                            attn::test::random_tensor<double>(in.k.shape(), 2),
                            attn::test::random_tensor<double>(in.v.shape(), 3)};
  for (const AttentionPath path : kPaths) {
    AttentionOptions options;
    options.path = path;
    const Grads<double> zero = backward(in, mask, options);
    const Grads<double> added = backward(in, mask, options, &start);
    for (Index i = 0; i < in.q.size(); ++i) {
      EXPECT_NEAR(added.q.data()[i], start.q.data()[i] + zero.q.data()[i], 1e-14) << name(path);
    }
    for (Index i = 0; i < in.k.size(); ++i) {
      EXPECT_NEAR(added.k.data()[i], start.k.data()[i] + zero.k.data()[i], 1e-14) << name(path);
      EXPECT_NEAR(added.v.data()[i], start.v.data()[i] + zero.v.data()[i], 1e-14) << name(path);
    }
  }
}

// Self-attention: q = k = v = x, one gradient view for all three receives dq + dk + dv.
TEST_F(SdpaBackward, OneGradientForSelfAttentionReceivesTheSum) {
  const Problem p{2, 2, 70, 70, 6, 6};
  const auto x = attn::test::random_tensor<double>(Shape<4>{p.b, p.h, p.tq, p.d}, 21);
  const auto w = attn::test::random_tensor<double>(Shape<4>{p.b, p.h, p.tq, p.d}, 22);
  AttentionMask<double> mask;
  mask.causal();
  for (const AttentionPath path : kPaths) {
    AttentionOptions options;
    options.path = path;
    Tensor<double, 4> out(x.shape());
    Tensor<double, 3> lse({p.b, p.h, p.tq});
    attn::Workspace ws;
    attn::scaled_dot_product_attention<double>(x.view(), x.view(), x.view(), out.view(), lse.view(),
                                               ws, mask, options);
    Tensor<double, 4> one(x.shape()), dq(x.shape()), dk(x.shape()), dv(x.shape());
    attn::scaled_dot_product_attention_backward<double>(x.view(), x.view(), x.view(), out.view(),
                                                        w.view(), lse.view(), one.view(),
                                                        one.view(), one.view(), ws, mask, options);
    attn::scaled_dot_product_attention_backward<double>(x.view(), x.view(), x.view(), out.view(),
                                                        w.view(), lse.view(), dq.view(), dk.view(),
                                                        dv.view(), ws, mask, options);
    for (Index i = 0; i < x.size(); ++i) {
      EXPECT_NEAR(one.data()[i], dq.data()[i] + dk.data()[i] + dv.data()[i], 1e-13) << name(path);
    }
  }
}

TEST_F(SdpaBackward, FullyMaskedQueriesGetAndGiveZeroGradients) {
  const Problem p{2, 1, 70, 20, 4, 4};
  const Inputs<float> in(p);
  AttentionMask<float> mask;
  mask.key_lengths({0, 20});
  for (const AttentionPath path : kPaths) {
    AttentionOptions options;
    options.path = path;
    const Grads<float> g = backward(in, mask, options);
    for (const auto* t : {&g.q, &g.k, &g.v}) {
      const auto first = attn::select(t->view(), 0, 0);
      for (const float x : attn::test::to_vector(first)) ASSERT_EQ(x, 0.0f) << name(path);
    }
  }
}

// What a query cannot see never affects it (tests/attention/nonfinite_test.cpp), in the
// backward too: NaN and +-infinity in the K and V rows of keys hidden from some queries (key
// padding, past key_lengths, a boolean mask, causal future keys), against the same call with
// those rows finite: the dQ rows of the queries that see none of them keep their bits, on both
// paths and every kernel set. The dQ products cover keys a query cannot see (a group of
// queries runs to its last visible key, element-wise masks inside the range, the materialised
// product over every key), where dS = 0 met K = NaN as 0 * NaN. Per batch item the poisoned
// keys are those hidden from at least half of the rows, and the one hidden from the most.
template <class Scalar>
void check_hidden_nonfinite_keys() {
  const Problem p{2, 2, 40, 130, 5, 7};  // groups of kMicroRows queries, two key tiles
  const Inputs<Scalar> in(p);
  const Scalar bad[] = {std::numeric_limits<Scalar>::quiet_NaN(),
                        std::numeric_limits<Scalar>::infinity(),
                        -std::numeric_limits<Scalar>::infinity()};
  for (const auto& mc : mask_cases<Scalar>(p)) {
    const ref::DenseMask& dense = mc->dense;
    const auto hidden = [&](Index b, Index h, Index i, Index j) {
      return dense.visible[dense.at(b, h, i, j)] == 0;
    };
    Inputs<Scalar> poisoned(p);
    std::vector<std::vector<Index>> keys(static_cast<std::size_t>(p.b));
    for (Index b = 0; b < p.b; ++b) {
      Index most = 0, top = -1;
      for (Index j = 0; j < p.tk; ++j) {
        Index count = 0;
        for (Index h = 0; h < p.h; ++h) {
          for (Index i = 0; i < p.tq; ++i) count += hidden(b, h, i, j) ? 1 : 0;
        }
        if (2 * count >= p.h * p.tq) keys[static_cast<std::size_t>(b)].push_back(j);
        if (count > most) most = count, top = j;
      }
      if (top >= 0 && keys[static_cast<std::size_t>(b)].empty()) {
        keys[static_cast<std::size_t>(b)].push_back(top);
      }
      for (const Index j : keys[static_cast<std::size_t>(b)]) {
        for (Index h = 0; h < p.h; ++h) {
          // Whole rows and single elements, NaN and infinities of both signs; V NaN too.
          for (Index e = 0; e < p.d; ++e) {
            if (j % 2 == 0 || e == 1) poisoned.k(b, h, j, e) = bad[(b + j + e) % 3];
          }
          for (Index e = 0; e < p.dv; ++e) {
            if (j % 3 != 0) poisoned.v(b, h, j, e) = bad[0];
          }
        }
      }
    }
    // The rows to compare: queries that see none of their item's poisoned keys.
    std::vector<char> kept(static_cast<std::size_t>(p.b * p.h * p.tq), 0);
    Index rows = 0;
    for (Index b = 0; b < p.b; ++b) {
      for (Index h = 0; h < p.h; ++h) {
        for (Index i = 0; i < p.tq; ++i) {
          bool all = !keys[static_cast<std::size_t>(b)].empty();
          for (const Index j : keys[static_cast<std::size_t>(b)]) all = all && hidden(b, h, i, j);
          kept[static_cast<std::size_t>((b * p.h + h) * p.tq + i)] = all ? 1 : 0;
          rows += all ? 1 : 0;
        }
      }
    }
    if (rows == 0) continue;  // no mask, or an additive one: nothing is hidden
    for (const Isa isa : attn::test::runnable_sets()) {
      attn::set_isa(isa);
      for (const AttentionPath path : kPaths) {
        SCOPED_TRACE(mc->name + ", " + name(path) + ", set " + attn::isa_name(isa));
        AttentionOptions options;
        options.path = path;
        const Grads<Scalar> finite = backward(in, mc->mask, options);
        const Grads<Scalar> broken = backward(poisoned, mc->mask, options);
        Index differ = 0, first = -1;
        for (Index r = 0; r < p.b * p.h * p.tq; ++r) {
          if (kept[static_cast<std::size_t>(r)] == 0) continue;
          const Scalar* a = finite.q.data() + r * p.d;
          const Scalar* z = broken.q.data() + r * p.d;
          if (std::memcmp(a, z, sizeof(Scalar) * static_cast<std::size_t>(p.d)) != 0) {
            if (differ++ == 0) first = r;
          }
        }
        EXPECT_EQ(differ, 0) << "of " << rows << " rows; first (b, h, i) row " << first << ": "
                             << broken.q.data()[std::max<Index>(first, 0) * p.d] << " instead of "
                             << finite.q.data()[std::max<Index>(first, 0) * p.d];
      }
    }
  }
}

TEST_F(SdpaBackward, HiddenNonFiniteKeysAndValuesLeaveTheQueryGradient) {
  attn::set_num_threads(1);  // small calls: the results do not depend on it (tested above)
  check_hidden_nonfinite_keys<float>();
  check_hidden_nonfinite_keys<double>();
}

TEST_F(SdpaBackward, LogsumexpMatchesTheScoresAndLeavesTheOutputUnchanged) {
  const Problem p{2, 2, 70, 130, 5, 7};
  const Inputs<double> in(p);
  for (const auto& mc : mask_cases<double>(p)) {
    for (const AttentionPath path : kPaths) {
      AttentionOptions options;
      options.path = path;
      Tensor<double, 4> plain({p.b, p.h, p.tq, p.dv}), out({p.b, p.h, p.tq, p.dv});
      Tensor<double, 3> lse({p.b, p.h, p.tq});
      attn::Workspace ws;
      attn::scaled_dot_product_attention<double>(in.q.view(), in.k.view(), in.v.view(),
                                                 plain.view(), ws, mc->mask, options);
      attn::scaled_dot_product_attention<double>(in.q.view(), in.k.view(), in.v.view(), out.view(),
                                                 lse.view(), ws, mc->mask, options);
      EXPECT_EQ(attn::test::to_vector(out), attn::test::to_vector(plain)) << mc->name;
      const ref::Real scale = 1 / std::sqrt(static_cast<ref::Real>(p.d));
      for (Index b = 0; b < p.b; ++b) {
        for (Index h = 0; h < p.h; ++h) {
          for (Index i = 0; i < p.tq; ++i) {
            ref::Real sum = 0;
            for (Index j = 0; j < p.tk; ++j) {
              const std::size_t at = mc->dense.at(b, h, i, j);
              if (!mc->dense.visible[at] || std::isinf(mc->dense.bias[at])) continue;
              ref::Real dot = 0;
              for (Index e = 0; e < p.d; ++e) dot += in.q(b, h, i, e) * in.k(b, h, j, e);
              sum += std::exp(dot * scale + mc->dense.bias[at]);
            }
            const double expected = sum > 0 ? static_cast<double>(std::log(sum))
                                            : std::numeric_limits<double>::infinity();
            if (std::isinf(expected)) {
              EXPECT_EQ(lse(b, h, i), expected) << mc->name << " " << name(path);
            } else {
              EXPECT_NEAR(lse(b, h, i), expected, 1e-12 * (1 + std::abs(expected)))
                  << mc->name << " " << name(path) << " (" << b << ", " << h << ", " << i << ")";
            }
          }
        }
      }
    }
  }
}

TEST_F(SdpaBackward, RejectsBadArgumentsNamingThem) {
  using ::testing::HasSubstr;
  const Problem p{1, 2, 5, 6, 3, 4};
  const Inputs<float> in(p);
  Tensor<float, 4> out({1, 2, 5, 4}), gq({1, 2, 5, 3}), gk({1, 2, 6, 3}), gv({1, 2, 6, 4});
  Tensor<float, 4> bad({1, 2, 6, 4});
  Tensor<float, 3> lse({1, 2, 5});
  attn::Workspace ws;
  const auto run = [&](attn::TensorView<float, 4> q_grad, attn::TensorView<const float, 3> l) {
    attn::scaled_dot_product_attention_backward<float>(in.q.view(), in.k.view(), in.v.view(),
                                                       out.view(), in.grad_out.view(), l, q_grad,
                                                       gk.view(), gv.view(), ws);
  };
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { run(bad.view(), lse.view()); }),
              HasSubstr("grad_q has shape (1, 2, 6, 4)"));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { run(gq.view(), {}); }),
              HasSubstr("logsumexp"));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>(
                  [&] { run(gk.view(), lse.view()); }),  // grad_q shape is k's, not q's
              HasSubstr("grad_q"));
  Tensor<float, 1> buffer({100});
  const attn::TensorView<float, 4> k_part(buffer.data(), {1, 2, 6, 3});
  const attn::TensorView<float, 4> v_part(buffer.data() + 10, {1, 2, 6, 4});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                attn::scaled_dot_product_attention_backward<float>(
                    in.q.view(), in.k.view(), in.v.view(), out.view(), in.grad_out.view(),
                    lse.view(), gq.view(), k_part, v_part, ws);
              }),
              HasSubstr("grad_v"));
}

}  // namespace
}  // namespace scaled_dot_product_backward_test

#include "support/bodies_end.hpp"
