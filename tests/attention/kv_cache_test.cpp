// SPDX-License-Identifier: MIT
// tests/attention/kv_cache_test.cpp: KVCache: layout and memory, append (whole batch and
// item ranges, ragged lengths), in-place writes (next_rows, k_slot) then advance, views,
// overflow and shape errors, reset, truncate, reorder (every map for B = 3, random ones with
// repeats and cycles) and the sliding-window ring (wrap-around, segments, chunk limits);
// bfloat16 and float16 rows (the caches of modules of those types).
#include "attn/attention/kv_cache.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/scalar_types.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace kv_cache_test {

namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using attn::ConfigError;
using attn::Index;
using attn::KVCache;
using attn::KVCacheOptions;
using attn::KVSegments;
using attn::ShapeError;
using attn::Tensor;
using attn::TensorView;

// A reference model of one item: the key and value row of every position it has seen.
template <class Scalar>
struct History {
  std::vector<std::vector<Scalar>> k, v;  // [position * H_kv + h] -> hd values
};

// Appends `t_new` random tokens to items [first, first + items) of `cache` and `history`.
template <class Scalar>
void append_random(KVCache<Scalar>& cache, std::vector<History<Scalar>>& history, Index t_new,
                   std::uint64_t seed, Index first = 0, Index items = -1) {
  if (items < 0) items = cache.batch() - first;
  const Index h_kv = cache.num_kv_heads(), hd = cache.head_dim();
  const auto k = attn::test::random_tensor<Scalar, 4>({items, h_kv, t_new, hd}, seed);
  const auto v = attn::test::random_tensor<Scalar, 4>({items, h_kv, t_new, hd}, seed + 1);
  cache.append(k.view(), v.view(), first);
  for (Index i = 0; i < items; ++i) {
    for (Index t = 0; t < t_new; ++t) {
      for (Index h = 0; h < h_kv; ++h) {
        History<Scalar>& item = history[static_cast<std::size_t>(first + i)];
        item.k.push_back(attn::test::to_vector(
            attn::select(attn::select(attn::select(k.view(), 0, i), 0, h), 0, t)));
        item.v.push_back(attn::test::to_vector(
            attn::select(attn::select(attn::select(v.view(), 0, i), 0, h), 0, t)));
      }
    }
  }
}

// Every stored position of every item holds what was appended there, found through
// segments() (position order) and k_slot()/v_slot().
template <class Scalar>
void expect_contents(KVCache<Scalar>& cache, const std::vector<History<Scalar>>& history) {
  const Index h_kv = cache.num_kv_heads(), hd = cache.head_dim();
  for (Index b = 0; b < cache.batch(); ++b) {
    const History<Scalar>& item = history[static_cast<std::size_t>(b)];
    ASSERT_EQ(cache.length(b) * h_kv, static_cast<Index>(item.k.size())) << "item " << b;
    const KVSegments s = cache.segments(b);
    EXPECT_EQ(s.first_position, cache.first_position(b));
    EXPECT_EQ(s.count[0] + s.count[1], cache.stored(b));
    for (Index j = 0; j < cache.stored(b); ++j) {
      const Index position = s.first_position + j;
      const Index slot = j < s.count[0] ? s.slot[0] + j : s.slot[1] + j - s.count[0];
      EXPECT_EQ(slot, position % cache.capacity());
      for (Index h = 0; h < h_kv; ++h) {
        const auto& want_k = item.k[static_cast<std::size_t>(position * h_kv + h)];
        const auto& want_v = item.v[static_cast<std::size_t>(position * h_kv + h)];
        const Scalar* got_k = cache.k_slot(b, h, position);
        const Scalar* got_v = cache.v_slot(b, h, position);
        EXPECT_EQ(std::vector<Scalar>(got_k, got_k + hd), want_k)
            << b << " " << h << " " << position;
        EXPECT_EQ(std::vector<Scalar>(got_v, got_v + hd), want_v)
            << b << " " << h << " " << position;
        EXPECT_EQ(got_k, &cache.k_storage()(b, h, slot, 0));
        EXPECT_EQ(got_v, &cache.v_storage()(b, h, slot, 0));
      }
    }
  }
}

