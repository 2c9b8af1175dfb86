// SPDX-License-Identifier: MIT
// tests/attention/varlen_test.cpp: packed variable-length batches (attn/attention/varlen.hpp).
// scaled_dot_product_attention_varlen() and its backward against each sequence run alone
// through scaled_dot_product_attention() (contiguous copies of its rows): bit-identical
// (EXPECT_EQ on the floats: each sequence's tasks are the ones it runs alone, on the same
// kernels), for self- and cross-attention, causal bounds of every alignment, windows,
// grouped-query heads, the variants (softcap, ALiBi, sinks), empty sequences and sequences
// without keys, on 1 and 2 threads. Also the module's packed forward, training forward and
// backward against the module on each sequence alone, the packed prefill of a KVCache against
// each item's own prefill, and the errors. The packed backward also against central finite
// differences in double. The packed forward, the packed prefill and
// scaled_dot_product_attention_varlen() on bfloat16 and float16 too: bit-identical to each
// sequence alone, as for float; and a bfloat16 module's packed training forward and backward.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/attn.hpp"
#include "support/finite_difference.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace varlen_test {

namespace {

using attn::AttentionMask;
using attn::AttentionOptions;
using attn::bfloat16;
using attn::CausalAlignment;
using attn::float16;
using attn::Index;
using attn::SequenceOffsets;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
using attn::Workspace;
using attn::test::random_tensor;
using ::testing::HasSubstr;
namespace fd = attn::test::fd;

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
  const int threads = attn::num_threads();
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
    attn::scaled_dot_product_attention_varlen<float>(o.q.view(), o.k.view(), o.v.view(), o.cq, o.ck,
                                                     plain.view(), ws, c.mask, o.options);
    attn::set_num_threads(threads);
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
          gv.view(), c.sinks ? dsinks_alone.view() : TensorView<float, 1>(), ws, c.mask, o.options);
      expect_rows(dq[0].view(), q0, q1, gq.view(), "dq");
      expect_rows(dk[0].view(), k0, k1, gk.view(), "dk");
      expect_rows(dv[0].view(), k0, k1, gv.view(), "dv");
    }
    EXPECT_EQ(attn::test::to_vector(dsinks[0]), attn::test::to_vector(dsinks_alone));
  }
}

