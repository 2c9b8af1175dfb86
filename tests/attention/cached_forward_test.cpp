// SPDX-License-Identifier: MIT
// tests/attention/cached_forward_test.cpp: the incremental forward (attn/attention/
// cached_forward.hpp) against the whole-sequence forward of the same module, over many random
// splits of each sequence into a prefill, chunks and single tokens, with ragged batches (an
// item truncated, as after rejected speculative tokens, then decoding on), grouped-query and
// multi-query heads, sliding windows (the cache a ring), both RoPE conventions, partial
// rotary, and biases on and off. Also: the same bits for 1 and 2 threads, the errors, and the
// modules built on one core (CausalAttention) running it too. And attention sinks
// (KVCacheOptions::sink_tokens): streams four times longer than sinks + window, token by
// token and in chunks, against a long double reference that keeps the token list, numbers
// the keys each token sees by their place in the cache and rotates them there; float and
// quantised rows; the plain cache's bits while every token is kept.
//
// Tolerance: 2 module_tolerance (module_test_support.hpp): the whole-sequence forward and the
// incremental one are each within module_tolerance of the exact result (the same projections;
// the kernel's tiles and key chunks differ, so its rounding does), so they are within twice
// that of each other. A wrong position, mask bound or cache row moves outputs by 1e-2 or more.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attention/module_test_support.hpp"
#include "attention/reference_attention.hpp"
#include "attn/attn.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace cached_forward_test {

