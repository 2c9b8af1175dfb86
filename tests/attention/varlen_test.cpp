// SPDX-License-Identifier: MIT
// tests/attention/varlen_test.cpp: packed variable-length batches (attn/attention/varlen.hpp).
// scaled_dot_product_attention_varlen() and its backward against each sequence run alone
// through scaled_dot_product_attention() (contiguous copies of its rows): bit-identical
// (EXPECT_EQ on the floats: each sequence's tasks are the ones it runs alone, on the same
// kernels), for self- and cross-attention, causal bounds of every alignment, windows,
// grouped-query heads, the variants (softcap, ALiBi, sinks), empty sequences and sequences
// without keys, on 1 and 2 threads. Also the module's packed forward, training forward and
// backward against the module on each sequence alone, the packed prefill of a KVCache against
// each item's own prefill, and the errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "support/test_support.hpp"

namespace varlen_test {

namespace {

using attn::AttentionMask;
using attn::AttentionOptions;
using attn::CausalAlignment;
using attn::Index;
using attn::SequenceOffsets;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
using attn::Workspace;
using attn::test::random_tensor;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

/// Rows [r0, r1) of a packed (total, H, d) tensor as a contiguous (1, H, r1 - r0, d) tensor.
Tensor<float, 4> alone(TensorView<const float, 3> x, Index r0, Index r1) {
  Tensor<float, 4> t(Shape<4>{1, x.extent(1), r1 - r0, x.extent(2)});
  for (Index h = 0; h < x.extent(1); ++h) {
    for (Index i = r0; i < r1; ++i) {
      for (Index c = 0; c < x.extent(2); ++c) t(0, h, i - r0, c) = x(i, h, c);
    }
  }
  return t;
}

/// Expects rows [r0, r1) of packed `x` to equal `y` (1, H, r1 - r0, d) bit for bit.
void expect_rows(TensorView<const float, 3> x, Index r0, Index r1, TensorView<const float, 4> y,
                 const char* what) {
  SCOPED_TRACE(what);
  for (Index h = 0; h < x.extent(1); ++h) {
    for (Index i = r0; i < r1; ++i) {
      for (Index c = 0; c < x.extent(2); ++c) {
        ASSERT_EQ(x(i, h, c), y(0, h, i - r0, c)) << "head " << h << " row " << i << " col " << c;
      }
    }
  }
}

struct Case {
  const char* name;
  std::vector<Index> lq, lk;  // lk empty: self-attention (the same offsets)
  Index heads, kv_heads, d, dv;
  AttentionMask<float> mask;
  bool sinks = false, alibi = false;
  double softcap = 0.0;
};

std::vector<Case> cases() {
  std::vector<Case> all;
  all.push_back({"self, no mask", {5, 70, 1, 130}, {}, 2, 2, 16, 16, {}});
  all.push_back({"self, causal, GQA, empty sequence",
                 {33, 0, 129, 2},
                 {},
                 4,
                 2,
                 8,
                 8,
                 AttentionMask<float>().causal()});
  all.push_back({"cross, bottom-right, d_v != d, a sequence without keys",
                 {7, 64, 3, 20},
                 {40, 200, 0, 9},
                 2,
                 1,
                 16,
                 8,
                 AttentionMask<float>().causal(CausalAlignment::kBottomRight)});
  all.push_back({"cross, top-left, window",
                 {17, 90, 4},
                 {30, 90, 11},
                 2,
                 2,
                 8,
                 8,
                 AttentionMask<float>().causal(CausalAlignment::kTopLeft).sliding_window(9)});
  Case variants{"self, causal, sinks, ALiBi, softcap", {40, 3, 150}, {}, 4, 4, 8, 8,
                AttentionMask<float>().causal()};
  variants.sinks = variants.alibi = true;
  variants.softcap = 5.0;
  all.push_back(variants);
  all.push_back({"decode-like: one query per sequence over long keys",
                 {1, 1, 1},
                 {700, 1100, 30},
                 2,
                 1,
                 16,
                 16,
                 AttentionMask<float>().causal(CausalAlignment::kBottomRight)});
  return all;
}

struct Operands {
  SequenceOffsets cq, ck;
  Tensor<float, 3> q, k, v;
  Tensor<float, 1> sinks, alibi;
  AttentionOptions options;
};

Operands operands(const Case& c, std::uint64_t seed) {
  Operands o;
  o.cq = SequenceOffsets::from_lengths(c.lq);
  o.ck = SequenceOffsets::from_lengths(c.lk.empty() ? c.lq : c.lk);
  const Index tq = o.cq.view()(o.cq.sequences()), tk = o.ck.view()(o.ck.sequences());
  o.q = random_tensor<float, 3>({tq, c.heads, c.d}, seed);
  o.k = random_tensor<float, 3>({tk, c.kv_heads, c.d}, seed + 1);
  o.v = random_tensor<float, 3>({tk, c.kv_heads, c.dv}, seed + 2);
  o.sinks = random_tensor<float, 1>({c.heads}, seed + 3);
  o.alibi = random_tensor<float, 1>({c.heads}, seed + 4, 0.1, 0.5);
  if (c.sinks) o.options.sinks = o.sinks;
  if (c.alibi) o.options.alibi_slopes = o.alibi;
  o.options.softcap = c.softcap;
  return o;
}

TEST(Varlen, ForwardAndBackwardEqualEachSequenceAlone) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Operands o = operands(c, 11);
    const Index tq = o.q.extent(0);
    Workspace ws;
    // Packed, on 1 and 2 threads.
    Tensor<float, 3> out[2], dq[2], dk[2], dv[2];
    Tensor<float, 2> lse[2];
    Tensor<float, 1> dsinks[2];
    const Tensor<float, 3> grad_out = random_tensor<float, 3>({tq, c.heads, c.dv}, 99);
    for (int t = 0; t < 2; ++t) {
      attn::set_num_threads(t + 1);
      out[t] = Tensor<float, 3>(Shape<3>{tq, c.heads, c.dv});
      lse[t] = Tensor<float, 2>(Shape<2>{c.heads, tq});
      attn::scaled_dot_product_attention_varlen<float>(o.q.view(), o.k.view(), o.v.view(), o.cq,
                                                       o.ck, out[t].view(), lse[t].view(), ws,
                                                       c.mask, o.options);
      dq[t] = Tensor<float, 3>(o.q.shape());
      dk[t] = Tensor<float, 3>(o.k.shape());
      dv[t] = Tensor<float, 3>(o.v.shape());
      dsinks[t] = Tensor<float, 1>(Shape<1>{c.heads});
      attn::scaled_dot_product_attention_varlen_backward<float>(
          o.q.view(), o.k.view(), o.v.view(), o.cq, o.ck, out[t].view(), grad_out.view(),
          lse[t].view(), dq[t].view(), dk[t].view(), dv[t].view(), ws, c.mask, o.options,
          c.sinks ? dsinks[t].view() : TensorView<float, 1>());
    }
    Tensor<float, 3> plain(Shape<3>{tq, c.heads, c.dv});
    attn::scaled_dot_product_attention_varlen<float>(o.q.view(), o.k.view(), o.v.view(), o.cq,
                                                     o.ck, plain.view(), ws, c.mask, o.options);
    attn::set_num_threads(2);
    EXPECT_EQ(attn::test::to_vector(out[0]), attn::test::to_vector(out[1]));
    EXPECT_EQ(attn::test::to_vector(lse[0]), attn::test::to_vector(lse[1]));
    EXPECT_EQ(attn::test::to_vector(dq[0]), attn::test::to_vector(dq[1]));
    EXPECT_EQ(attn::test::to_vector(dk[0]), attn::test::to_vector(dk[1]));
    EXPECT_EQ(attn::test::to_vector(dv[0]), attn::test::to_vector(dv[1]));
    EXPECT_EQ(attn::test::to_vector(dsinks[0]), attn::test::to_vector(dsinks[1]));
    // Each sequence alone; the sink gradients added sequence after sequence.
    Tensor<float, 1> dsinks_alone(Shape<1>{c.heads});
    for (Index s = 0; s < o.cq.sequences(); ++s) {
      SCOPED_TRACE("sequence " + std::to_string(s));
      const Index q0 = o.cq.begin(s), q1 = q0 + o.cq.length(s);
      const Index k0 = o.ck.begin(s), k1 = k0 + o.ck.length(s);
      if (q1 == q0) continue;
      if (k1 == k0) {  // no keys: zero rows, +inf logsumexp
        for (Index i = q0; i < q1; ++i) {
          for (Index h = 0; h < c.heads; ++h) {
            for (Index x = 0; x < c.dv; ++x) EXPECT_EQ(out[0](i, h, x), 0.0f);
            EXPECT_EQ(dq[0](i, h, 0), 0.0f);
          }
        }
        continue;
      }
      const Tensor<float, 4> q = alone(o.q.view(), q0, q1), k = alone(o.k.view(), k0, k1);
      const Tensor<float, 4> v = alone(o.v.view(), k0, k1);
      const Tensor<float, 4> go = alone(grad_out.view(), q0, q1);
      Tensor<float, 4> y(Shape<4>{1, c.heads, q1 - q0, c.dv});
      Tensor<float, 3> l(Shape<3>{1, c.heads, q1 - q0});
      attn::scaled_dot_product_attention<float>(q.view(), k.view(), v.view(), y.view(), l.view(),
                                                ws, c.mask, o.options);
      expect_rows(out[0].view(), q0, q1, y.view(), "out");
      // Without a logsumexp (a decode-like sequence then splits its keys in chunks).
      Tensor<float, 4> y_plain(y.shape());
      attn::scaled_dot_product_attention<float>(q.view(), k.view(), v.view(), y_plain.view(), ws,
                                                c.mask, o.options);
      expect_rows(plain.view(), q0, q1, y_plain.view(), "out without logsumexp");
      for (Index h = 0; h < c.heads; ++h) {
        for (Index i = q0; i < q1; ++i) ASSERT_EQ(lse[0](h, i), l(0, h, i - q0));
      }
      Tensor<float, 4> gq(q.shape()), gk(k.shape()), gv(v.shape());
      attn::scaled_dot_product_attention_backward<float>(
          q.view(), k.view(), v.view(), y.view(), go.view(), l.view(), gq.view(), gk.view(),
          gv.view(), c.sinks ? dsinks_alone.view() : TensorView<float, 1>(), ws, c.mask,
          o.options);
      expect_rows(dq[0].view(), q0, q1, gq.view(), "dq");
      expect_rows(dk[0].view(), k0, k1, gk.view(), "dk");
      expect_rows(dv[0].view(), k0, k1, gv.view(), "dv");
    }
    EXPECT_EQ(attn::test::to_vector(dsinks[0]), attn::test::to_vector(dsinks_alone));
  }
}