// The packed backward against central differences of the packed forward, in double (step
// and tolerance: support/finite_difference.hpp): dq, dk, dv and dsinks, for self-attention
// with a causal bound, learned sinks and an empty sequence, and cross-attention with
// grouped-query heads, d_v != d, a bottom-right causal bound with a window and ALiBi, on
// both paths (the streaming one reads the forward's logsumexp).
TEST(Varlen, BackwardMatchesFiniteDifferences) {
  struct FdCase {
    const char* name;
    std::vector<Index> lq, lk;
    Index heads, kv_heads, d, dv;
    AttentionMask<double> mask;
    bool alibi;
  };
  const FdCase fd_cases[] = {
      {"self, causal, sinks, empty sequence",
       {3, 0, 4},
       {},
       2,
       2,
       3,
       3,
       AttentionMask<double>().causal(),
       false},
      {"cross, GQA, d_v != d, bottom-right window, ALiBi",
       {2, 3},
       {4, 5},
       4,
       2,
       3,
       2,
       AttentionMask<double>().causal(CausalAlignment::kBottomRight).sliding_window(3),
       true},
  };
  for (const FdCase& c : fd_cases) {
    for (const attn::AttentionPath path :
         {attn::AttentionPath::kStreaming, attn::AttentionPath::kMaterialized}) {
      SCOPED_TRACE(std::string(c.name) +
                   (path == attn::AttentionPath::kStreaming ? ", streaming" : ", materialised"));
      const SequenceOffsets cq = SequenceOffsets::from_lengths(c.lq);
      const SequenceOffsets ck = SequenceOffsets::from_lengths(c.lk.empty() ? c.lq : c.lk);
      const Index tq = cq.view()(cq.sequences()), tk = ck.view()(ck.sequences());
      Tensor<double, 3> q = random_tensor<double, 3>({tq, c.heads, c.d}, 1);
      Tensor<double, 3> k = random_tensor<double, 3>({tk, c.kv_heads, c.d}, 2);
      Tensor<double, 3> v = random_tensor<double, 3>({tk, c.kv_heads, c.dv}, 3);
      Tensor<double, 1> sinks = random_tensor<double, 1>({c.heads}, 4);
      const Tensor<double, 1> slopes = random_tensor<double, 1>({c.heads}, 5, 0.1, 0.5);
      const Tensor<double, 3> w = random_tensor<double, 3>({tq, c.heads, c.dv}, 6);
      AttentionOptions options;
      options.path = path;
      options.sinks = sinks;
      if (c.alibi) options.alibi_slopes = slopes;
      Workspace ws;
      const auto forward = [&](Tensor<double, 3>& out, Tensor<double, 2>& lse) {
        out = Tensor<double, 3>(Shape<3>{tq, c.heads, c.dv});
        lse = Tensor<double, 2>(Shape<2>{c.heads, tq});
        attn::scaled_dot_product_attention_varlen<double>(
            q.view(), k.view(), v.view(), cq, ck, out.view(), lse.view(), ws, c.mask, options);
      };
      Tensor<double, 3> out;
      Tensor<double, 2> lse;
      forward(out, lse);
      Tensor<double, 3> dq(q.shape()), dk(k.shape()), dv(v.shape());
      Tensor<double, 1> dsinks(Shape<1>{c.heads});
      attn::scaled_dot_product_attention_varlen_backward<double>(
          q.view(), k.view(), v.view(), cq, ck, out.view(), w.view(), lse.view(), dq.view(),
          dk.view(), dv.view(), ws, c.mask, options, dsinks.view());
      const auto loss = [&]() -> long double {
        Tensor<double, 3> o;
        Tensor<double, 2> l;
        forward(o, l);
        return fd::weighted_sum(o.view(), w.view());
      };
      EXPECT_TRUE(fd::check(
          loss, {fd::variable("q", q.view(), dq.view()), fd::variable("k", k.view(), dk.view()),
                 fd::variable("v", v.view(), dv.view()),
                 fd::variable("sinks", sinks.view(), dsinks.view())}));
    }
  }
}