namespace {

using attn::Index;
using attn::KVCache;
using attn::KVCacheOptions;
using attn::KVElement;
using attn::MultiHeadAttention;
using attn::MultiHeadAttentionOptions;
using attn::RopeStyle;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
using attn::test::module_tolerance;
using attn::test::WideWeights;
using Real = attn::test::ref::Real;
using ::testing::AllOf;
using ::testing::HasSubstr;
namespace ref = attn::test::ref;

struct Config {
  Index d, heads, kv_heads, head_dim, rotary_dim, window;
  RopeStyle style;
  bool bias;
};

std::string describe(const Config& c) {
  return "d=" + std::to_string(c.d) + " H=" + std::to_string(c.heads) +
         " H_kv=" + std::to_string(c.kv_heads) + " hd=" + std::to_string(c.head_dim) +
         " rotary=" + std::to_string(c.rotary_dim) + " W=" + std::to_string(c.window) +
         (c.style == RopeStyle::kInterleaved ? " interleaved" : " half-split") +
         (c.bias ? " bias" : "");
}

const std::vector<Config> kConfigs = {
    {32, 4, 4, 8, 8, 0, RopeStyle::kHalfSplit, true},     // multi-head
    {32, 4, 2, 8, 8, 0, RopeStyle::kInterleaved, false},  // grouped-query
    {32, 4, 1, 8, 4, 0, RopeStyle::kHalfSplit, true},     // multi-query, partial rotary
    {24, 4, 2, 10, 6, 7, RopeStyle::kInterleaved, true},  // head_dim set, window 7
    {32, 8, 2, 4, 4, 20, RopeStyle::kHalfSplit, false},   // window 20, groups of 4
    {16, 2, 1, 8, 0, 0, RopeStyle::kHalfSplit, false},    // no rotary embedding
};

template <class Scalar>
MultiHeadAttention<Scalar> make_module(const Config& c, Index max_positions) {
  MultiHeadAttentionOptions o;
  o.d_in = c.d;
  o.num_heads = c.heads;
  o.num_kv_heads = c.kv_heads;
  o.head_dim = c.head_dim;
  o.qkv_bias = c.bias;
  o.out_bias = c.bias;
  o.causal = true;
  o.sliding_window = c.window;
  if (c.rotary_dim > 0) {
    o.rope = attn::RotaryOptions{c.head_dim, c.rotary_dim, 10000.0, c.style, max_positions};
  }
  attn::TorchGenerator gen(17);
  MultiHeadAttention<Scalar> m(o, gen);
  m.eval();
  return m;
}

/// One item's tokens so far, (1, L, d) rows.
template <class Scalar>
struct Sequence {
  std::vector<Scalar> rows;
  Index length(Index d) const { return static_cast<Index>(rows.size()) / d; }
};

/// Runs random steps through a cache and checks each step's rows against the whole forward
/// of each item's sequence so far.
template <class Scalar>
void check_random_splits(const Config& c, Index batch, std::uint64_t seed) {
  SCOPED_TRACE(describe(c) + " B=" + std::to_string(batch) + " seed=" + std::to_string(seed));
  const Index total = 70, max_chunk = 9;
  const MultiHeadAttention<Scalar> m = make_module<Scalar>(c, 2 * total);
  KVCache<Scalar> cache = c.window > 0 ? KVCache<Scalar>::sliding_window(
                                             batch, c.kv_heads, c.head_dim, c.window, max_chunk)
                                       : KVCache<Scalar>(batch, c.kv_heads, c.head_dim, 2 * total);
  std::mt19937_64 rng(seed);
  std::vector<Sequence<Scalar>> seqs(static_cast<std::size_t>(batch));
  attn::Workspace ws;
  const double tol = 2 * module_tolerance<Scalar>(c.d, c.head_dim, total, c.d);
  Index step = 0;
  while (seqs[0].length(c.d) < total) {
    ++step;
    // A prefill first (longer than max_chunk with a window: it runs in chunks), then chunks
    // and single tokens; now and then an item drops its last few tokens.
    const Index t = step == 1 ? Index(1 + rng() % 20)
                              : (rng() % 3 == 0 ? Index(1 + rng() % max_chunk) : Index(1));
    if (step > 1 && rng() % 5 == 0) {
      const Index b = static_cast<Index>(rng() % static_cast<std::uint64_t>(batch));
      const Index n = std::max<Index>(1, cache.length(b) - Index(1 + rng() % 3));
      const Index needed = c.window > 0 ? std::max<Index>(0, n - c.window + 1) : 0;
      if (cache.first_position(b) <= needed) {
        cache.truncate(b, n);
        seqs[static_cast<std::size_t>(b)].rows.resize(static_cast<std::size_t>(n * c.d));
      }
    }
    const auto x = attn::test::random_tensor<Scalar>(Shape<3>{batch, t, c.d}, seed * 1000 + step);
    Tensor<Scalar, 3> out({batch, t, c.d});
    m.forward(x.view(), out.view(), ws, cache);
    for (Index b = 0; b < batch; ++b) {
      auto& rows = seqs[static_cast<std::size_t>(b)].rows;
      for (Index i = 0; i < t * c.d; ++i) rows.push_back(x.data()[b * t * c.d + i]);
      const Index len = static_cast<Index>(rows.size()) / c.d;
      ASSERT_EQ(cache.length(b), len);
      const Tensor<Scalar, 3> whole =
          m.forward(TensorView<const Scalar, 3>(rows.data(), {1, len, c.d}));
      const TensorView<const Scalar, 3> expected = attn::slice(whole.view(), 1, len - t, len);
      ASSERT_TRUE(ref::all_near(attn::slice(TensorView<const Scalar, 3>(out.view()), 0, b, b + 1),
                                expected, tol))
          << "step " << step << " item " << b << " T=" << t << " length " << len;
    }
  }
}

template <class Scalar>
class CachedForward : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(CachedForward, Scalars, );

TYPED_TEST(CachedForward, AnySplitEqualsTheWholeSequenceForward) {
  for (const Config& c : kConfigs) {
    for (const Index batch : {Index(1), Index(3)}) {
      for (std::uint64_t seed = 1; seed <= (ref::kOptimizedBuild ? 4u : 2u); ++seed) {
        check_random_splits<TypeParam>(c, batch, seed);
      }
    }
  }
}

TYPED_TEST(CachedForward, SameBitsForAnyThreadCount) {
  using S = TypeParam;
  const Config c{32, 4, 2, 8, 8, 0, RopeStyle::kHalfSplit, true};
  const MultiHeadAttention<S> m = make_module<S>(c, 1200);
  const int saved = attn::num_threads();
  std::vector<Tensor<S, 3>> outs;
  for (const int threads : {1, 2}) {
    attn::set_num_threads(threads);
    KVCache<S> cache(2, c.kv_heads, c.head_dim, 1200);
    attn::Workspace ws;
    // A prefill past two 512-key chunks, then decoding steps over them.
    const auto prompt = attn::test::random_tensor<S>(Shape<3>{2, 1100, c.d}, 5);
    Tensor<S, 3> y({2, 1100, c.d});
    m.forward(prompt.view(), y.view(), ws, cache);
    Tensor<S, 3> all({2, 4, c.d});
    for (Index step = 0; step < 4; ++step) {
      const auto x = attn::test::random_tensor<S>(Shape<3>{2, 1, c.d}, 6 + step);
      m.forward(x.view(), attn::slice(all.view(), 1, step, step + 1), ws, cache);
    }
    outs.push_back(std::move(all));
  }
  attn::set_num_threads(saved);
  EXPECT_TRUE(ref::same_bits(outs[0].view(), outs[1].view()));
}

TYPED_TEST(CachedForward, ModulesOnOneCoreRunIt) {
  using S = TypeParam;
  attn::manual_seed(3);
  const attn::CausalAttention<S> causal(8, 8, 32, 0.0);
  KVCache<S> cache(1, 1, 8, 32);
  attn::Workspace ws;
  const auto x = attn::test::random_tensor<S>(Shape<3>{1, 12, 8}, 9);
  const Tensor<S, 3> whole = [&] {
    auto copy = causal;
    copy.eval();
    return copy.forward(x.view());
  }();
  auto module = causal;
  module.eval();
  Tensor<S, 3> out({1, 12, 8});
  module.forward(attn::slice(x.view(), 1, 0, 5), attn::slice(out.view(), 1, 0, 5), ws, cache);
  for (Index t = 5; t < 12; ++t) {
    module.forward(attn::slice(x.view(), 1, t, t + 1), attn::slice(out.view(), 1, t, t + 1), ws,
                   cache);
  }
  EXPECT_TRUE(ref::all_near(out.view(), whole.view(), 2 * module_tolerance<S>(8, 8, 12, 8)));
}

// In place (x is out) with a ring that takes 2 tokens at a time: the 5 tokens run in three
// chunks, each reading rows of the staged copy of x; the same bits as out of place.
TYPED_TEST(CachedForward, InPlaceLongerThanTheRingsChunkGivesTheSameBits) {
  using S = TypeParam;
  const Config c{32, 4, 2, 8, 8, 4, RopeStyle::kHalfSplit, true};
  const MultiHeadAttention<S> m = make_module<S>(c, 16);
  const auto x = attn::test::random_tensor<S>(Shape<3>{2, 5, c.d}, 4);
  Tensor<S, 3> expected({2, 5, c.d});
  attn::Workspace ws;
  auto cache = KVCache<S>::sliding_window(2, c.kv_heads, c.head_dim, c.window, 2);
  m.forward(x.view(), expected.view(), ws, cache);
  Tensor<S, 3> inout = x;
  auto cache2 = KVCache<S>::sliding_window(2, c.kv_heads, c.head_dim, c.window, 2);
  m.forward(inout.view(), inout.view(), ws, cache2);
  EXPECT_TRUE(ref::same_bits(inout.view(), expected.view()));
}

TYPED_TEST(CachedForward, ModulesWithoutOneCoreRefuseIt) {
  using S = TypeParam;
  attn::manual_seed(3);
  const attn::MultiHeadAttentionWrapper<S> wrapper(8, 4, 16, 0.0, 2);
  const attn::SimpleSelfAttention<S> simple;
  KVCache<S> cache(1, 1, 4, 16);
  attn::Workspace ws;
  const auto x = attn::test::random_tensor<S>(Shape<3>{1, 3, 8}, 1);
  Tensor<S, 3> out({1, 3, 8});
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>(
                  [&] { wrapper.forward(x.view(), out.view(), ws, cache); }),
              HasSubstr("use MultiHeadAttention"));
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>(
                  [&] { simple.forward(x.view(), out.view(), ws, cache); }),
              HasSubstr("no projections"));
}

