// SPDX-License-Identifier: MIT
// tests/attention/kv_cache_contract_test.cpp: what KVCache and the incremental forward
// promise about the indices, sizes and modules they are given:
//  - every item index and item range is checked (advance() once took any range: a negative
//    or too large item read and wrote past the per-item lengths, end_[-1] on a ring);
//  - the configuration's size arithmetic cannot overflow (window + max_chunk - 1 once
//    wrapped to a negative capacity, a 0-byte buffer and a store through null);
//  - a negative token count says so (advance(-1) once said "more tokens than the capacity");
//  - the incremental forward is causal, so a module that is not is refused (its
//    whole-sequence forward lets every token see later ones: the two once differed by 0.34,
//    silently);
//  - a cache holding one module's keys refuses another module (or the same module replaced
//    in place) until reset().
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "attn/attn.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace kv_cache_contract_test {

namespace {

using attn::ConfigError;
using attn::Index;
using attn::KVCache;
using attn::KVCacheOptions;
using attn::Shape;
using attn::ShapeError;
using attn::Tensor;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr Index kMax = std::numeric_limits<Index>::max();

TEST(KVCacheContract, AdvanceChecksItsItemRange) {
  KVCache<float> cache(2, 1, 4, 8);
  KVCache<float> ring = KVCache<float>::sliding_window(2, 1, 4, 3, 2);
  for (KVCache<float>* c : {&cache, &ring}) {
    EXPECT_THAT(attn::test::thrown<ShapeError>([&] { c->advance(1, -1, 1); }),
                AllOf(HasSubstr("KVCache::advance"), HasSubstr("B=2")));
    EXPECT_THAT(attn::test::thrown<ShapeError>([&] { c->advance(1, 2, 1); }), HasSubstr("[2, 3)"));
    EXPECT_THAT(attn::test::thrown<ShapeError>([&] { c->advance(1, 0, 3); }), HasSubstr("[0, 3)"));
    EXPECT_THAT(attn::test::thrown<ShapeError>([&] { c->advance(1, 3); }), HasSubstr("B=2"));
    EXPECT_THAT(attn::test::thrown<ShapeError>([&] { c->advance(1, 1, kMax); }), HasSubstr("B=2"));
    EXPECT_EQ(c->length(0), 0);
    EXPECT_EQ(c->length(1), 0);
    c->advance(1, 1, 1);  // item 1 only
    EXPECT_EQ(c->length(0), 0);
    EXPECT_EQ(c->length(1), 1);
    c->advance(1, 1);  // items 1.. (to the last)
    EXPECT_EQ(c->length(1), 2);
  }
}

TEST(KVCacheContract, NegativeTokenCountsSaySo) {
  KVCache<float> cache(1, 1, 4, 8);
  KVCache<float> ring = KVCache<float>::sliding_window(1, 1, 4, 3, 2);
  for (KVCache<float>* c : {&cache, &ring}) {
    EXPECT_THAT(attn::test::thrown<ConfigError>([&] { c->advance(-1); }),
                AllOf(HasSubstr("T_new=-1"), HasSubstr("negative")));
    EXPECT_THAT(attn::test::thrown<ConfigError>([&] { c->next_rows(-1); }),
                AllOf(HasSubstr("T_new=-1"), HasSubstr("negative")));
  }
}

TEST(KVCacheContract, SizeArithmeticDoesNotOverflow) {
  const Index huge = kMax / 2 + 2;
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] {
                KVCache<float>(KVCacheOptions{1, 1, 4, 0, huge, huge});
              }),
              AllOf(HasSubstr("window=" + std::to_string(huge)),
                    HasSubstr("max_chunk=" + std::to_string(huge))));
  EXPECT_THROW(KVCache<float>(KVCacheOptions{1, 1, 4, kMax, kMax, kMax}), ConfigError);
  EXPECT_THROW(KVCache<float>(KVCacheOptions{1, kMax, 4, 8, 0, 1}), ConfigError);
  EXPECT_THROW(KVCache<float>(KVCacheOptions{kMax, 1, kMax, 8, 0, 1}), ConfigError);
  EXPECT_THROW(KVCache<float>(KVCacheOptions{1, 1, kMax - 3, 8, 0, 1}), ConfigError);
  EXPECT_THROW(KVCache<float>::sliding_window(1, 1, 4, kMax, 1), ConfigError);
}