TEST(Varlen, DropoutHashesSequenceAsBatchItem) {
  // With dropout, sequence s draws the keep decisions of batch item s: the packed output
  // equals a padded batch's (every sequence the same length, so no padding), bit for bit.
  const Index n = 3, t = 20, heads = 2, d = 8;
  const Tensor<float, 3> q = random_tensor<float, 3>({n * t, heads, d}, 5);
  const Tensor<float, 3> k = random_tensor<float, 3>({n * t, heads, d}, 6);
  const Tensor<float, 3> v = random_tensor<float, 3>({n * t, heads, d}, 7);
  AttentionOptions options;
  options.dropout = 0.3;
  options.dropout_seed = 42;
  Workspace ws;
  Tensor<float, 3> out(Shape<3>{n * t, heads, d});
  const SequenceOffsets cu = SequenceOffsets::from_lengths({t, t, t});
  attn::scaled_dot_product_attention_varlen<float>(q.view(), k.view(), v.view(), cu, cu,
                                                   out.view(), ws, {}, options);
  // The same rows as a (B, H, T, d) batch.
  const auto batched = [&](const Tensor<float, 3>& x) {
    Tensor<float, 4> b(Shape<4>{n, heads, t, d});
    for (Index s = 0; s < n; ++s) {
      for (Index h = 0; h < heads; ++h) {
        for (Index i = 0; i < t; ++i) {
          for (Index c = 0; c < d; ++c) b(s, h, i, c) = x(s * t + i, h, c);
        }
      }
    }
    return b;
  };
  const Tensor<float, 4> qb = batched(q), kb = batched(k), vb = batched(v);
  Tensor<float, 4> yb(Shape<4>{n, heads, t, d});
  attn::scaled_dot_product_attention<float>(qb.view(), kb.view(), vb.view(), yb.view(), ws, {},
                                            options);
  EXPECT_EQ(attn::test::to_vector(batched(out)), attn::test::to_vector(yb));
}

