// SPDX-License-Identifier: MIT
// tests/attention/cached_forward_test.cpp: the incremental forward (attn/attention/
// cached_forward.hpp) against the whole-sequence forward of the same module, over many random
// splits of each sequence into a prefill, chunks and single tokens, with ragged batches (an
// item truncated, as after rejected speculative tokens, then decoding on), grouped-query and
// multi-query heads, sliding windows (the cache a ring), both RoPE conventions, partial
// rotary, and biases on and off. Also: the same bits for 1 and 2 threads, the errors, and the
// modules built on one core (CausalAttention) running it too.
//
// Tolerance: 2 module_tolerance (module_test_support.hpp): the whole-sequence forward and the
// incremental one are each within module_tolerance of the exact result (the same projections;
// the kernel's tiles and key chunks differ, so its rounding does), so they are within twice
// that of each other. A wrong position, mask bound or cache row moves outputs by 1e-2 or more.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attention/module_test_support.hpp"
#include "attention/reference_attention.hpp"
#include "attn/attn.hpp"
#include "support/test_support.hpp"

namespace cached_forward_test {

namespace {

using attn::Index;
using attn::KVCache;
using attn::MultiHeadAttention;
using attn::MultiHeadAttentionOptions;
using attn::RopeStyle;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
using attn::test::module_tolerance;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
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
  EXPECT_THAT([&] { wrapper.forward(x.view(), out.view(), ws, cache); },
              ThrowsMessage<attn::ConfigError>(HasSubstr("use MultiHeadAttention")));
  EXPECT_THAT([&] { simple.forward(x.view(), out.view(), ws, cache); },
              ThrowsMessage<attn::ConfigError>(HasSubstr("no projections")));
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
  EXPECT_THAT([&] { m.forward(x.view(), out.view(), ws, cache); },
              ThrowsMessage<attn::ConfigError>(HasSubstr("exceed the cache's capacity=6")));
  EXPECT_EQ(cache.length(0), 4);
  KVCache<S> wrong_heads(1, 4, 8, 6);
  EXPECT_THAT([&] { m.forward(x.view(), out.view(), ws, wrong_heads); },
              ThrowsMessage<attn::ShapeError>(HasSubstr("H_kv=4")));
  KVCache<S> ring = KVCache<S>::sliding_window(1, 2, 8, 4, 4);
  EXPECT_THAT([&] { m.forward(x.view(), out.view(), ws, ring); },
              ThrowsMessage<attn::ConfigError>(HasSubstr("sliding_window is 0")));
  KVCache<S> big(1, 2, 8, 64);
  const auto longer = attn::test::random_tensor<S>(Shape<3>{1, 12, 32}, 2);
  Tensor<S, 3> longer_out({1, 12, 32});
  EXPECT_THAT([&] { m.forward(longer.view(), longer_out.view(), ws, big); },
              ThrowsMessage<attn::ConfigError>(HasSubstr("outside the rotary tables [0, 10)")));
  EXPECT_EQ(big.length(0), 0);
  attn::AttentionMask<S> mask;
  mask.causal();
  EXPECT_THAT([&] { m.forward(x.view(), out.view(), ws, big, mask); },
              ThrowsMessage<attn::ConfigError>(HasSubstr("takes no mask")));
  const auto other = attn::test::random_tensor<S>(Shape<3>{1, 4, 32}, 3);
  EXPECT_THAT([&] { m.forward(x.view(), other.view(), other.view(), out.view(), ws, big); },
              ThrowsMessage<attn::ConfigError>(HasSubstr("self-attention")));
}

}  // namespace

}  // namespace cached_forward_test