TEST(Varlen, LongStridedKeysCopiedPerSequence) {
  // Keys and values as two heads of 512-head tensors: rows 16 KiB apart, so a sequence of
  // 600 keys spans more than kKeyValueCopyBytes (8 MiB) and is copied head-major before its
  // tasks run, one of 300 is not; the copies of a run sit side by side in the workspace.
  const Index heads = 2, d = 8;
  const SequenceOffsets cq = SequenceOffsets::from_lengths({70, 9});
  const SequenceOffsets ck = SequenceOffsets::from_lengths({600, 300});
  const Tensor<float, 3> q = random_tensor<float, 3>({79, heads, d}, 51);
  Tensor<float, 3> k_wide(Shape<3>{900, 512, d}), v_wide(Shape<3>{900, 512, d});
  const TensorView<float, 3> k = attn::slice(k_wide.view(), 1, 0, heads);
  const TensorView<float, 3> v = attn::slice(v_wide.view(), 1, 2, 2 + heads);
  attn::copy(random_tensor<float, 3>({900, heads, d}, 52).view(), k);  // the rest stays 0
  attn::copy(random_tensor<float, 3>({900, heads, d}, 53).view(), v);
  const auto mask = AttentionMask<float>().causal(CausalAlignment::kBottomRight);
  Workspace ws;
  Tensor<float, 3> out(Shape<3>{79, heads, d});
  attn::scaled_dot_product_attention_varlen<float>(q.view(), k, v, cq, ck, out.view(), ws, mask);
  for (Index s = 0; s < 2; ++s) {
    SCOPED_TRACE("sequence " + std::to_string(s));
    const Index q0 = cq.begin(s), q1 = q0 + cq.length(s);
    const Index k0 = ck.begin(s), k1 = k0 + ck.length(s);
    const Tensor<float, 4> qs = alone(q.view(), q0, q1), ks = alone(k, k0, k1);
    const Tensor<float, 4> vs = alone(v, k0, k1);
    Tensor<float, 4> y(Shape<4>{1, heads, q1 - q0, d});
    attn::scaled_dot_product_attention<float>(qs.view(), ks.view(), vs.view(), y.view(), ws, mask);
    expect_rows(out.view(), q0, q1, y.view(), "out");
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
  attn::scaled_dot_product_attention_varlen<float>(q.view(), k.view(), v.view(), cu, cu, out.view(),
                                                   ws, {}, options);
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
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                run({0, 6, 4, 10}, {0, 5, 6, 12});
              }),
              AllOf(HasSubstr("cu_seqlens_q = [0, 6, 4, 10]"), HasSubstr("decreases at entry 2")));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                run({0, 4, 9}, good_k);
              }),
              AllOf(HasSubstr("ends at 9"), HasSubstr("q (10, 2, 8) has 10 rows")));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                run({1, 4, 10}, good_k);
              }),
              HasSubstr("starts at 1, not 0"));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                run(good_q, {0, 12});
              }),
              HasSubstr("holds 2 sequences"));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { run({0}, {0}); }),
              HasSubstr("N + 1 >= 2"));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>(
                  [&] { run(good_q, good_k, AttentionMask<float>().causal()); }),
              HasSubstr("sequence 0 has T_q=4, T_k=5"));
  const Tensor<bool, 2> allowed(Shape<2>{10, 12});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>(
                  [&] { run(good_q, good_k, AttentionMask<float>().allowed(allowed)); }),
              HasSubstr("only the causal bound"));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                run(good_q, good_k, AttentionMask<float>().key_lengths({3, 4}));
              }),
              HasSubstr("only the causal bound"));
}

attn::MultiHeadAttention<float> make_module(Index kv_heads, bool causal, Index window, Index kdim,
                                            bool sinks) {
  attn::MultiHeadAttentionOptions o;
  o.d_in = 24;
  o.num_heads = 4;
  o.num_kv_heads = kv_heads;
  o.head_dim = 6;
  o.kdim = o.vdim = kdim;
  o.qkv_bias = true;
  o.causal = causal;
  o.sliding_window = window;
  o.sinks = sinks;
  if (kdim == 0) o.rope = attn::RotaryOptions{6, 6, 10000.0, attn::RopeStyle::kHalfSplit, 256};
  attn::TorchGenerator gen(3);
  attn::MultiHeadAttention<float> m(o, gen);
  if (sinks) {
    const auto values = random_tensor<float, 1>({4}, 8);
    for (Index h = 0; h < 4; ++h) m.sinks()(h) = values(h);
  }
  return m;
}

/// Rows [r0, r1) of a (total, features) tensor.
template <class E>
Tensor<E, 2> rows_of(const Tensor<E, 2>& x, Index r0, Index r1) {
  return Tensor<E, 2>(attn::slice(x.view(), 0, r0, r1));
}

/// A float tensor's values rounded to E (copied for float).
template <class E, std::size_t Rank>
Tensor<E, Rank> rounded(const Tensor<float, Rank>& x) {
  Tensor<E, Rank> t(x.shape());
  for (Index i = 0; i < x.size(); ++i) t.data()[i] = E(x.data()[i]);
  return t;
}