TYPED_TEST(CachedForward, ErrorsNameTheValuesAndLeaveTheCacheAlone) {
  using S = TypeParam;
  const Config c{32, 4, 2, 8, 8, 0, RopeStyle::kHalfSplit, false};
  const MultiHeadAttention<S> m = make_module<S>(c, 10);
  KVCache<S> cache(1, 2, 8, 6);
  attn::Workspace ws;
  const auto x = attn::test::random_tensor<S>(Shape<3>{1, 4, 32}, 1);
  Tensor<S, 3> out({1, 4, 32});
  m.forward(x.view(), out.view(), ws, cache);
  EXPECT_THAT(
      attn::test::thrown<attn::ConfigError>([&] { m.forward(x.view(), out.view(), ws, cache); }),
      HasSubstr("exceed the cache's capacity=6"));
  EXPECT_EQ(cache.length(0), 4);
  KVCache<S> wrong_heads(1, 4, 8, 6);
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>(
                  [&] { m.forward(x.view(), out.view(), ws, wrong_heads); }),
              HasSubstr("H_kv=4"));
  KVCache<S> ring = KVCache<S>::sliding_window(1, 2, 8, 4, 4);
  EXPECT_THAT(
      attn::test::thrown<attn::ConfigError>([&] { m.forward(x.view(), out.view(), ws, ring); }),
      HasSubstr("sliding_window is 0"));
  KVCache<S> big(1, 2, 8, 64);
  const auto longer = attn::test::random_tensor<S>(Shape<3>{1, 12, 32}, 2);
  Tensor<S, 3> longer_out({1, 12, 32});
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>(
                  [&] { m.forward(longer.view(), longer_out.view(), ws, big); }),
              HasSubstr("outside the rotary tables [0, 10)"));
  EXPECT_EQ(big.length(0), 0);
  attn::AttentionMask<S> mask;
  mask.causal();
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>(
                  [&] { m.forward(x.view(), out.view(), ws, big, mask); }),
              HasSubstr("takes no mask"));
  const auto other = attn::test::random_tensor<S>(Shape<3>{1, 4, 32}, 3);
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>(
                  [&] { m.forward(x.view(), other.view(), other.view(), out.view(), ws, big); }),
              HasSubstr("self-attention"));
}