template <class Scalar>
class KVCacheTyped : public ::testing::Test {};
TYPED_TEST_SUITE(KVCacheTyped, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

TYPED_TEST(KVCacheTyped, RowsAreAlignedAndMemoryIsTheKeysAndValues) {
  using S = TypeParam;
  constexpr Index line = 64 / sizeof(S);
  for (const Index hd : {Index(1), Index(3), line - 2, line, Index(80), Index(120), Index(128)}) {
    KVCache<S> cache(3, 2, hd, 37);
    const bool padded = cache.row_stride() != hd;
    EXPECT_TRUE(cache.row_stride() == hd || cache.row_stride() % line == 0) << hd;
    EXPECT_LE(16 * (cache.row_stride() - hd), hd) << "padding over 1/16 of a row, hd " << hd;
    if (padded || hd % line == 0) {
      for (const Index p : {0, 1, 36}) {
        EXPECT_EQ(reinterpret_cast<std::uintptr_t>(cache.k_slot(2, 1, p)) % 64, 0u) << hd;
        EXPECT_EQ(reinterpret_cast<std::uintptr_t>(cache.v_slot(1, 0, p)) % 64, 0u) << hd;
      }
    }
    // Within 1/16 of the payload, plus one cache line per head block.
    EXPECT_LE(cache.bytes(), cache.payload_bytes() + cache.payload_bytes() / 16 + 2 * 3 * 2 * 64)
        << hd;
    EXPECT_EQ(cache.payload_bytes(), static_cast<std::size_t>(2 * 3 * 2 * 37 * hd) * sizeof(S));
  }
  // The Llama-3-8B decode shape (H_kv 8, hd 128): exactly the payload.
  const KVCache<S> llama(1, 8, 128, 1000);
  EXPECT_EQ(llama.bytes(), llama.payload_bytes());
}

TYPED_TEST(KVCacheTyped, AppendsInChunksAndViewsTheFilledPart) {
  using S = TypeParam;
  KVCache<S> cache(2, 3, 5, 12);
  std::vector<History<S>> history(2);
  append_random(cache, history, 5, 1);  // prefill
  append_random(cache, history, 1, 3);  // decode
  append_random(cache, history, 3, 5);  // chunk
  EXPECT_EQ(cache.length(0), 9);
  EXPECT_TRUE(cache.uniform());
  expect_contents(cache, history);
  const TensorView<const S, 4> k = cache.k();
  EXPECT_EQ(k.shape(), (attn::Shape<4>{2, 3, 9, 5}));
  for (Index b = 0; b < 2; ++b) {
    EXPECT_EQ(cache.k(b).shape(), (attn::Shape<3>{3, 9, 5}));
    EXPECT_EQ(attn::test::to_vector(cache.k(b)), attn::test::to_vector(attn::select(k, 0, b)));
    EXPECT_EQ(attn::test::to_vector(cache.v(b)),
              attn::test::to_vector(attn::select(cache.v(), 0, b)));
  }
  // Strided inputs: append a transposed view.
  const auto kt = attn::test::random_tensor<S, 4>({2, 5, 3, 2}, 9);  // (B, hd, H_kv, T)
  const auto vt = attn::test::random_tensor<S, 4>({2, 5, 3, 2}, 10);
  cache.append(attn::permute(kt.view(), {0, 2, 3, 1}), attn::permute(vt.view(), {0, 2, 3, 1}));
  EXPECT_EQ(cache.k(1)(2, 10, 4), kt(1, 4, 2, 1));
  EXPECT_EQ(cache.v(0)(0, 9, 3), vt(0, 3, 0, 0));
}

TYPED_TEST(KVCacheTyped, RaggedItemsAppendAtTheirOwnLengths) {
  using S = TypeParam;
  KVCache<S> cache(3, 2, 4, 10);
  std::vector<History<S>> history(3);
  append_random(cache, history, 4, 1);
  append_random(cache, history, 3, 3, /*first=*/1, /*items=*/1);
  append_random(cache, history, 1, 5, /*first=*/1, /*items=*/2);
  EXPECT_EQ(cache.length(0), 4);
  EXPECT_EQ(cache.length(1), 8);
  EXPECT_EQ(cache.length(2), 5);
  EXPECT_EQ(cache.lengths()[1], 8);
  EXPECT_FALSE(cache.uniform());
  expect_contents(cache, history);
  EXPECT_EQ(cache.k(1).extent(1), 8);
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { cache.k(); }),
              AllOf(HasSubstr("KVCache::k"), HasSubstr("(4, 8, 5)")));
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { cache.next_rows(1); }),
              HasSubstr("lengths differ"));
}