/// Rows r0.. of `packed` hold `alone`'s bits.
template <class E>
void expect_same_rows(const Tensor<E, 2>& packed, Index r0, const Tensor<E, 2>& alone,
                      const char* what) {
  SCOPED_TRACE(what);
  for (Index i = 0; i < alone.extent(0); ++i) {
    for (Index c = 0; c < alone.extent(1); ++c) {
      const E a = packed(r0 + i, c), b = alone(i, c);
      ASSERT_EQ(std::memcmp(&a, &b, sizeof(E)), 0)
          << "row " << r0 + i << " col " << c << ": " << static_cast<float>(a) << " vs "
          << static_cast<float>(b);
    }
  }
}

// The module's packed forward (a float module, or its bfloat16 or float16 twin with the weights
// rounded, on rounded inputs) against each sequence alone: the same bits, on 1 and 2 threads.
template <class E>
void check_module_forward() {
  const int threads = attn::num_threads();
  struct ModuleCase {
    Index kv_heads;
    bool causal;
    Index window, kdim;
    std::vector<Index> lq, lk;
  };
  const std::vector<ModuleCase> all = {
      {2, true, 0, 0, {9, 0, 70, 1}, {}},          // self, causal, GQA, RoPE
      {4, true, 5, 0, {3, 40, 12}, {}},            // sliding window
      {1, false, 0, 16, {6, 30, 2}, {11, 4, 50}},  // cross, kdim != d_in
  };
  for (const ModuleCase& c : all) {
    SCOPED_TRACE("H_kv=" + std::to_string(c.kv_heads) + " W=" + std::to_string(c.window));
    const attn::MultiHeadAttention<E> m(make_module(c.kv_heads, c.causal, c.window, c.kdim, false));
    const SequenceOffsets cq = SequenceOffsets::from_lengths(c.lq);
    const SequenceOffsets ck = SequenceOffsets::from_lengths(c.lk.empty() ? c.lq : c.lk);
    const Index tq = cq.view()(cq.sequences()), tk = ck.view()(ck.sequences());
    const Tensor<E, 2> x = rounded<E>(random_tensor<float, 2>({tq, 24}, 21));
    const Tensor<E, 2> kv = rounded<E>(random_tensor<float, 2>({tk, c.kdim > 0 ? c.kdim : 24}, 22));
    const Tensor<E, 2>& keys = c.lk.empty() ? x : kv;
    Workspace ws;
    Tensor<E, 2> out[2];
    for (int t = 0; t < 2; ++t) {
      attn::set_num_threads(t + 1);
      out[t] = Tensor<E, 2>(Shape<2>{tq, 24});
      m.forward(x.view(), keys.view(), keys.view(), {cq, ck}, out[t].view(), ws);
    }
    attn::set_num_threads(threads);
    expect_same_rows(out[0], 0, out[1], "1 and 2 threads");
    for (Index s = 0; s < cq.sequences(); ++s) {
      if (cq.length(s) == 0) continue;
      const Tensor<E, 2> xs = rows_of(x, cq.begin(s), cq.begin(s) + cq.length(s));
      const Tensor<E, 2> ks = rows_of(keys, ck.begin(s), ck.begin(s) + ck.length(s));
      Tensor<E, 2> ys(Shape<2>{xs.extent(0), 24});
      m.forward(xs.view(), ks.view(), ks.view(), ys.view(), ws);
      expect_same_rows(out[0], cq.begin(s), ys, ("sequence " + std::to_string(s)).c_str());
    }
  }
}