// ---- Attention sinks ----

/// w (rows, d) x + bias (empty: none) over `d` inputs.
template <class Scalar>
std::vector<Real> project(const Tensor<Real, 2>& w, const Tensor<Real, 1>& bias, const Scalar* x) {
  std::vector<Real> y(static_cast<std::size_t>(w.extent(0)));
  for (Index r = 0; r < w.extent(0); ++r) {
    Real sum = bias.size() > 0 ? bias(r) : Real(0);
    for (Index e = 0; e < w.extent(1); ++e) sum += w(r, e) * static_cast<Real>(x[e]);
    y[static_cast<std::size_t>(r)] = sum;
  }
  return y;
}

/// RoPE in long double: the first `rotary` features of one head row at position `pos`.
void rotate(Real* x, Index rotary, RopeStyle style, Index pos) {
  const Index half = rotary / 2;
  for (Index i = 0; i < half; ++i) {
    const Real angle = static_cast<Real>(pos) * std::pow(Real(10000), -Real(2 * i) / rotary);
    const Index a = style == RopeStyle::kHalfSplit ? i : 2 * i;
    const Index b = style == RopeStyle::kHalfSplit ? i + half : 2 * i + 1;
    const Real xa = x[a], xb = x[b];
    x[a] = xa * std::cos(angle) - xb * std::sin(angle);
    x[b] = xb * std::cos(angle) + xa * std::sin(angle);
  }
}