TYPED_TEST(KVCacheTyped, NextRowsAndSlotsWriteInPlaceThenAdvance) {
  using S = TypeParam;
  KVCache<S> by_append(2, 2, 6, 9), in_place(2, 2, 6, 9);
  std::vector<History<S>> history(2);
  append_random(by_append, history, 4, 1);
  append_random(by_append, history, 2, 3);
  // The same tokens written through next_rows() (keys: heads 0, 1; values: heads 2, 3).
  const TensorView<S, 4> rows = in_place.next_rows(4);
  EXPECT_EQ(rows.shape(), (attn::Shape<4>{2, 4, 4, 6}));
  for (Index b = 0; b < 2; ++b) {
    for (Index h = 0; h < 2; ++h) {
      for (Index p = 0; p < 4; ++p) {
        for (Index e = 0; e < 6; ++e) {
          rows(b, h, p, e) =
              history[static_cast<std::size_t>(b)]
                  .k[static_cast<std::size_t>(p * 2 + h)][static_cast<std::size_t>(e)];
          rows(b, 2 + h, p, e) =
              history[static_cast<std::size_t>(b)]
                  .v[static_cast<std::size_t>(p * 2 + h)][static_cast<std::size_t>(e)];
        }
      }
    }
  }
  in_place.advance(4);
  // Then two through k_slot()/v_slot(), one item at a time (ragged in between).
  for (Index b = 0; b < 2; ++b) {
    for (Index p = 4; p < 6; ++p) {
      for (Index h = 0; h < 2; ++h) {
        const auto& hk =
            history[static_cast<std::size_t>(b)].k[static_cast<std::size_t>(p * 2 + h)];
        const auto& hv =
            history[static_cast<std::size_t>(b)].v[static_cast<std::size_t>(p * 2 + h)];
        std::copy(hk.begin(), hk.end(), in_place.k_slot(b, h, p));
        std::copy(hv.begin(), hv.end(), in_place.v_slot(b, h, p));
      }
    }
    in_place.advance(2, b, 1);
  }
  expect_contents(in_place, history);
  EXPECT_EQ(attn::test::to_vector(in_place.k()), attn::test::to_vector(by_append.k()));
  EXPECT_EQ(attn::test::to_vector(in_place.v()), attn::test::to_vector(by_append.v()));
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { in_place.next_rows(4); }),
              AllOf(HasSubstr("capacity=9"), HasSubstr("T_new=4")));
}

TYPED_TEST(KVCacheTyped, OverflowAndWrongShapesAreClearErrorsAndWriteNothing) {
  using S = TypeParam;
  KVCache<S> cache(2, 2, 4, 8);
  std::vector<History<S>> history(2);
  append_random(cache, history, 6, 1);
  append_random(cache, history, 1, 3, 1, 1);
  const auto k3 = attn::test::random_tensor<S, 4>({2, 2, 2, 4}, 5);
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { cache.append(k3.view(), k3.view()); }),
              AllOf(HasSubstr("KVCache::append"), HasSubstr("item 1"), HasSubstr("length 7"),
                    HasSubstr("T_new=2"), HasSubstr("capacity=8")));
  EXPECT_EQ(cache.length(0), 6);  // item 0 had room, but nothing was written
  expect_contents(cache, history);
  const auto wrong_heads = attn::test::random_tensor<S, 4>({2, 3, 1, 4}, 6);
  EXPECT_THAT(
      attn::test::thrown<ShapeError>([&] { cache.append(wrong_heads.view(), wrong_heads.view()); }),
      AllOf(HasSubstr("(2, 3, 1, 4)"), HasSubstr("H_kv=2")));
  const auto one = attn::test::random_tensor<S, 4>({1, 2, 1, 4}, 7);
  const auto other = attn::test::random_tensor<S, 4>({1, 2, 1, 3}, 7);
  EXPECT_THAT(attn::test::thrown<ShapeError>([&] { cache.append(one.view(), other.view()); }),
              HasSubstr("(1, 2, 1, 3)"));
  EXPECT_THAT(attn::test::thrown<ShapeError>([&] { cache.append(one.view(), one.view(), 2); }),
              HasSubstr("items from 2"));
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { cache.advance(2, 1, 1); }),
              HasSubstr("capacity=8"));
  EXPECT_THAT(attn::test::thrown<ConfigError>([] { KVCache<S>(0, 2, 4, 8); }), HasSubstr("B=0"));
  EXPECT_THAT(attn::test::thrown<ConfigError>([] { KVCache<S>(1, 2, 4, 0); }),
              HasSubstr("capacity=0"));
  EXPECT_THAT(attn::test::thrown<ConfigError>([] {
                KVCache<S>(KVCacheOptions{1, 1, 4, 5, 4, 3});
              }),
              AllOf(HasSubstr("capacity=5"), HasSubstr("window=4"), HasSubstr("max_chunk=3")));
}