// scaled_dot_product_attention_varlen() on bfloat16 and float16 operands (the streaming kernel
// of those types) against scaled_dot_product_attention() on each sequence alone: the same bits
// (causal GQA with an empty sequence; cross-attention, top-left causal, a window).
template <class E>
void check_storage_varlen() {
  const std::vector<Case> all = cases();
  for (const Case* c : {&all[1], &all[3]}) {
    SCOPED_TRACE(c->name);
    const Operands o = operands(*c, 50);
    const Tensor<E, 3> q = rounded<E>(o.q), k = rounded<E>(o.k), v = rounded<E>(o.v);
    const Index tq = q.extent(0);
    Tensor<E, 3> out(Shape<3>{tq, c->heads, c->dv});
    Workspace ws;
    attn::scaled_dot_product_attention_varlen<E>(q.view(), k.view(), v.view(), o.cq, o.ck,
                                                 out.view(), ws, c->mask);
    for (Index s = 0; s < o.cq.sequences(); ++s) {
      SCOPED_TRACE("sequence " + std::to_string(s));
      const Index q0 = o.cq.begin(s), q1 = q0 + o.cq.length(s);
      const Index k0 = o.ck.begin(s), k1 = k0 + o.ck.length(s);
      if (q1 == q0 || k1 == k0) continue;
      const Tensor<E, 4> qs = rounded<E>(alone(o.q.view(), q0, q1));
      const Tensor<E, 4> ks = rounded<E>(alone(o.k.view(), k0, k1));
      const Tensor<E, 4> vs = rounded<E>(alone(o.v.view(), k0, k1));
      Tensor<E, 4> ys(Shape<4>{1, c->heads, q1 - q0, c->dv});
      attn::scaled_dot_product_attention<E>(qs.view(), ks.view(), vs.view(), ys.view(), ws,
                                            c->mask);
      for (Index h = 0; h < c->heads; ++h) {
        for (Index i = q0; i < q1; ++i) {
          for (Index x = 0; x < c->dv; ++x) {
            const E a = out(i, h, x), b = ys(0, h, i - q0, x);
            ASSERT_EQ(std::memcmp(&a, &b, sizeof(E)), 0) << "head " << h << " row " << i;
          }
        }
      }
    }
  }
}

TEST(Varlen, Bf16AndFp16EqualEachSequenceAlone) {
  check_storage_varlen<bfloat16>();
  check_storage_varlen<float16>();
}

TEST(VarlenModule, ForwardEqualsEachSequenceAlone) { check_module_forward<float>(); }
TEST(VarlenModule, Bf16ForwardEqualsEachSequenceAlone) { check_module_forward<bfloat16>(); }
TEST(VarlenModule, Fp16ForwardEqualsEachSequenceAlone) { check_module_forward<float16>(); }