/// The output row of token p of one stream through a cache of S sinks and window W, by the
/// definition: the token sees the keys of tokens 0 .. S-1 and (p - W, p] (all of 0 .. p while
/// they are at most S + W), the i-th of that list at cache position i, rotated there, and its
/// query at the last position. kv(j): token j's un-rotated key and value rows (2 H_kv hd).
template <class Scalar, class KeyValues>
std::vector<Real> sink_reference(const Config& c, const WideWeights& w, const Scalar* x_p, Index p,
                                 Index sinks, Index window, KeyValues&& kv) {
  const Index hd = c.head_dim, group = c.heads / c.kv_heads;
  std::vector<Index> list;
  for (Index j = 0; j <= p; ++j) {
    if (p + 1 <= sinks + window || j < sinks || j > p - window) list.push_back(j);
  }
  const Index n = static_cast<Index>(list.size());
  std::vector<Real> q = project(w.wq, w.bq, x_p), ctx(q.size(), Real(0));
  std::vector<std::vector<Real>> rows;
  for (Index i = 0; i < n; ++i) {
    rows.push_back(kv(list[static_cast<std::size_t>(i)]));
    for (Index h = 0; h < (c.rotary_dim > 0 ? c.kv_heads : 0); ++h) {
      rotate(rows.back().data() + h * hd, c.rotary_dim, c.style, i);
    }
  }
  for (Index h = 0; h < c.heads; ++h) {
    Real* qh = q.data() + h * hd;
    if (c.rotary_dim > 0) rotate(qh, c.rotary_dim, c.style, n - 1);
    const Index g = h / group;
    std::vector<Real> score(static_cast<std::size_t>(n));
    Real top = -1e300L, sum = 0;
    for (Index i = 0; i < n; ++i) {
      Real dot = 0;
      for (Index e = 0; e < hd; ++e) dot += qh[e] * rows[std::size_t(i)][std::size_t(g * hd + e)];
      score[std::size_t(i)] = dot / std::sqrt(static_cast<Real>(hd));
      top = std::max(top, score[std::size_t(i)]);
    }
    for (Real& s : score) sum += (s = std::exp(s - top));
    for (Index i = 0; i < n; ++i) {
      for (Index e = 0; e < hd; ++e) {
        ctx[std::size_t(h * hd + e)] +=
            score[std::size_t(i)] / sum *
            rows[std::size_t(i)][std::size_t((c.kv_heads + g) * hd + e)];
      }
    }
  }
  return project(w.wo, w.bo, ctx.data());
}

/// Streams `total` random tokens per item through `m` and a cache of options `o` (seed 0:
/// token by token; else random steps up to 2 max_chunk, which run in chunks) and checks every
/// output row against sink_reference(), the keys and values from the tokens (float rows) or
/// as the cache stores them (quantised rows: dequantize(), the ring's rows then the sinks').
/// Read after the step, the stored rows are those its tokens saw unless a later chunk of the
/// step overwrote them: quantised rows are checked after steps of at most max_chunk (the
/// longer ones give the same bits as token by token, see below). The capacity and bytes
/// never change. Returns the output (B, total, d).
template <class Scalar>
Tensor<Scalar, 3> check_sink_stream(const Config& c, const MultiHeadAttention<Scalar>& m,
                                    const KVCacheOptions& o, Index total, std::uint64_t seed) {
  SCOPED_TRACE(describe(c) + " S=" + std::to_string(o.sink_tokens) +
               " W=" + std::to_string(o.window) + " C=" + std::to_string(o.max_chunk) + " " +
               attn::kv_element_name(o.element) + " seed=" + std::to_string(seed));
  KVCache<Scalar> cache(o);
  const Index batch = o.batch, ring = cache.capacity() - o.sink_tokens;
  EXPECT_EQ(cache.capacity(), o.sink_tokens + o.window + o.max_chunk - 1);
  const std::size_t bytes = cache.bytes();
  const WideWeights w = attn::test::wide(m);
  const bool quantised = o.element != KVElement::kScalar;
  std::mt19937_64 rng(seed);
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{batch, total, c.d}, 77);
  Tensor<Scalar, 3> out({batch, total, c.d});
  attn::Workspace ws;
  // The reference reads the same keys (up to the kernel's tiles), so the incremental forward
  // is within its module_tolerance; a wrong position or key moves outputs by 1e-2 or more.
  const double tol = 2 * module_tolerance<Scalar>(c.d, c.head_dim, o.sink_tokens + o.window, c.d);
  for (Index len = 0; len < total;) {
    const Index t = std::min<Index>(
        total - len,
        seed == 0 ? 1 : Index(1 + rng() % static_cast<std::uint64_t>(2 * o.max_chunk)));
    m.forward(attn::slice(x.view(), 1, len, len + t), attn::slice(out.view(), 1, len, len + t), ws,
              cache);
    len += t;
    EXPECT_EQ(cache.bytes(), bytes);
    EXPECT_EQ(cache.capacity(), o.sink_tokens + o.window + o.max_chunk - 1);
    for (Index b = 0; b < (quantised && t > o.max_chunk ? 0 : batch); ++b) {
      const Scalar* rows = x.data() + b * total * c.d;
      Tensor<Scalar, 3> k_rows({c.kv_heads, cache.capacity(), c.head_dim});
      Tensor<Scalar, 3> v_rows({c.kv_heads, cache.capacity(), c.head_dim});
      cache.dequantize(b, k_rows.view(), v_rows.view());
      const auto kv = [&](Index j) {
        if (!quantised) {
          std::vector<Real> k = project(w.wk, w.bk, rows + j * c.d);
          const std::vector<Real> v = project(w.wv, w.bv, rows + j * c.d);
          k.insert(k.end(), v.begin(), v.end());
          return k;
        }
        const Index slot = j < o.sink_tokens ? ring + j : j % ring;
        std::vector<Real> r;
        for (const auto* from : {&k_rows, &v_rows}) {
          for (Index h = 0; h < c.kv_heads; ++h) {
            for (Index e = 0; e < c.head_dim; ++e) r.push_back((*from)(h, slot, e));
          }
        }
        return r;
      };
      for (Index i = 0; i < t; ++i) {
        const Index p = len - t + i;
        const std::vector<Real> expected =
            sink_reference(c, w, rows + p * c.d, p, o.sink_tokens, o.window, kv);
        const TensorView<const Real, 3> want(expected.data(), {1, 1, c.d});
        EXPECT_TRUE(ref::all_near(
            attn::slice(attn::slice(TensorView<const Scalar, 3>(out.view()), 0, b, b + 1), 1, p,
                        p + 1),
            want, tol))
            << "item " << b << " position " << p << " (step of " << t << ")";
      }
    }
  }
  return out;
}