TYPED_TEST(KVCacheTyped, ResetAndTruncateRollBack) {
  using S = TypeParam;
  KVCache<S> cache(2, 1, 3, 10);
  std::vector<History<S>> history(2);
  append_random(cache, history, 7, 1);
  // Rejected speculative tokens: item 1 keeps 4 of its 7, then continues.
  cache.truncate(1, 4);
  History<S>& h1 = history[1];
  h1.k.resize(4);
  h1.v.resize(4);
  append_random(cache, history, 2, 3, 1, 1);
  EXPECT_EQ(cache.length(1), 6);
  expect_contents(cache, history);
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { cache.truncate(0, 8); }),
              AllOf(HasSubstr("keep 8"), HasSubstr("length 7")));
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { cache.truncate(0, -1); }),
              HasSubstr("keep -1"));
  EXPECT_THAT(attn::test::thrown<ShapeError>([&] { cache.truncate(2, 0); }), HasSubstr("item 2"));
  cache.reset();
  EXPECT_EQ(cache.length(0), 0);
  EXPECT_EQ(cache.length(1), 0);
  history.assign(2, {});
  append_random(cache, history, 10, 5);  // the whole capacity again
  expect_contents(cache, history);
}

// reorder(src) against the reference model, for a cache whose items have ragged lengths.
template <class S>
void check_reorder(const std::vector<Index>& src, std::uint64_t seed, Index window = 0) {
  const Index n = static_cast<Index>(src.size());
  KVCache<S> cache =
      window > 0 ? KVCache<S>::sliding_window(n, 2, 3, window, 2) : KVCache<S>(n, 2, 3, 16);
  std::vector<History<S>> history(static_cast<std::size_t>(n));
  for (Index b = 0; b < n; ++b) {
    for (Index c = 0; c < 1 + (b * 5 + static_cast<Index>(seed)) % 7; ++c) {
      append_random(cache, history, 2, seed * 100 + static_cast<std::uint64_t>(b * 10 + c), b, 1);
    }
  }
  std::vector<History<S>> expected(static_cast<std::size_t>(n));
  for (Index b = 0; b < n; ++b)
    expected[static_cast<std::size_t>(b)] =
        history[static_cast<std::size_t>(src[static_cast<std::size_t>(b)])];
  cache.reorder(src);
  std::string text;
  for (const Index s : src) text += std::to_string(s) + " ";
  SCOPED_TRACE("src = " + text);
  expect_contents(cache, expected);
  // The cache keeps working after a reorder.
  append_random(cache, expected, 1, seed + 7);
  expect_contents(cache, expected);
}

TYPED_TEST(KVCacheTyped, ReorderEveryMapOfThreeItems) {
  for (Index a = 0; a < 3; ++a) {
    for (Index b = 0; b < 3; ++b) {
      for (Index c = 0; c < 3; ++c)
        check_reorder<TypeParam>({a, b, c}, 1 + static_cast<std::uint64_t>(a * 9 + b * 3 + c));
    }
  }
}