TEST(KVCacheContract, SinkTokensNeedAWindowAndRoom) {
  KVCacheOptions o;
  o.head_dim = 4, o.capacity = 8, o.sink_tokens = 2;
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { KVCache<float>{o}; }),
              AllOf(HasSubstr("sink_tokens=2"), HasSubstr("window")));
  o.window = 4, o.max_chunk = 2, o.capacity = 6;
  EXPECT_THAT(
      attn::test::thrown<ConfigError>([&] { KVCache<float>{o}; }),
      AllOf(HasSubstr("capacity=6"), HasSubstr("sink_tokens + window + max_chunk - 1 = 7")));
  o.sink_tokens = -1;
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { KVCache<float>{o}; }),
              HasSubstr("sink_tokens=-1"));
  o.sink_tokens = kMax, o.capacity = 0;
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { KVCache<float>{o}; }),
              HasSubstr("sink_tokens + window + max_chunk - 1 overflows"));
  o.sink_tokens = 2;
  EXPECT_EQ(KVCache<float>(o).capacity(), 7);  // 0: the least
}

TEST(KVCacheContract, ItemAccessorsCheckTheirIndex) {
  KVCache<float> cache(2, 2, 4, 8);
  EXPECT_THROW((void)cache.length(2), attn::IndexError);
  EXPECT_THROW((void)cache.length(-1), attn::IndexError);
  EXPECT_THROW((void)cache.first_position(2), attn::IndexError);
  EXPECT_THROW((void)cache.stored(-1), attn::IndexError);
  EXPECT_THROW((void)cache.segments(5), attn::IndexError);
  EXPECT_THROW((void)cache.k_slot(2, 0, 0), attn::IndexError);
  EXPECT_THROW((void)cache.k_slot(0, 2, 0), attn::IndexError);
  EXPECT_THROW((void)cache.v_slot(0, -1, 0), attn::IndexError);
  EXPECT_THROW((void)cache.v_slot(0, 0, 8), attn::IndexError);   // past capacity
  EXPECT_THROW((void)cache.k_slot(0, 0, -1), attn::IndexError);  // before position 0
  EXPECT_EQ(cache.k_slot(1, 1, 7) - cache.k_slot(1, 1, 0), 7 * cache.row_stride());
  // A ring takes any position it still holds or is about to write: slot position % capacity.
  KVCache<float> ring = KVCache<float>::sliding_window(1, 1, 4, 3, 2);  // capacity 4
  EXPECT_EQ(ring.k_slot(0, 0, 9), ring.k_slot(0, 0, 1));
  EXPECT_THROW((void)ring.k_slot(0, 0, -1), attn::IndexError);
}

// ---- the incremental forward ----

attn::MultiHeadAttentionOptions module_options(bool causal) {
  attn::MultiHeadAttentionOptions o;
  o.d_in = 8;
  o.num_heads = 2;
  o.causal = causal;
  return o;
}

TEST(KVCacheContract, AModuleThatIsNotCausalIsRefused) {
  attn::TorchGenerator gen(1);
  const attn::MultiHeadAttention<double> m(module_options(false), gen);
  KVCache<double> cache(1, 2, 4, 16);
  attn::Workspace ws;
  const auto x = attn::test::random_tensor<double>(Shape<3>{1, 5, 8}, 2);
  Tensor<double, 3> out({1, 5, 8});
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { m.forward(x.view(), out.view(), ws, cache); }),
              AllOf(HasSubstr("MultiHeadAttention::forward"), HasSubstr("causal=false")));
  EXPECT_EQ(cache.length(0), 0);
}

TEST(KVCacheContract, ACacheHoldsOneModulesKeysUntilReset) {
  attn::TorchGenerator gen(2);
  attn::MultiHeadAttention<double> a(module_options(true), gen);
  const attn::MultiHeadAttention<double> b(module_options(true), gen);
  KVCache<double> cache(1, 2, 4, 16);
  attn::Workspace ws;
  const auto x = attn::test::random_tensor<double>(Shape<3>{1, 3, 8}, 3);
  Tensor<double, 3> out({1, 3, 8});
  a.forward(x.view(), out.view(), ws, cache);
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { b.forward(x.view(), out.view(), ws, cache); }),
              AllOf(HasSubstr("another module"), HasSubstr("reset")));
  EXPECT_EQ(cache.length(0), 3);
  a.forward(x.view(), out.view(), ws, cache);  // its own cache: fine
  EXPECT_EQ(cache.length(0), 6);
  // Replaced in place: the same address, another module.
  a = attn::MultiHeadAttention<double>(module_options(true), gen);
  EXPECT_THROW(a.forward(x.view(), out.view(), ws, cache), ConfigError);
  cache.reset();
  EXPECT_NO_THROW(b.forward(x.view(), out.view(), ws, cache));
  // Truncated to nothing, a cache is free again.
  cache.truncate(0, 0);
  EXPECT_NO_THROW(a.forward(x.view(), out.view(), ws, cache));
}

}  // namespace

}  // namespace kv_cache_contract_test

#include "support/bodies_end.hpp"