// The module's packed training forward and backward (a float module, or its bfloat16 twin
// with the weights rounded, on rounded inputs; self-attention, and cross-attention with its
// own key offsets) against each sequence's own, on 1 and 2 threads (the same bits on both). Outputs
// and input gradients: bit-identical (each row's dX is its own row of dQKV times W; each sequence's
// kernel calls are its own). Parameter gradients sum over rows: the packed backward sums all rows
// in one GEMM (float sums), rounded once into its gradient; the reference is the sum, in double, of
// each sequence's own. So entry by entry they differ by the float sums' order, at most 2e-5 of the
// largest entry (80 rows of O(1) terms; an error in one sequence's rows moves them by 1e-2 or
// more), and for bfloat16 by the roundings to bfloat16 too: half an ulp (2^-8 relative) of the
// packed entry and of each sequence's entry (float16: 2^-11).
template <class E>
void check_module_backward() {
  constexpr double kRound = std::is_same_v<E, float>      ? 0.0
                            : std::is_same_v<E, bfloat16> ? 1.0 / 256
                                                          : 1.0 / 2048;
  const int threads = attn::num_threads();
  struct BackwardCase {
    Index kv_heads;
    bool causal;
    Index kdim;
    bool sinks;
    Index window;
    std::vector<Index> lq, lk;
  };
  const std::vector<BackwardCase> all = {
      {2, true, 0, true, 0, {7, 0, 66, 1, 6}, {}},        // self, causal, GQA, RoPE, sinks
      {1, false, 16, false, 0, {6, 30, 2}, {11, 4, 50}},  // cross, kdim != d_in
      // self, causal within a window of 5 keys: each sequence's band starts at its own row 0
      // (a window that leaked across sequences would reach the previous one's keys).
      {2, true, 0, false, 5, {9, 3, 0, 20}, {}},
  };
  for (const BackwardCase& c : all) {
    SCOPED_TRACE(std::string(c.lk.empty() ? "self" : "cross") + ", window " +
                 std::to_string(c.window));
    const attn::MultiHeadAttention<E> m(
        make_module(c.kv_heads, c.causal, c.window, c.kdim, c.sinks));
    const SequenceOffsets cq = SequenceOffsets::from_lengths(c.lq);
    const SequenceOffsets ck = SequenceOffsets::from_lengths(c.lk.empty() ? c.lq : c.lk);
    const Index tq = cq.view()(cq.sequences()), tk = ck.view()(ck.sequences());
    const Index kdim = c.kdim > 0 ? c.kdim : 24;
    const Tensor<E, 2> x = rounded<E>(random_tensor<float, 2>({tq, 24}, 31));
    const Tensor<E, 2> kv = rounded<E>(random_tensor<float, 2>({tk, kdim}, 33));
    const Tensor<E, 2> w = rounded<E>(random_tensor<float, 2>({tq, 24}, 32));
    const Tensor<E, 2>& keys = c.lk.empty() ? x : kv;
    Workspace ws;
    // Self-attention: one gradient for x (gk unused); cross: key = value's in gk.
    Tensor<E, 2> out[2], gx[2], gk[2];
    std::vector<attn::Gradients<E>> grads;
    grads.reserve(2);
    for (int t = 0; t < 2; ++t) {
      attn::set_num_threads(t + 1);
      attn::SavedForward<E> saved;
      out[t] = Tensor<E, 2>(Shape<2>{tq, 24});
      gx[t] = Tensor<E, 2>(Shape<2>{tq, 24});
      gk[t] = Tensor<E, 2>(Shape<2>{tk, kdim});
      const TensorView<E, 2> gkey = c.lk.empty() ? gx[t].view() : gk[t].view();
      grads.emplace_back(m.named_parameters());
      m.forward(x.view(), keys.view(), keys.view(), {cq, ck}, out[t].view(), saved, ws);
      m.backward(w.view(), saved, gx[t].view(), gkey, gkey, grads.back(), ws);
    }
    attn::set_num_threads(threads);
    expect_same_rows(out[0], 0, out[1], "out, 1 and 2 threads");
    expect_same_rows(gx[0], 0, gx[1], "grad x, 1 and 2 threads");
    expect_same_rows(gk[0], 0, gk[1], "grad key, 1 and 2 threads");
    // Per parameter: the sum of the sequences' own gradients, and of their magnitudes.
    std::vector<std::vector<double>> sum(grads[0].size()), magnitude(grads[0].size());
    for (Index s = 0; s < cq.sequences(); ++s) {
      if (cq.length(s) == 0) continue;
      SCOPED_TRACE("sequence " + std::to_string(s));
      const Index r0 = cq.begin(s), r1 = r0 + cq.length(s);
      const Index k0 = ck.begin(s), k1 = k0 + ck.length(s);
      const Tensor<E, 2> xs = rows_of(x, r0, r1), ws_ = rows_of(w, r0, r1);
      // Self-attention: xs itself (the fused projection, as packed), else the key rows.
      const Tensor<E, 2> key_rows = rows_of(keys, k0, k1);
      const Tensor<E, 2>& ks = c.lk.empty() ? xs : key_rows;
      Tensor<E, 2> ys(xs.shape()), gs(xs.shape()), gks(ks.shape());
      const TensorView<E, 2> gkey = c.lk.empty() ? gs.view() : gks.view();
      attn::SavedForward<E> saved_s;
      attn::Gradients<E> alone_grads(m.named_parameters());
      m.forward(xs.view(), ks.view(), ks.view(), ys.view(), saved_s, ws);
      m.backward(ws_.view(), saved_s, gs.view(), gkey, gkey, alone_grads, ws);
      expect_same_rows(out[0], r0, ys, "out");
      expect_same_rows(gx[0], r0, gs, "grad x");
      if (!c.lk.empty()) expect_same_rows(gk[0], k0, gks, "grad key");
      for (std::size_t i = 0; i < alone_grads.size(); ++i) {
        const auto b = attn::test::to_vector(alone_grads[i].matrix());
        sum[i].resize(b.size(), 0.0);
        magnitude[i].resize(b.size(), 0.0);
        for (std::size_t j = 0; j < b.size(); ++j) {
          sum[i][j] += static_cast<double>(b[j]);
          magnitude[i][j] += std::abs(static_cast<double>(b[j]));
        }
      }
    }
    for (std::size_t i = 0; i < grads[0].size(); ++i) {
      SCOPED_TRACE(grads[0][i].name());
      const auto a = attn::test::to_vector(grads[0][i].matrix());
      const auto a2 = attn::test::to_vector(grads[1][i].matrix());
      ASSERT_EQ(std::memcmp(a.data(), a2.data(), a.size() * sizeof(E)), 0) << "1 and 2 threads";
      double scale = 0;
      for (const double b : sum[i]) scale = std::max(scale, std::abs(b));
      for (std::size_t j = 0; j < a.size(); ++j) {
        const double packed = static_cast<double>(a[j]);
        EXPECT_NEAR(packed, sum[i][j], 2e-5 * scale + kRound * (std::abs(packed) + magnitude[i][j]))
            << "entry " << j;
      }
      EXPECT_GT(scale, 0.0);
    }
  }
}