TYPED_TEST(KVCacheTyped, ReorderRandomMapsWithCyclesAndRepeats) {
  std::mt19937_64 gen(42);
  for (int trial = 0; trial < 12; ++trial) {
    const Index n = 2 + trial % 6;
    std::vector<Index> src(static_cast<std::size_t>(n));
    for (Index b = 0; b < n; ++b) src[static_cast<std::size_t>(b)] = b;
    if (trial % 2 == 0) {
      std::shuffle(src.begin(), src.end(), gen);  // a permutation: cycles only
    } else {
      for (auto& s : src) s = static_cast<Index>(gen() % static_cast<std::uint64_t>(n));  // beams
    }
    check_reorder<TypeParam>(src, 100 + static_cast<std::uint64_t>(trial), trial % 3 == 0 ? 5 : 0);
  }
  check_reorder<TypeParam>({1, 2, 3, 4, 5, 0}, 7);  // one long cycle
  check_reorder<TypeParam>({1, 0, 3, 2, 2, 4}, 8);  // two swaps and a tail
  check_reorder<TypeParam>({3, 3, 3, 3}, 9);        // one beam survives
}

TEST(KVCache, ReorderRejectsBadMaps) {
  KVCache<float> cache(3, 1, 2, 4);
  EXPECT_THAT(attn::test::thrown<ShapeError>([&] {
                cache.reorder(std::vector<Index>{0, 1});
              }),
              AllOf(HasSubstr("src has 2 entries"), HasSubstr("B=3")));
  EXPECT_THAT(attn::test::thrown<attn::IndexError>([&] {
                cache.reorder(std::vector<Index>{0, 3, 1});
              }),
              HasSubstr("src[1]=3 is not a batch item (B=3)"));
  EXPECT_THAT(attn::test::thrown<attn::IndexError>([&] {
                cache.reorder(std::vector<Index>{0, -1, 1});
              }),
              HasSubstr("src[1]=-1"));
}

TYPED_TEST(KVCacheTyped, SlidingWindowRingWrapsAroundByPosition) {
  using S = TypeParam;
  // W = 4, chunks of up to 3: capacity 6 = W + C - 1.
  KVCache<S> cache = KVCache<S>::sliding_window(2, 2, 3, /*window=*/4, /*max_chunk=*/3);
  EXPECT_EQ(cache.capacity(), 6);
  EXPECT_EQ(cache.window(), 4);
  EXPECT_EQ(cache.max_chunk(), 3);
  std::vector<History<S>> history(2);
  const Index chunks[] = {3, 1, 2, 3, 1, 1, 3, 2, 3, 1, 3};
  Index position = 0;
  std::uint64_t seed = 1;
  for (const Index c : chunks) {
    append_random(cache, history, c, seed += 2);
    position += c;
    SCOPED_TRACE("after appending up to position " + std::to_string(position));
    EXPECT_EQ(cache.length(0), position);
    EXPECT_EQ(cache.first_position(0), std::max<Index>(0, position - 6));
    // The chunk's first query (position - c) still sees its whole window.
    EXPECT_LE(cache.first_position(0), std::max<Index>(0, position - c - 4 + 1));
    expect_contents(cache, history);
  }
  const KVSegments s = cache.segments(0);  // 23 tokens: positions 17..22 in slots 5, 0..4
  EXPECT_EQ(s.first_position, 17);
  EXPECT_EQ(s.slot[0], 5);
  EXPECT_EQ(s.count[0], 1);
  EXPECT_EQ(s.slot[1], 0);
  EXPECT_EQ(s.count[1], 5);
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { cache.k(); }), HasSubstr("first position 17"));
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { cache.next_rows(2); }),
              HasSubstr("ring wraps"));
  const auto four = attn::test::random_tensor<S, 4>({2, 2, 4, 3}, 3);
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { cache.append(four.view(), four.view()); }),
              AllOf(HasSubstr("T_new=4"), HasSubstr("max_chunk=3"), HasSubstr("in chunks")));
  // Truncate (positions 17..22 stored): keeping 20 tokens, the next query (position 20)
  // needs keys 17..19, still stored; keeping 19, it would need 16, already overwritten.
  cache.truncate(1, 20);
  EXPECT_THAT(
      attn::test::thrown<ConfigError>([&] { cache.truncate(0, 19); }),
      AllOf(HasSubstr("keep 19"), HasSubstr("first stored position 17"), HasSubstr("window 4")));
  History<S>& h1 = history[1];
  h1.k.resize(2 * 20);
  h1.v.resize(2 * 20);
  append_random(cache, history, 3, 99, 1, 1);
  expect_contents(cache, history);
}