TEST(Varlen, Errors) {
  const Tensor<float, 3> q = random_tensor<float, 3>({10, 2, 8}, 1);
  const Tensor<float, 3> k = random_tensor<float, 3>({12, 2, 8}, 2);
  Tensor<float, 3> out(Shape<3>{10, 2, 8});
  Workspace ws;
  const auto run = [&](const SequenceOffsets& cq, const SequenceOffsets& ck,
                       const AttentionMask<float>& mask = {}) {
    attn::scaled_dot_product_attention_varlen<float>(q.view(), k.view(), k.view(), cq, ck,
                                                     out.view(), ws, mask);
  };
  const SequenceOffsets good_q{0, 4, 10}, good_k{0, 5, 12};
  EXPECT_NO_THROW(run(good_q, good_k));
  EXPECT_THAT([&] { run({0, 6, 4, 10}, {0, 5, 6, 12}); },
              ThrowsMessage<attn::ShapeError>(AllOf(
                  HasSubstr("cu_seqlens_q = [0, 6, 4, 10]"), HasSubstr("decreases at entry 2"))));
  EXPECT_THAT([&] { run({0, 4, 9}, good_k); },
              ThrowsMessage<attn::ShapeError>(
                  AllOf(HasSubstr("ends at 9"), HasSubstr("q (10, 2, 8) has 10 rows"))));
  EXPECT_THAT([&] { run({1, 4, 10}, good_k); },
              ThrowsMessage<attn::ShapeError>(HasSubstr("starts at 1, not 0")));
  EXPECT_THAT([&] { run(good_q, {0, 12}); },
              ThrowsMessage<attn::ShapeError>(HasSubstr("holds 2 sequences")));
  EXPECT_THAT([&] { run({0}, {0}); }, ThrowsMessage<attn::ShapeError>(HasSubstr("N + 1 >= 2")));
  EXPECT_THAT([&] { run(good_q, good_k, AttentionMask<float>().causal()); },
              ThrowsMessage<attn::ShapeError>(HasSubstr("sequence 0 has T_q=4, T_k=5")));
  const Tensor<bool, 2> allowed(Shape<2>{10, 12});
  EXPECT_THAT([&] { run(good_q, good_k, AttentionMask<float>().allowed(allowed)); },
              ThrowsMessage<attn::ShapeError>(HasSubstr("only the causal bound")));
  EXPECT_THAT([&] { run(good_q, good_k, AttentionMask<float>().key_lengths({3, 4})); },
              ThrowsMessage<attn::ShapeError>(HasSubstr("only the causal bound")));
}

}  // namespace

}  // namespace varlen_test