TEST(VarlenModule, BackwardEqualsEachSequenceAlone) { check_module_backward<float>(); }
// On each bfloat16 path this CPU runs (the kernel on bfloat16 products reads the forward's
// rows in bfloat16, split per sequence too: kDot at head dim 6, not kAmx; the path is restored
// after the test by tests/support/test_main.cpp).
TEST(VarlenModule, Bf16BackwardEqualsEachSequenceAlone) {
  for (const attn::Bf16Path path :
       {attn::Bf16Path::kWiden, attn::Bf16Path::kDot, attn::Bf16Path::kAmx}) {
    if (!attn::bf16_path_available(path)) continue;
    SCOPED_TRACE(attn::bf16_path_name(path));
    attn::set_bf16_path(path);
    check_module_backward<bfloat16>();
  }
}
// float16: whatever the bfloat16 path, its kernel takes the float products on widened rows.
TEST(VarlenModule, Fp16BackwardEqualsEachSequenceAlone) {
  for (const attn::Bf16Path path : {attn::Bf16Path::kWiden, attn::Bf16Path::kDot}) {
    if (!attn::bf16_path_available(path)) continue;
    SCOPED_TRACE(attn::bf16_path_name(path));
    attn::set_bf16_path(path);
    check_module_backward<float16>();
  }
}