KVCacheOptions sink_options(const Config& c, Index batch, Index sinks, Index window, Index chunk,
                            KVElement element = KVElement::kScalar) {
  KVCacheOptions o;
  o.batch = batch, o.num_kv_heads = c.kv_heads, o.head_dim = c.head_dim;
  o.window = window, o.max_chunk = chunk, o.sink_tokens = sinks, o.element = element;
  return o;
}

const std::vector<Config> kSinkConfigs = {
    {32, 4, 2, 8, 8, 0, RopeStyle::kHalfSplit, true},     // grouped-query, biases
    {32, 4, 1, 8, 4, 0, RopeStyle::kInterleaved, false},  // multi-query, partial rotary
    {16, 2, 1, 8, 0, 0, RopeStyle::kHalfSplit, false},    // no rotary embedding
};

TYPED_TEST(CachedForward, SinkCacheMatchesTheReferenceTokenByTokenAndInChunks) {
  for (const Config& c : kSinkConfigs) {
    // Rotary tables of S + W positions: the cache positions never reach further.
    const MultiHeadAttention<TypeParam> m = make_module<TypeParam>(c, 3 + 5);
    check_sink_stream(c, m, sink_options(c, 2, 3, 5, 1), 32, 0);
    check_sink_stream(c, m, sink_options(c, 2, 3, 5, 4), 32, 1);
    check_sink_stream(c, m, sink_options(c, 1, 1, 6, 3), 28, 2);
  }
}

// While every token is kept (the first S + W), the sink cache is the plain cache: the same
// rotations at the same positions, the same kernel over the same keys.
TYPED_TEST(CachedForward, SinkCacheGivesThePlainCachesBitsForTheFirstTokens) {
  using S = TypeParam;
  const Config& c = kSinkConfigs[0];
  const MultiHeadAttention<S> m = make_module<S>(c, 8);
  KVCache<S> sinks(sink_options(c, 2, 3, 5, 1)), plain(2, c.kv_heads, c.head_dim, 8);
  attn::Workspace ws;
  const auto x = attn::test::random_tensor<S>(Shape<3>{2, 8, c.d}, 4);
  Tensor<S, 3> a({2, 8, c.d}), b({2, 8, c.d});
  for (Index t = 0; t < 8; ++t) {
    m.forward(attn::slice(x.view(), 1, t, t + 1), attn::slice(a.view(), 1, t, t + 1), ws, sinks);
    m.forward(attn::slice(x.view(), 1, t, t + 1), attn::slice(b.view(), 1, t, t + 1), ws, plain);
  }
  EXPECT_TRUE(ref::same_bits(a.view(), b.view()));
}