TYPED_TEST(KVCacheTyped, SlidingWindowWithRoomBeforeWrappingViewsLikeALinearCache) {
  using S = TypeParam;
  KVCache<S> cache(KVCacheOptions{1, 1, 4, /*capacity=*/16, /*window=*/4, /*max_chunk=*/8});
  std::vector<History<S>> history(1);
  append_random(cache, history, 8, 1);
  append_random(cache, history, 8, 3);
  EXPECT_EQ(cache.k().shape(), (attn::Shape<4>{1, 1, 16, 4}));
  EXPECT_EQ(cache.next_rows(0).extent(2), 0);
  append_random(cache, history, 5, 5);
  EXPECT_EQ(cache.first_position(0), 5);
  expect_contents(cache, history);
}

// Sinks: the first S positions stay in rows of their own after the ring overwrote them
// (dequantize() shows the ring's rows, then the sinks'), move with their item and survive a
// roll-back.
TEST(KVCacheSinks, TheFirstTokensStayAndMoveWithTheirItem) {
  KVCacheOptions o;
  o.batch = 2, o.num_kv_heads = 2, o.head_dim = 4, o.window = 3, o.max_chunk = 2;
  o.sink_tokens = 2;
  KVCache<float> cache(o);
  ASSERT_EQ(cache.capacity(), 6);  // S + W + C - 1; the ring has 4 rows
  std::vector<History<float>> history(2);
  for (std::uint64_t step = 0; step < 10; ++step) append_random(cache, history, 2, 10 * step + 1);
  cache.reorder({1, 0});
  std::swap(history[0], history[1]);
  for (Index b = 0; b < 2; ++b) {
    EXPECT_EQ(cache.length(b), 20);
    EXPECT_EQ(cache.first_position(b), 16);
    Tensor<float, 3> k({2, 6, 4}), v({2, 6, 4});
    cache.dequantize(b, k.view(), v.view());
    const History<float>& item = history[static_cast<std::size_t>(b)];
    for (Index h = 0; h < 2; ++h) {
      for (const Index position : {0, 1, 16, 17, 18, 19}) {
        const Index slot = position < 2 ? 4 + position : position % 4;
        const std::size_t at = static_cast<std::size_t>(position * 2 + h);
        EXPECT_EQ(attn::test::to_vector(attn::select(attn::select(k.view(), 0, h), 0, slot)),
                  item.k[at])
            << b << " " << h << " " << position;
        EXPECT_EQ(attn::test::to_vector(attn::select(attn::select(v.view(), 0, h), 0, slot)),
                  item.v[at])
            << b << " " << h << " " << position;
      }
    }
  }
  // The token at position 20 sees the sinks and (17, 20]: 5 keys, positions 0, 1, 18, 19, 20.
  EXPECT_EQ(cache.visible_keys(20), 5);
  EXPECT_EQ(cache.visible_keys(3), 4);
  std::vector<Index> seen;
  for (Index i = 0; i < 5; ++i) seen.push_back(cache.visible_position(20, i));
  EXPECT_EQ(seen, (std::vector<Index>{0, 1, 18, 19, 20}));
  EXPECT_EQ(cache.visible_position(3, 2), 2);
  // Rolling back within the window keeps the sinks; the next tokens take the ring's rows.
  cache.truncate(0, 18);
  history[0].k.resize(2 * 18);
  history[0].v.resize(2 * 18);
  append_random(cache, history, 2, 99);
  Tensor<float, 3> k({2, 6, 4}), v({2, 6, 4});
  cache.dequantize(0, k.view(), v.view());
  for (const Index position : {0, 1, 18, 19}) {
    const Index slot = position < 2 ? 4 + position : position % 4;
    EXPECT_EQ(attn::test::to_vector(attn::select(attn::select(k.view(), 0, 1), 0, slot)),
              history[0].k[static_cast<std::size_t>(position * 2 + 1)])
        << position;
  }
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { cache.k_slot(0, 0, 20); }),
              AllOf(HasSubstr("sink_tokens=2"), HasSubstr("append()")));
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { cache.next_rows(1); }), HasSubstr("append()"));
}