// A cache without a window and a ring (window 6, chunks of 4: the packed prefill runs in
// rounds); two packed prefills (the second continues each item), then one decode step: each
// sequence's rows and its item's keys and values the same bits as its own prefill (a float
// module, or its bfloat16 twin through a KVCache<bfloat16>).
template <class E>
void check_module_prefill() {
  for (const Index window : {Index(0), Index(6)}) {
    SCOPED_TRACE("window " + std::to_string(window));
    const attn::MultiHeadAttention<E> m(make_module(2, true, window, 0, false));
    const auto make_cache = [&](Index items) {
      return window > 0 ? attn::KVCache<E>::sliding_window(items, 2, 6, window, 4)
                        : attn::KVCache<E>(items, 2, 6, 128);
    };
    attn::KVCache<E> cache = make_cache(4);  // item 3 is left alone
    std::vector<attn::KVCache<E>> alone;
    for (int s = 0; s < 3; ++s) alone.push_back(make_cache(1));
    Workspace ws;
    std::uint64_t seed = 40;
    for (const std::vector<Index>& lengths :
         {std::vector<Index>{9, 1, 30}, std::vector<Index>{2, 0, 5}, std::vector<Index>{1, 1, 1}}) {
      const SequenceOffsets cu = SequenceOffsets::from_lengths(lengths);
      const Index total = cu.view()(3);
      const Tensor<E, 2> x = rounded<E>(random_tensor<float, 2>({total, 24}, ++seed));
      Tensor<E, 2> out(Shape<2>{total, 24});
      m.forward(x.view(), x.view(), x.view(), cu, out.view(), ws, cache);
      for (Index s = 0; s < 3; ++s) {
        SCOPED_TRACE("sequence " + std::to_string(s));
        if (cu.length(s) == 0) continue;
        const Tensor<E, 2> xs = rows_of(x, cu.begin(s), cu.begin(s) + cu.length(s));
        Tensor<E, 3> ys(Shape<3>{1, xs.extent(0), 24});
        m.forward(attn::unsqueeze(xs.view(), 0), attn::unsqueeze(xs.view(), 0),
                  attn::unsqueeze(xs.view(), 0), ys.view(), ws, alone[static_cast<std::size_t>(s)]);
        const Tensor<E, 2> y2(attn::select(ys.view(), 0, 0));
        expect_same_rows(out, cu.begin(s), y2, "out");
        const auto& a = alone[static_cast<std::size_t>(s)];
        ASSERT_EQ(cache.length(s), a.length(0));
        for (int part = 0; part < 2; ++part) {
          const auto mine = attn::test::to_vector(part == 0 ? cache.k(s) : cache.v(s));
          const auto theirs = attn::test::to_vector(part == 0 ? a.k(0) : a.v(0));
          ASSERT_EQ(mine.size(), theirs.size());
          EXPECT_EQ(std::memcmp(mine.data(), theirs.data(), mine.size() * sizeof(E)), 0) << part;
        }
      }
    }
    EXPECT_EQ(cache.length(3), 0);
  }
}

TEST(VarlenModule, PrefillEqualsEachSequenceAlone) { check_module_prefill<float>(); }
TEST(VarlenModule, Bf16PrefillEqualsEachSequenceAlone) { check_module_prefill<bfloat16>(); }

TEST(VarlenModule, Errors) {
  const auto m = make_module(2, true, 0, 0, false);
  const Tensor<float, 2> x = random_tensor<float, 2>({10, 24}, 1);
  Tensor<float, 2> out(Shape<2>{10, 24});
  Workspace ws;
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                m.forward(x.view(), x.view(), x.view(), SequenceOffsets{0, 4, 9}, out.view(), ws);
              }),
              AllOf(HasSubstr("MultiHeadAttention::forward"), HasSubstr("ends at 9"),
                    HasSubstr("query (10, 24) has 10 rows")));
  EXPECT_THAT(
      attn::test::thrown<attn::ShapeError>([&] {
        m.forward(x.view(), x.view(), x.view(), SequenceOffsets{0, 5, 4, 10}, out.view(), ws);
      }),
      HasSubstr("decreases at entry 2"));
  attn::KVCache<float> cache(2, 2, 6, 64);
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>([&] {
                m.forward(x.view(), x.view(), x.view(), SequenceOffsets{0, 2, 5, 10}, out.view(),
                          ws, cache);
              }),
              HasSubstr("a packed batch of 3 sequences fills one cache item each, but the cache "
                        "holds B=2 items"));
  EXPECT_EQ(cache.length(0), 0);
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                m.forward(x.view(), x.view(), x.view(), SequenceOffsets{0, 2, 10}, out.view(), ws,
                          AttentionMask<float>().key_lengths({2, 8}));
              }),
              HasSubstr("only the causal bound"));
  attn::SimpleSelfAttention<float> simple;
  EXPECT_THROW(simple.forward(x.view(), SequenceOffsets{0, 10}, out.view(), ws), attn::ConfigError);
}

}  // namespace

}  // namespace varlen_test

#include "support/bodies_end.hpp"