// Quantised rows: stored once, un-rotated, and read back at every cache position they move
// through (never requantised). Token by token, in chunks and with 1 or 2 threads: the same
// bits (every token attends as if decoded alone).
TEST(CachedForwardSinks, QuantisedRowsMatchTheReferenceOverTheStoredValues) {
  const Config& c = kSinkConfigs[0];
  const MultiHeadAttention<float> m = make_module<float>(c, 8);
  for (const KVElement e : {KVElement::kInt8, KVElement::kInt4, KVElement::kFloat8E4M3,
                            KVElement::kBFloat16, KVElement::kFloat16}) {
    check_sink_stream(c, m, sink_options(c, 2, 3, 5, 4, e), 40, 3);
  }
  const int saved = attn::num_threads();
  const KVCacheOptions o = sink_options(c, 2, 3, 5, 4, KVElement::kInt8);
  attn::set_num_threads(1);
  const Tensor<float, 3> one_by_one = check_sink_stream(c, m, o, 24, 0);
  const Tensor<float, 3> chunks = check_sink_stream(c, m, o, 24, 5);
  attn::set_num_threads(2);
  const Tensor<float, 3> two_threads = check_sink_stream(c, m, o, 24, 6);
  attn::set_num_threads(saved);
  EXPECT_TRUE(ref::same_bits(chunks.view(), one_by_one.view()));
  EXPECT_TRUE(ref::same_bits(two_threads.view(), one_by_one.view()));
}

TEST(CachedForwardSinks, ErrorsNameTheValues) {
  const Config& c = kSinkConfigs[0];
  attn::Workspace ws;
  const auto x = attn::test::random_tensor<float>(Shape<3>{1, 2, c.d}, 1);
  Tensor<float, 3> out({1, 2, c.d});
  KVCache<float> cache(sink_options(c, 1, 3, 5, 2));
  // The rotary tables must cover the cache positions, 0 .. S + W - 1, and no more.
  const MultiHeadAttention<float> short_tables = make_module<float>(c, 7);
  for (Index step = 0; step < 3; ++step) short_tables.forward(x.view(), out.view(), ws, cache);
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>(
                  [&] { short_tables.forward(x.view(), out.view(), ws, cache); }),
              HasSubstr("outside the rotary tables [0, 7)"));
  EXPECT_EQ(cache.length(0), 6);
  Config windowed = c;
  windowed.window = 4;
  KVCache<float> fresh(sink_options(c, 1, 3, 5, 2));
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>([&] {
                make_module<float>(windowed, 8).forward(x.view(), out.view(), ws, fresh);
              }),
              AllOf(HasSubstr("sink_tokens=3"), HasSubstr("sliding_window=4")));
  Tensor<float, 4> q({1, c.heads, 1, c.head_dim}), o({1, c.heads, 1, c.head_dim});
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>(
                  [&] { attn::cached_attention<float>(q.view(), cache, o.view(), ws); }),
              HasSubstr("sink_tokens=3"));
  const MultiHeadAttention<float> m = make_module<float>(c, 8);
  KVCache<float> two(sink_options(c, 2, 3, 5, 2));
  const auto rows = attn::test::random_tensor<float, 2>({5, c.d}, 2);
  Tensor<float, 2> packed_out({5, c.d});
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>([&] {
                m.forward(rows.view(), rows.view(), rows.view(), attn::SequenceOffsets{0, 2, 5},
                          packed_out.view(), ws, two);
              }),
              HasSubstr("takes no packed batch"));
  EXPECT_TRUE(two.empty());
}

}  // namespace

}  // namespace cached_forward_test

#include "support/bodies_end.hpp"