// A cache of a 16-bit storage type (a bfloat16 or float16 module's) keeps rows of that type:
// 2 bytes per element, rows of 128 bytes (hd = 64) with no padding and 64-byte aligned;
// append() stores the values bit for bit and k(), dequantize(), reorder() and a ring give
// them back as with float rows. kv_element_of<S>() names the same rows; another element kind
// is refused, naming the type.
template <class S>
void check_sixteen_bit_rows() {
  KVCache<S> cache(3, 2, 64, 10);
  EXPECT_EQ(cache.row_stride(), 64);
  EXPECT_EQ(cache.bytes_per_token(), 2u * 2 * 64 * 2);
  EXPECT_EQ(cache.payload_bytes(), 3u * 10 * 2 * 2 * 64 * 2);
  EXPECT_EQ(cache.bytes(), cache.payload_bytes());
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(cache.v_slot(2, 1, 7)) % 64, 0u);
  const auto wide = attn::test::random_tensor<float, 4>({3, 2, 4, 64}, 21);
  Tensor<S, 4> k(wide.shape()), v(wide.shape());
  for (Index i = 0; i < wide.size(); ++i) {
    k.data()[i] = S(wide.data()[i]);
    v.data()[i] = S(-0.5f * wide.data()[i]);
  }
  cache.append(k.view(), v.view());
  cache.reorder({2, 0, 0});
  const Index from[3] = {2, 0, 0};
  for (Index b = 0; b < 3; ++b) {
    Tensor<S, 3> k_out({2, 4, 64}), v_out({2, 4, 64});
    cache.dequantize(b, k_out.view(), v_out.view());
    for (Index h = 0; h < 2; ++h) {
      for (Index t = 0; t < 4; ++t) {
        for (Index e = 0; e < 64; ++e) {
          ASSERT_EQ(cache.k(b)(h, t, e).bits(), k(from[b], h, t, e).bits()) << b << " " << t;
          ASSERT_EQ(k_out(h, t, e).bits(), k(from[b], h, t, e).bits()) << b << " " << t;
          ASSERT_EQ(v_out(h, t, e).bits(), v(from[b], h, t, e).bits()) << b << " " << t;
        }
      }
    }
  }
  // A ring of window 4 (capacity 4): position 5 in slot 1, over position 1.
  auto ring = KVCache<S>::sliding_window(1, 2, 64, 4);
  for (Index t = 0; t < 6; ++t) {
    const auto row = [&](const Tensor<S, 4>& x) {
      return attn::slice(attn::slice(attn::TensorView<const S, 4>(x.view()), 0, 0, 1), 2, t % 4,
                         t % 4 + 1);
    };
    ring.append(row(k), row(v));
  }
  EXPECT_EQ(ring.first_position(0), 2);
  EXPECT_EQ(ring.k_slot(0, 0, 5)[3].bits(), k(0, 0, 1, 3).bits());
  EXPECT_EQ(ring.k_slot(0, 0, 5), ring.k_slot(0, 0, 1));

  const std::string name = attn::element_name<S>();
  KVCacheOptions o{1, 2, 64, 10};
  o.element = attn::kv_element_of<S>();
  EXPECT_EQ(KVCache<S>(o).element(), attn::KVElement::kScalar);
  for (const attn::KVElement e : {attn::KVElement::kInt8, attn::KVElement::kFloat8E4M3,
                                  std::is_same_v<S, attn::float16> ? attn::KVElement::kBFloat16
                                                                   : attn::KVElement::kFloat16}) {
    o.element = e;
    EXPECT_THAT(attn::test::thrown<ConfigError>([&] { const KVCache<S> refused(o); }),
                HasSubstr("a " + name + " cache stores " + name + " rows"))
        << attn::kv_element_name(e);
  }
}

TEST(KVCache16Bit, Bfloat16RowsAreTheModulesOwn) { check_sixteen_bit_rows<attn::bfloat16>(); }
TEST(KVCache16Bit, Float16RowsAreTheModulesOwn) { check_sixteen_bit_rows<attn::float16>(); }

}  // namespace

}  // namespace kv_cache_test

#include "support/bodies_end.hpp"
