// SPDX-License-Identifier: MIT
// tests/attention/paged_kv_cache_test.cpp: PagedKVCache: the block pool's bookkeeping
// (tables, reference counts, copy on write, freeing and truncating; where blocks are placed:
// each sequence's in runs, or scattered through a fragmented pool), the strong guarantee
// when the pool is exhausted, and attention through the block tables against a contiguous
// KVCache holding the same tokens: the same bits (every element kind, every kernel set, 1
// and 2 threads, decode and prefill, windows, GQA, float and double; blocks in runs and
// scattered); the modules' incremental forward on a ragged batch of sequences against the
// same forward over a KVCache; a windowed stream's blocks released behind the window
// (bounded, forks keeping theirs); the packed prefill against prefilling each sequence
// alone. The same for the caches of bfloat16 and float16 modules (PagedKVCache<bfloat16>,
// <float16>: rows of that type, the same bits as a KVCache of that type, on every set and
// bfloat16 path).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention/reference_attention.hpp"
#include "attn/attention/paged_forward.hpp"
#include "attn/attn.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace paged_kv_cache_test {

namespace {

using attn::bfloat16;
using attn::float16;
using attn::Index;
using attn::KVCache;
using attn::KVCacheOptions;
using attn::KVElement;
using attn::PagedKVCache;
using attn::PagedKVCacheOptions;
using attn::Tensor;
using ::testing::HasSubstr;
namespace ref = attn::test::ref;

struct Kind {
  KVElement element;
  Index int4_group;
  const char* name;
};
const std::vector<Kind> kKinds = {
    {KVElement::kScalar, 32, "f32"},         {KVElement::kInt8, 32, "int8"},
    {KVElement::kInt4, 32, "int4/32"},       {KVElement::kFloat8E4M3, 32, "fp8e4m3"},
    {KVElement::kFloat8E5M2, 32, "fp8e5m2"}, {KVElement::kBFloat16, 32, "bf16"},
    {KVElement::kFloat16, 32, "fp16"},
};

PagedKVCacheOptions paged_options(const Kind& kind, Index blocks, Index block_size, Index kv_heads,
                                  Index hd) {
  PagedKVCacheOptions o;
  o.num_blocks = blocks, o.block_size = block_size, o.num_kv_heads = kv_heads, o.head_dim = hd;
  o.element = kind.element, o.int4_group = kind.int4_group;
  return o;
}

// Sequence s's rows as float: [keys..., values...].
template <class E>
std::vector<float> rows_of(const PagedKVCache<E>& cache, Index s) {
  const Index n = cache.length(s), heads = cache.num_kv_heads();
  Tensor<E, 3> k({heads, n, cache.head_dim()}), v({heads, n, cache.value_head_dim()});
  cache.dequantize(s, k.view(), v.view());
  std::vector<float> out(k.data(), k.data() + k.size());
  out.insert(out.end(), v.data(), v.data() + v.size());
  return out;
}

// Uniform values in [-1, 1) rounded to E (float: as drawn).
template <class E, std::size_t Rank>
Tensor<E, Rank> random(const attn::Shape<Rank>& shape, std::uint64_t seed) {
  const auto f = attn::test::random_tensor<float, Rank>(shape, seed);
  Tensor<E, Rank> t(shape);
  for (Index i = 0; i < t.size(); ++i) t.data()[i] = E(f.data()[i]);
  return t;
}

// Appends the same `t` random tokens to each listed paged sequence and contiguous item.
template <class E>
void append_to(PagedKVCache<E>& paged, const std::vector<Index>& seqs,
               std::enable_if_t<true, KVCache<E>>* flat, const std::vector<Index>& items, Index t,
               std::uint64_t seed) {
  const Index heads = paged.num_kv_heads(), hd = paged.head_dim();
  const auto k = random<E, 4>({1, heads, t, hd}, seed);
  const auto v = random<E, 4>({1, heads, t, hd}, seed + 1);
  for (const Index s : seqs) {
    paged.append(s, attn::select(k.view(), 0, 0), attn::select(v.view(), 0, 0));
  }
  for (const Index b : items) {
    if (flat != nullptr) flat->append(k.view(), v.view(), b);
  }
}

// Fragments the pool of an empty cache: every block taken by a sequence of one block, then
// the sequences on even blocks freed. Every free block then lies between held ones, so no
// two blocks a sequence takes are neighbours (the tables of a pool fragmented by others).
template <class E>
void fragment(PagedKVCache<E>& paged) {
  const Index hd = paged.head_dim(), hd_v = paged.value_head_dim();
  const Tensor<E, 3> k({paged.num_kv_heads(), paged.block_size(), hd}),
      v({paged.num_kv_heads(), paged.block_size(), hd_v});
  std::vector<Index> fillers;
  for (Index n = 0; n < paged.num_blocks(); ++n) {
    fillers.push_back(paged.add_sequence());
    paged.append(fillers.back(), k.view(), v.view());
  }
  for (const Index f : fillers) {
    if (paged.block_table(f)[0] % 2 == 0) paged.free_sequence(f);
  }
}

// Runs of neighbouring blocks in a table (one per entry that does not follow the one before).
Index runs_of(const std::vector<Index>& table) {
  Index count = 0;
  for (std::size_t i = 0; i < table.size(); ++i) {
    count += i == 0 || table[i] != table[i - 1] + 1 ? 1 : 0;
  }
  return count;
}

// Whether any two consecutive entries of the table are neighbouring blocks.
bool has_neighbours(const std::vector<Index>& table) {
  return runs_of(table) < static_cast<Index>(table.size());
}

TEST(PagedKVCache, SequencesGrowingSideBySideKeepTheirBlocksInRuns) {
  // Four sequences of a pool of 64 blocks of 4 tokens take a block each in turn: each starts
  // in the middle of the longest free run and grows into the blocks after its own, so each
  // table is one run, also when the pool is full.
  PagedKVCache<float> cache(paged_options(kKinds[0], 64, 4, 1, 8));
  std::vector<Index> seqs;
  for (int i = 0; i < 4; ++i) seqs.push_back(cache.add_sequence());
  const auto run = [](Index first, Index n) {
    std::vector<Index> out;
    for (Index i = 0; i < n; ++i) out.push_back(first + i);
    return out;
  };
  for (Index round = 1; round <= 16; ++round) {
    for (const Index s : seqs) append_to(cache, {s}, nullptr, {}, 4, 1 + round);
    if (round == 12) {  // (0, 32, 16, 48: the middles of the longest runs, in turn)
      EXPECT_EQ(cache.block_table(seqs[0]), run(0, 12));
      EXPECT_EQ(cache.block_table(seqs[1]), run(32, 12));
      EXPECT_EQ(cache.block_table(seqs[2]), run(16, 12));
      EXPECT_EQ(cache.block_table(seqs[3]), run(48, 12));
    }
  }
  EXPECT_EQ(cache.free_blocks(), 0);
  EXPECT_EQ(cache.runs(), 4);
  EXPECT_EQ(cache.block_table(seqs[0]), run(0, 16));
  EXPECT_EQ(cache.block_table(seqs[1]), run(32, 16));
  EXPECT_EQ(cache.block_table(seqs[2]), run(16, 16));
  EXPECT_EQ(cache.block_table(seqs[3]), run(48, 16));
  // Blocks given back are taken again: freed runs first whole, then one block at a time.
  cache.free_sequence(seqs[2]);
  cache.truncate(seqs[0], 40);  // blocks 10..15 back
  EXPECT_EQ(cache.free_blocks(), 22);
  const Index e = cache.add_sequence();
  append_to(cache, {e}, nullptr, {}, 8, 5);  // in the middle of 10..31
  EXPECT_EQ(cache.block_table(e), run(21, 2));
  append_to(cache, {seqs[0]}, nullptr, {}, 8, 6);  // after its block 9
  EXPECT_EQ(cache.block_table(seqs[0]), run(0, 12));
  EXPECT_EQ(cache.runs(), 4);
  cache.release_before(seqs[0], 8);  // blocks 0 and 1 back: its run now starts at block 2
  EXPECT_EQ(cache.runs(), 4);

  // A fragmented pool: no two free blocks are neighbours, so every block starts a run of its
  // own; everything else (counts, exhaustion) as before.
  PagedKVCache<float> worn(paged_options(kKinds[0], 16, 4, 1, 8));
  fragment(worn);
  EXPECT_EQ(worn.free_blocks(), 8);
  const Index a = worn.add_sequence(), b = worn.add_sequence();
  for (int round = 0; round < 4; ++round) {
    append_to(worn, {a}, nullptr, {}, 4, 7);
    append_to(worn, {b}, nullptr, {}, 4, 8);
  }
  EXPECT_EQ(worn.free_blocks(), 0);
  EXPECT_FALSE(has_neighbours(worn.block_table(a)));
  EXPECT_FALSE(has_neighbours(worn.block_table(b)));
  EXPECT_THROW(append_to(worn, {a}, nullptr, {}, 1, 9), attn::ConfigError);
}

TEST(PagedKVCache, CompactingAFragmentedPoolPutsEachSequenceInOneRunAndChangesNoResult) {
  // A fragmented pool (every other block held by a sequence of one block, half of those freed
  // again), two sequences appended side by side, a fork sharing one of them with its last
  // block copied on write: compact() leaves every unshared sequence one run (the shared
  // blocks one run, each holder's own last block after it or elsewhere), the same rows,
  // reference counts, free blocks and attention bits, and appends go on after it. Float and
  // int4 rows (scales moved too).
  for (const Kind& kind : {kKinds[0], kKinds[2]}) {
    SCOPED_TRACE(kind.name);
    PagedKVCache<float> paged(paged_options(kind, 64, 4, 2, 40));
    fragment(paged);
    for (Index s = 0, k = 0; s < 64; ++s) {  // every other remaining filler freed
      if (paged.contains(s) && k++ % 2 == 0) paged.free_sequence(s);
    }
    const Index a = paged.add_sequence(), b = paged.add_sequence();
    for (int round = 0; round < 5; ++round) {
      append_to(paged, {a}, nullptr, {}, 4, 11 + round);
      append_to(paged, {b}, nullptr, {}, 3, 21 + round);
    }
    const Index f = paged.fork(a);
    append_to(paged, {f}, nullptr, {}, 2, 31);
    append_to(paged, {a}, nullptr, {}, 2, 33);  // (a's last block is a's own again: no copy)
    const std::vector<Index> seqs = {a, b, f};
    const Index runs = paged.runs(), free_before = paged.free_blocks();
    std::vector<std::vector<float>> rows;
    for (const Index s : seqs) rows.push_back(rows_of(paged, s));
    const Index shared_refs = paged.ref_count(paged.block_table(f)[0]);
    const auto q = attn::test::random_tensor<float, 4>({3, 4, 1, 40}, 41);
    Tensor<float, 4> before({3, 4, 1, 40}), after({3, 4, 1, 40});
    attn::Workspace ws;
    attn::paged_attention(q.view(), paged, seqs, before.view(), ws);

    paged.compact();
    EXPECT_EQ(paged.free_blocks(), free_before);
    EXPECT_LT(paged.runs(), runs);
    // b one run; a and its fork: the shared blocks one run, each one's own last block after
    // it or elsewhere (whichever of the two comes first in id order keeps its blocks together).
    EXPECT_EQ(runs_of(paged.block_table(b)), 1);
    EXPECT_LE(runs_of(paged.block_table(a)), 2);
    EXPECT_LE(runs_of(paged.block_table(f)), 2);
    EXPECT_EQ(runs_of(paged.block_table(a)) + runs_of(paged.block_table(f)), 3);
    const std::vector<Index>& ft = paged.block_table(f);
    for (std::size_t i = 0; i + 1 < ft.size(); ++i) EXPECT_EQ(ft[i], paged.block_table(a)[i]);
    EXPECT_EQ(paged.ref_count(ft[0]), shared_refs);
    for (std::size_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(rows_of(paged, seqs[i]), rows[i]);
    attn::paged_attention(q.view(), paged, seqs, after.view(), ws);
    EXPECT_TRUE(ref::same_bits(after.view(), before.view()));
    // Every block is held or free exactly once (the blocks of all tables, and the free ones),
    // after compacting and after appending into the compacted pool.
    const auto check_holders = [&] {
      std::vector<Index> holders(64, 0);
      for (Index s = 0; s < 64; ++s) {
        if (!paged.contains(s)) continue;
        for (const Index n : paged.block_table(s)) ++holders[static_cast<std::size_t>(n)];
      }
      Index free = 0;
      for (Index n = 0; n < 64; ++n) {
        EXPECT_EQ(holders[static_cast<std::size_t>(n)], paged.ref_count(n)) << "block " << n;
        free += paged.ref_count(n) == 0 ? 1 : 0;
      }
      EXPECT_EQ(free, paged.free_blocks());
    };
    check_holders();
    append_to(paged, {a}, nullptr, {}, 8, 35);
    append_to(paged, {b}, nullptr, {}, 8, 37);
    EXPECT_EQ(paged.length(a), 30);
    check_holders();
    EXPECT_EQ(rows_of(paged, f), rows[2]);  // (the fork's rows untouched by the appends)
  }
}

TEST(PagedKVCache, BlockTablesReferenceCountsAndCopyOnWrite) {
  PagedKVCache<float> cache(paged_options(kKinds[1], 8, 4, 2, 8));
  EXPECT_EQ(cache.free_blocks(), 8);
  const Index a = cache.add_sequence();
  append_to(cache, {a}, nullptr, {}, 6, 1);
  EXPECT_EQ(cache.length(a), 6);
  EXPECT_EQ(cache.block_table(a), (std::vector<Index>{0, 1}));
  EXPECT_EQ(cache.free_blocks(), 6);
  const std::vector<float> a_rows = rows_of(cache, a);

  // A fork shares every block; writing into its partly filled last block copies it first.
  const Index b = cache.fork(a);
  EXPECT_NE(a, b);
  EXPECT_EQ(cache.free_blocks(), 6);
  EXPECT_EQ(cache.ref_count(0), 2);
  EXPECT_EQ(cache.ref_count(1), 2);
  EXPECT_EQ(cache.blocks_needed(b, 1), 1);  // the copy
  EXPECT_EQ(cache.blocks_needed(b, 3), 2);  // the copy and one new block
  append_to(cache, {b}, nullptr, {}, 1, 3);
  EXPECT_EQ(cache.free_blocks(), 5);
  EXPECT_EQ(cache.block_table(a), (std::vector<Index>{0, 1}));
  // (The copy follows b's block 0 when it can; block 1 is a's, so it goes to the middle of
  // the longest run of free blocks, 2..7.)
  EXPECT_EQ(cache.block_table(b), (std::vector<Index>{0, 5}));
  EXPECT_EQ(cache.ref_count(0), 2);
  EXPECT_EQ(cache.ref_count(1), 1);
  EXPECT_EQ(rows_of(cache, a), a_rows);  // the parent's rows untouched
  const std::vector<float> b_rows = rows_of(cache, b);
  for (Index part = 0; part < 2; ++part) {  // the child: the parent's 6 tokens, then its own
    for (Index h = 0; h < 2; ++h) {
      for (Index p = 0; p < 6; ++p) {
        for (Index e = 0; e < 8; ++e) {
          ASSERT_EQ(b_rows[static_cast<std::size_t>(((part * 2 + h) * 7 + p) * 8 + e)],
                    a_rows[static_cast<std::size_t>(((part * 2 + h) * 6 + p) * 8 + e)]);
        }
      }
    }
  }
  // Now the parent's last block is its own: written in place.
  append_to(cache, {a}, nullptr, {}, 2, 5);
  EXPECT_EQ(cache.block_table(a), (std::vector<Index>{0, 1}));
  EXPECT_EQ(cache.free_blocks(), 5);
  // Two sequences sharing a partly filled block, both appending: one copy (the last writer
  // keeps the block).
  const Index c = cache.fork(b), d = cache.fork(b);
  const std::vector<Index> batch = {b, c, d};
  EXPECT_EQ(cache.needed("test", batch.data(), 3, 1), 2);
  EXPECT_EQ(cache.needed("test", batch.data(), 2, 1), 2);
  EXPECT_THROW(cache.needed("test", std::vector<Index>{b, b}.data(), 2, 1), attn::ConfigError);

  // Freeing gives back the blocks no one else holds; ids are reused; truncate frees blocks.
  cache.free_sequence(c);
  cache.free_sequence(d);
  EXPECT_FALSE(cache.contains(c));
  EXPECT_THROW(cache.length(c), attn::IndexError);
  EXPECT_EQ(cache.free_blocks(), 5);
  cache.free_sequence(a);
  EXPECT_EQ(cache.free_blocks(), 6);  // block 1; block 0 is still b's
  EXPECT_EQ(cache.ref_count(0), 1);
  EXPECT_EQ(cache.num_sequences(), 1);
  const Index e = cache.add_sequence();
  EXPECT_TRUE(e == a || e == c || e == d);
  EXPECT_EQ(cache.length(e), 0);
  cache.truncate(b, 3);
  EXPECT_EQ(cache.block_table(b), (std::vector<Index>{0}));
  EXPECT_EQ(cache.free_blocks(), 7);
  EXPECT_THROW(cache.truncate(b, 4), attn::ConfigError);
  EXPECT_THROW(cache.fork(99), attn::IndexError);
  EXPECT_THROW(cache.ref_count(8), attn::IndexError);
}

TEST(PagedKVCache, AnExhaustedPoolThrowsNamingTheBlocksAndChangesNothing) {
  for (const Kind& kind : {kKinds[0], kKinds[2]}) {
    SCOPED_TRACE(kind.name);
    PagedKVCache<float> cache(paged_options(kind, 4, 4, 1, 32));
    const Index a = cache.add_sequence();
    append_to(cache, {a}, nullptr, {}, 10, 7);
    const Index b = cache.fork(a);
    // b's 7 more tokens: 2 new blocks and a copy of the shared last block; 1 is free.
    EXPECT_EQ(cache.blocks_needed(b, 7), 3);
    const auto memory = [&] {
      const auto m = cache.memory();
      return std::vector<float>(m.data(), m.data() + m.extent(0));
    };
    const std::vector<float> before = memory();
    const std::vector<Index> a_table = cache.block_table(a), b_table = cache.block_table(b);
    const auto k = attn::test::random_tensor<float, 3>({1, 7, 32}, 9);
    EXPECT_THAT(attn::test::thrown<attn::ConfigError>([&] { cache.append(b, k.view(), k.view()); }),
                AllOf(HasSubstr("exhausted"), HasSubstr("need 3 blocks"),
                      HasSubstr("1 of N=4 are free"), HasSubstr("sequence 1")));
    EXPECT_EQ(cache.length(a), 10);
    EXPECT_EQ(cache.length(b), 10);
    EXPECT_EQ(cache.block_table(a), a_table);
    EXPECT_EQ(cache.block_table(b), b_table);
    EXPECT_EQ(cache.free_blocks(), 1);
    for (Index n = 0; n < 3; ++n) EXPECT_EQ(cache.ref_count(n), 2);
    EXPECT_EQ(memory(), before);
    // What fits still goes in: 2 tokens (the copy; the block then holds 4).
    cache.append(b, attn::test::random_tensor<float, 3>({1, 2, 32}, 11).view(),
                 attn::test::random_tensor<float, 3>({1, 2, 32}, 12).view());
    EXPECT_EQ(cache.free_blocks(), 0);
    EXPECT_EQ(cache.blocks_needed(b, 1), 1);
    const auto one = attn::test::random_tensor<float, 3>({1, 1, 32}, 13);
    EXPECT_THROW(cache.append(b, one.view(), one.view()), attn::ConfigError);
  }
}

TEST(PagedKVCache, AttentionThroughTheBlockTablesIsBitIdenticalToTheContiguousCache) {
  // Three sequences of a pool of blocks of 16: s0 (37 tokens), s1 forked from it then
  // 93 more (the shared partly filled block copied), s2 of 520 (two 512-key chunks of a
  // decode step), then one more token each; a KVCache holds the same tokens per item. A
  // decode step and a prefill-shaped call of 5 queries, with and without a window, GQA
  // (H 4, H_kv 2), hd 40 (a partial int4 block, a vector tail): the same bits for every
  // element kind, for 1 and 2 threads, on every kernel set (float and int8 rows). Each
  // sequence's blocks in runs (the pool's placement), and scattered through a fragmented pool.
  const int saved = attn::num_threads();
  for (const Kind& kind : kKinds) {
    for (const bool scattered : {false, true}) {
      SCOPED_TRACE(std::string(kind.name) + (scattered ? " scattered" : " in runs"));
      PagedKVCache<float> paged(paged_options(kind, scattered ? 128 : 64, 16, 2, 40));
      if (scattered) fragment(paged);
      KVCacheOptions fo{3, 2, 40, 700};
      fo.element = kind.element, fo.int4_group = kind.int4_group;
      KVCache<float> flat(fo);
      const Index s0 = paged.add_sequence(), s2 = paged.add_sequence();
      append_to(paged, {s0}, &flat, {0, 1}, 37, 1);
      const Index s1 = paged.fork(s0);
      append_to(paged, {s1}, &flat, {1}, 93, 3);
      append_to(paged, {s2}, &flat, {2}, 500, 5);
      append_to(paged, {s2}, &flat, {2}, 20, 7);
      append_to(paged, {s0}, &flat, {0}, 1, 9);
      append_to(paged, {s1}, &flat, {1}, 1, 11);
      append_to(paged, {s2}, &flat, {2}, 1, 13);
      ASSERT_EQ(paged.length(s1), 131);
      ASSERT_NE(paged.block_table(s0)[2], paged.block_table(s1)[2]);  // copied on write
      ASSERT_EQ(paged.block_table(s0)[1], paged.block_table(s1)[1]);  // shared
      ASSERT_EQ(has_neighbours(paged.block_table(s2)), !scattered);
      const std::vector<Index> seqs = {s0, s1, s2};
      for (const auto& [t, window] :
           std::vector<std::pair<Index, Index>>{{1, 0}, {1, 50}, {5, 50}}) {
        const auto q = attn::test::random_tensor<float, 4>({3, 4, t, 40}, 17 + t);
        {
          attn::Workspace ws;
          // Every kernel set for float and int8 rows; the widest for the other kinds.
          std::vector<attn::Isa> sets = attn::test::runnable_sets();
          if (kind.element != KVElement::kScalar && kind.element != KVElement::kInt8) {
            sets = {sets.back()};
          }
          for (const attn::Isa isa : sets) {
            attn::set_isa(isa);
            attn::set_num_threads(saved);
            Tensor<float, 4> want({3, 4, t, 40});
            attn::cached_attention(q.view(), flat, want.view(), ws, {}, window);
            for (const int threads : {1, 2}) {
              attn::set_num_threads(threads);
              Tensor<float, 4> got({3, 4, t, 40});
              attn::paged_attention(q.view(), paged, seqs, got.view(), ws, {}, window);
              EXPECT_TRUE(ref::same_bits(got.view(), want.view()))
                  << "T=" << t << " window=" << window << " isa=" << static_cast<int>(isa)
                  << " threads=" << threads;
            }
          }
          attn::set_isa(attn::best_isa());
          attn::set_num_threads(saved);
        }
      }
      // A batch of other sequences and in another order reads their own rows.
      const auto q = attn::test::random_tensor<float, 4>({2, 4, 1, 40}, 31);
      Tensor<float, 4> got({2, 4, 1, 40}), want({3, 4, 1, 40});
      auto q3 = attn::test::random_tensor<float, 4>({3, 4, 1, 40}, 31);
      attn::Workspace ws;
      attn::paged_attention(q.view(), paged, {s2, s0}, got.view(), ws);
      for (Index h = 0; h < 4; ++h) {  // q3's items 2 and 0 hold q's rows 0 and 1
        for (Index e = 0; e < 40; ++e) {
          q3.data()[(2 * 4 + h) * 40 + e] = q(0, h, 0, e);
          q3.data()[(0 * 4 + h) * 40 + e] = q(1, h, 0, e);
        }
      }
      attn::cached_attention(q3.view(), flat, want.view(), ws);
      EXPECT_TRUE(ref::same_bits(attn::select(got.view(), 0, 0), attn::select(want.view(), 0, 2)));
      EXPECT_TRUE(ref::same_bits(attn::select(got.view(), 0, 1), attn::select(want.view(), 0, 0)));
    }
  }
  {  // double rows: the same bits too (blocks of 8, 50 tokens, a decode step)
    PagedKVCacheOptions po = paged_options(kKinds[0], 8, 8, 1, 16);
    PagedKVCache<double> paged(po);
    KVCache<double> flat(1, 1, 16, 64);
    const Index s = paged.add_sequence();
    const auto k = attn::test::random_tensor<double, 4>({1, 1, 50, 16}, 3);
    const auto v = attn::test::random_tensor<double, 4>({1, 1, 50, 16}, 4);
    paged.append(s, attn::select(k.view(), 0, 0), attn::select(v.view(), 0, 0));
    flat.append(k.view(), v.view());
    const auto q = attn::test::random_tensor<double, 4>({1, 2, 1, 16}, 5);
    Tensor<double, 4> got({1, 2, 1, 16}), want({1, 2, 1, 16});
    attn::Workspace ws;
    attn::paged_attention(q.view(), paged, {s}, got.view(), ws);
    attn::cached_attention(q.view(), flat, want.view(), ws);
    EXPECT_TRUE(ref::same_bits(got.view(), want.view())) << "double";
  }
  // Errors name what is wrong, before anything runs.
  PagedKVCache<float> paged(paged_options(kKinds[0], 4, 16, 1, 8));
  const Index s = paged.add_sequence();
  const auto q = attn::test::random_tensor<float, 4>({1, 2, 2, 8}, 1);
  Tensor<float, 4> out({1, 2, 2, 8});
  attn::Workspace ws;
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>(
                  [&] { attn::paged_attention(q.view(), paged, {s}, out.view(), ws); }),
              HasSubstr("append the new ones first"));
  EXPECT_THROW(attn::paged_attention(q.view(), paged, {s, s}, out.view(), ws), attn::ShapeError);
  EXPECT_THROW(attn::paged_attention(q.view(), paged, {5}, out.view(), ws), attn::IndexError);
}

// The paths `isa` runs for bfloat16 on this CPU (widening; on the avx512 set vdpbf16ps and AMX
// where the CPU and the operating system have them); float16 widens.
template <class E>
std::vector<attn::Bf16Path> paths(attn::Isa isa) {
  std::vector<attn::Bf16Path> out{attn::Bf16Path::kWiden};
  if (!std::is_same_v<E, bfloat16> || isa != attn::Isa::kAvx512) return out;
  for (const attn::Bf16Path p : {attn::Bf16Path::kDot, attn::Bf16Path::kAmx}) {
    if (attn::bf16_path_available(p)) out.push_back(p);
  }
  return out;
}

// The test above for the rows of a bfloat16 or float16 cache (the kernel on operands of that
// type, each tile copied out of its blocks): s0 (37 tokens), s1 forked from it then 93 more,
// s2 of 300 (three key tiles of 128; storage types never split the keys), one more token
// each; a decode step and a call of 5 queries (a partial tile on AMX), with and without a
// window, GQA, hd 40 and hd 64 (AMX reads whole K tiles in place): the same bits as the
// KVCache<E> holding the same rows, on every set and path, 1 and 2 threads. A quantised
// element kind is refused, naming the type; the type's own is the rows.
template <class E>
void check_storage_rows(Index hd) {
  PagedKVCache<E> paged(paged_options(kKinds[0], 64, 16, 2, hd));
  KVCache<E> flat(KVCacheOptions{3, 2, hd, 320});
  const Index s0 = paged.add_sequence(), s2 = paged.add_sequence();
  append_to(paged, {s0}, &flat, {0, 1}, 37, 1);
  const Index s1 = paged.fork(s0);
  append_to(paged, {s1}, &flat, {1}, 93, 3);
  append_to(paged, {s2}, &flat, {2}, 300, 5);
  for (const Index s : {s0, s1, s2})
    append_to(paged, {s}, &flat, {s == s0 ? 0 : s == s1 ? 1 : 2}, 1, 9 + s);
  ASSERT_NE(paged.block_table(s0)[2], paged.block_table(s1)[2]);  // copied on write
  EXPECT_EQ(paged.bytes_per_token(), flat.bytes_per_token());
  EXPECT_EQ(rows_of(paged, s1).size(), static_cast<std::size_t>(2 * 2 * 131 * hd));
  const std::vector<Index> seqs = {s0, s1, s2};
  const int saved = attn::num_threads();
  attn::Workspace ws;
  for (const auto& [t, window] : std::vector<std::pair<Index, Index>>{{1, 0}, {1, 50}, {5, 0}}) {
    const auto q = random<E, 4>({3, 4, t, hd}, 17 + t);
    for (const attn::Isa isa : attn::test::runnable_sets()) {
      attn::set_isa(isa);
      for (const attn::Bf16Path path : paths<E>(isa)) {
        attn::set_bf16_path(path);
        attn::set_num_threads(saved);
        Tensor<E, 4> want({3, 4, t, hd});
        attn::cached_attention(q.view(), flat, want.view(), ws, {}, window);
        for (const int threads : {1, 2}) {
          attn::set_num_threads(threads);
          Tensor<E, 4> got({3, 4, t, hd});
          attn::paged_attention(q.view(), paged, seqs, got.view(), ws, {}, window);
          EXPECT_TRUE(ref::same_bits(got.view(), want.view()))
              << "T=" << t << " window=" << window << " " << attn::isa_name(isa) << " "
              << attn::bf16_path_name(path) << " threads=" << threads;
        }
      }
    }
  }
  attn::set_num_threads(saved);
  PagedKVCacheOptions quantised = paged_options(kKinds[1], 4, 16, 2, hd);
  const std::string name = attn::element_name<E>();
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>([&] { PagedKVCache<E> refused(quantised); }),
              HasSubstr("a " + name + " cache stores " + name + " rows"));
  quantised.element = attn::kv_element_of<E>();
  EXPECT_EQ(PagedKVCache<E>(quantised).element(), KVElement::kScalar);
}

TEST(PagedKVCache, Bf16AndFp16RowsThroughTheBlockTablesAreBitIdenticalToTheContiguousCache) {
  check_storage_rows<bfloat16>(40);
  check_storage_rows<bfloat16>(64);
  check_storage_rows<float16>(40);
}

// A Llama-style module (GQA, RoPE, a window of 40) over a paged cache (blocks of 16): prompts
// of 30, 45 and 7 tokens prefilled one sequence at a time, s3 forked from s0 (a shared
// prompt), then 3 decode steps of one token for all four in one call. Each sequence's rows
// against the same forward over its own KVCache of one item: the same bits, for each of
// `kinds`. Then errors before anything is written: a short pool (naming the blocks; the
// cache unchanged), a repeated sequence.
template <class E>
void check_ragged_batch(const attn::MultiHeadAttention<E>& m, const std::vector<Kind>& kinds) {
  const std::vector<Index> prompt_lengths = {30, 45, 7, 30};
  for (const Kind& kind : kinds) {
    SCOPED_TRACE(std::string(attn::element_name<E>()) + " " + kind.name);
    PagedKVCache<E> paged(paged_options(kind, 32, 16, 2, 16));
    std::vector<KVCache<E>> flat;
    KVCacheOptions fo{1, 2, 16, 64};
    fo.element = kind.element;
    for (Index b = 0; b < 4; ++b) flat.emplace_back(fo);
    attn::Workspace ws;
    std::vector<Index> seqs;
    for (Index b = 0; b < 4; ++b) {
      const Index t = prompt_lengths[static_cast<std::size_t>(b)];
      const auto x = random<E, 3>({1, t, 64}, 41 + (b == 3 ? 0 : b));
      Tensor<E, 3> got({1, t, 64}), want({1, t, 64});
      m.forward(x.view(), want.view(), ws, flat[static_cast<std::size_t>(b)]);
      if (b == 3) {
        seqs.push_back(paged.fork(seqs[0]));
        continue;
      }
      seqs.push_back(paged.add_sequence());
      m.forward(x.view(), got.view(), ws, paged, {seqs.back()});
      EXPECT_TRUE(ref::same_bits(got.view(), want.view())) << "prefill of " << b;
    }
    for (Index step = 0; step < 3; ++step) {
      const auto x = random<E, 3>({4, 1, 64}, 60 + step);
      Tensor<E, 3> got({4, 1, 64}), want({4, 1, 64});
      m.forward(x.view(), got.view(), ws, paged, seqs);
      for (Index b = 0; b < 4; ++b) {
        m.forward(attn::slice(x.view(), 0, b, b + 1), attn::slice(want.view(), 0, b, b + 1), ws,
                  flat[static_cast<std::size_t>(b)]);
      }
      EXPECT_TRUE(ref::same_bits(got.view(), want.view())) << "step " << step;
    }
    EXPECT_EQ(paged.length(seqs[3]), 33);
    EXPECT_NE(paged.block_table(seqs[0])[1], paged.block_table(seqs[3])[1]);  // copied
    EXPECT_EQ(paged.block_table(seqs[0])[0], paged.block_table(seqs[3])[0]);  // shared
  }
  PagedKVCache<E> paged(paged_options(kKinds[0], 3, 16, 2, 16));
  const Index s = paged.add_sequence();
  attn::Workspace ws;
  Tensor<E, 3> y20({1, 20, 64});
  m.forward(random<E, 3>({1, 20, 64}, 2).view(), y20.view(), ws, paged, {s});
  const Index f = paged.fork(s);
  const auto memory = [&] {
    const auto all = paged.memory();
    std::vector<unsigned char> bytes(static_cast<std::size_t>(all.extent(0)) * sizeof(E));
    std::memcpy(bytes.data(), all.data(), bytes.size());
    return bytes;
  };
  const std::vector<unsigned char> before = memory();
  // f's 20 more tokens: a copy of the shared last block and one new block; 1 is free.
  const auto x = random<E, 3>({1, 20, 64}, 1);
  Tensor<E, 3> y({1, 20, 64});
  EXPECT_THAT(
      attn::test::thrown<attn::ConfigError>([&] { m.forward(x.view(), y.view(), ws, paged, {f}); }),
      AllOf(HasSubstr("need 2 blocks"), HasSubstr("1 of N=3 are free")));
  EXPECT_EQ(paged.length(s), 20);
  EXPECT_EQ(paged.length(f), 20);
  EXPECT_EQ(paged.block_table(f), paged.block_table(s));
  EXPECT_EQ(paged.ref_count(paged.block_table(f)[1]), 2);
  EXPECT_EQ(paged.free_blocks(), 1);
  EXPECT_EQ(memory(), before);
  const auto x2 = random<E, 3>({2, 1, 64}, 1);
  Tensor<E, 3> y2({2, 1, 64});
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>([&] {
                m.forward(x2.view(), y2.view(), ws, paged, {s, s});
              }),
              HasSubstr("appears twice"));
  // What fits still goes in: one token for f copies the shared block (copy on write).
  m.forward(attn::slice(x.view(), 1, 0, 1), attn::slice(y.view(), 1, 0, 1), ws, paged, {f});
  EXPECT_NE(paged.block_table(f)[1], paged.block_table(s)[1]);
  EXPECT_EQ(paged.free_blocks(), 0);
}

attn::MultiHeadAttentionOptions llama_options() {
  attn::MultiHeadAttentionOptions o;
  o.d_in = 64, o.num_heads = 4, o.num_kv_heads = 2, o.head_dim = 16, o.causal = true;
  o.sliding_window = 40;
  o.rope = attn::RotaryOptions{16, 16, 10000.0, attn::RopeStyle::kHalfSplit, 256};
  return o;
}

TEST(PagedKVCache, TheIncrementalForwardOnARaggedBatchMatchesTheContiguousCache) {
  // Float and int8 rows; then a non-causal module is refused.
  attn::MultiHeadAttentionOptions o = llama_options();
  attn::TorchGenerator gen(5);
  attn::MultiHeadAttention<float> m(o, gen);
  m.eval();
  check_ragged_batch(m, {kKinds[0], kKinds[1]});
  PagedKVCache<float> paged(paged_options(kKinds[0], 2, 16, 2, 16));
  const Index s = paged.add_sequence();
  const auto x = attn::test::random_tensor<float, 3>({1, 40, 64}, 1);
  Tensor<float, 3> y({1, 40, 64});
  attn::Workspace ws;
  o.causal = false, o.sliding_window = 0;
  const attn::MultiHeadAttention<float> open(o, gen);
  EXPECT_THROW(open.forward(x.view(), y.view(), ws, paged, {s}), attn::ConfigError);
}

TEST(PagedKVCache, Bf16AndFp16ModulesOnARaggedBatchMatchTheContiguousCache) {
  // The float module's weights rounded (a PyTorch module after .to(torch.bfloat16)), through
  // a PagedKVCache of the module's type against a KVCache of that type.
  attn::TorchGenerator gen(5);
  const attn::MultiHeadAttention<float> wide(llama_options(), gen);
  check_ragged_batch(attn::MultiHeadAttention<bfloat16>(wide), {kKinds[0]});
  check_ragged_batch(attn::MultiHeadAttention<float16>(wide), {kKinds[0]});
}

// Blocks sequence s still holds (its table's entries that are not -1).
Index held(const PagedKVCache<float>& cache, Index s) {
  const std::vector<Index>& t = cache.block_table(s);
  return static_cast<Index>(t.size()) - static_cast<Index>(std::count(t.begin(), t.end(), -1));
}

TEST(PagedKVCache, AWindowedStreamReleasesTheBlocksBehindItsWindow) {
  // A window of 13 over blocks of 4: a stream of 130 tokens (10 windows; a prefill of 6, then
  // one token a step) holds at most ceil(13 / 4) + 1 = 5 blocks, and each step's output is
  // the same bits as a ring KVCache's. The ring holds 128 positions (more than the
  // W + C - 1 = 18 it needs): the kernel's key tiles end at multiples of 128 and where a
  // ring wraps, so a ring of 128 splits them where the paged cache does (a ring of 18 sums
  // in another order: ~1e-7 apart). s1, forked from s0 at 40 tokens, keeps the blocks they
  // share after s0 released them, until it releases them too.
  const Index window = 13, block = 4, bound = (window + block - 1) / block + 1;
  attn::MultiHeadAttentionOptions o;
  o.d_in = 16, o.num_heads = 2, o.num_kv_heads = 1, o.head_dim = 8, o.causal = true;
  o.sliding_window = window;
  o.rope = attn::RotaryOptions{8, 8, 10000.0, attn::RopeStyle::kHalfSplit, 256};
  attn::TorchGenerator gen(7);
  attn::MultiHeadAttention<float> m(o, gen);
  m.eval();
  PagedKVCache<float> paged(paged_options(kKinds[0], 12, block, 1, 8));
  KVCacheOptions ro{1, 1, 8, 128, window, 6};
  std::vector<KVCache<float>> ring;
  ring.emplace_back(ro);
  std::vector<Tensor<float, 3>> history;  // s0's inputs before the fork
  attn::Workspace ws;
  std::vector<Index> seqs{paged.add_sequence()};
  std::uint64_t seed = 100;
  // One step of t tokens for every sequence, checked against the rings.
  const auto step = [&](Index t) {
    const Index batch = static_cast<Index>(seqs.size());
    const auto x = attn::test::random_tensor<float, 3>({batch, t, 16}, ++seed);
    Tensor<float, 3> got({batch, t, 16}), want({batch, t, 16});
    m.forward(x.view(), got.view(), ws, paged, seqs);
    if (ring.size() == 1) history.push_back(x);
    for (Index b = 0; b < batch; ++b) {
      m.forward(attn::slice(x.view(), 0, b, b + 1), attn::slice(want.view(), 0, b, b + 1), ws,
                ring[static_cast<std::size_t>(b)]);
      const Index s = seqs[static_cast<std::size_t>(b)];
      ASSERT_LE(held(paged, s), bound) << "sequence " << s << " at " << paged.length(s);
      EXPECT_EQ(paged.first_position(s),
                std::max<Index>(paged.length(s) - window + 1, 0) / block * block);
    }
    ASSERT_TRUE(ref::same_bits(got.view(), want.view())) << "at " << paged.length(seqs[0]);
  };
  step(6);
  while (paged.length(seqs[0]) < 40) step(1);
  EXPECT_EQ(paged.num_blocks() - paged.free_blocks(), held(paged, seqs[0]));
  // Fork: s1 shares s0's blocks, among them block table entry 7 (positions 28..31).
  seqs.push_back(paged.fork(seqs[0]));
  ring.emplace_back(ro);  // the same tokens: s0's inputs again
  for (const Tensor<float, 3>& x : history) {
    Tensor<float, 3> y(x.shape());
    m.forward(x.view(), y.view(), ws, ring[1]);
  }
  const Index shared = paged.block_table(seqs[0])[7];
  ASSERT_GE(shared, 0);
  EXPECT_EQ(paged.ref_count(shared), 2);
  {
    const std::vector<Index> both = seqs;
    seqs = {both[0]};  // s0 alone, past position 44: its window leaves block 7 behind
    while (paged.length(seqs[0]) < 50) step(1);
    seqs = both;
  }
  EXPECT_EQ(paged.block_table(seqs[0])[7], -1);
  EXPECT_EQ(paged.block_table(seqs[1])[7], shared);
  EXPECT_EQ(paged.ref_count(shared), 1);  // s1's still
  // Together (s1 one token a step from 40) to 130: s1 releases the shared blocks in turn.
  while (paged.length(seqs[0]) < 130) step(1);
  EXPECT_EQ(paged.length(seqs[1]), 120);
  EXPECT_EQ(paged.block_table(seqs[1])[7], -1);  // (block `shared` went back to the pool)
  EXPECT_EQ(paged.num_blocks() - paged.free_blocks(), held(paged, seqs[0]) + held(paged, seqs[1]));
  // Released positions are gone: attention reaching them (no window, or a wider one) and a
  // truncation back into them are refused, naming the positions.
  const auto q = attn::test::random_tensor<float, 4>({1, 2, 1, 8}, 3);
  Tensor<float, 4> out({1, 2, 1, 8});
  EXPECT_THAT(
      attn::test::thrown<attn::ConfigError>(
          [&] { attn::paged_attention(q.view(), paged, {seqs[0]}, out.view(), ws, {}, 0); }),
      AllOf(HasSubstr("holds positions from 116"), HasSubstr("sees keys from 0 without a window")));
  EXPECT_NO_THROW(attn::paged_attention(q.view(), paged, {seqs[0]}, out.view(), ws, {}, window));
  EXPECT_THROW(attn::paged_attention(q.view(), paged, {seqs[0]}, out.view(), ws, {}, window + 8),
               attn::ConfigError);
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>([&] { paged.truncate(seqs[0], 100); }),
              HasSubstr("first position held 116"));
  paged.free_sequence(seqs[0]);
  paged.free_sequence(seqs[1]);
  EXPECT_EQ(paged.free_blocks(), paged.num_blocks());
}

// Prompts of 30, 21 and 7 tokens packed into one call (GQA, RoPE, value heads of 8, a window
// of 12 for the second pass, which releases the first blocks): s1 continues a fork of a
// 10-token prefix (its partly filled shared block copied first), the others start empty.
// Against the same prompts prefilled one at a time into a cache in the same state: the same
// output bits and the same rows, for each of `kinds`; then one decode step of all three agrees
// too. E: the module's type (bfloat16: the float module's weights rounded).
template <class E>
void check_paged_prefill(const std::vector<Kind>& kinds) {
  for (const Index window : {Index{0}, Index{12}}) {
    attn::MultiHeadAttentionOptions o;
    o.d_in = 32, o.num_heads = 4, o.num_kv_heads = 2, o.head_dim = 16, o.value_head_dim = 8;
    o.causal = true, o.sliding_window = window;
    o.rope = attn::RotaryOptions{16, 16, 10000.0, attn::RopeStyle::kHalfSplit, 64};
    attn::TorchGenerator gen(13);
    attn::MultiHeadAttention<float> wide(o, gen);
    wide.eval();
    const attn::MultiHeadAttention<E> m(wide);
    for (const Kind& kind : kinds) {
      SCOPED_TRACE(std::string(attn::element_name<E>()) + " " + kind.name + " window " +
                   std::to_string(window));
      PagedKVCacheOptions po = paged_options(kind, 24, 16, 2, 16);
      po.value_head_dim = 8;
      PagedKVCache<E> packed(po), alone(po);
      attn::Workspace ws;
      const std::vector<Index> lengths = {30, 21, 7};
      std::vector<Index> a, b;  // the sequences of each cache
      const auto prefix = random<E, 3>({1, 10, 32}, 5);
      Tensor<E, 3> y10({1, 10, 32});
      for (PagedKVCache<E>* cache : {&packed, &alone}) {
        std::vector<Index>& ids = cache == &packed ? a : b;
        ids.push_back(cache->add_sequence());
        const Index p = cache->add_sequence();
        m.forward(prefix.view(), y10.view(), ws, *cache, {p});
        ids.push_back(cache->fork(p));
        ids.push_back(cache->add_sequence());
      }
      const attn::PackedSequences offsets(attn::SequenceOffsets::from_lengths(lengths));
      const auto x = random<E, 2>({58, 32}, 6);
      Tensor<E, 2> got({58, 32});
      m.forward(x.view(), offsets, got.view(), ws, packed, a);
      for (Index s = 0, r0 = 0; s < 3; r0 += lengths[static_cast<std::size_t>(s)], ++s) {
        const Index t = lengths[static_cast<std::size_t>(s)];
        Tensor<E, 3> want({1, t, 32});
        m.forward(attn::unsqueeze(attn::slice(x.view(), 0, r0, r0 + t), 0), want.view(), ws, alone,
                  {b[static_cast<std::size_t>(s)]});
        EXPECT_TRUE(
            ref::same_bits(attn::slice(got.view(), 0, r0, r0 + t), attn::select(want.view(), 0, 0)))
            << "sequence " << s;
        EXPECT_EQ(packed.first_position(a[static_cast<std::size_t>(s)]),
                  alone.first_position(b[static_cast<std::size_t>(s)]));
        if (window == 0) {
          EXPECT_EQ(rows_of(packed, a[static_cast<std::size_t>(s)]),
                    rows_of(alone, b[static_cast<std::size_t>(s)]));
        }
      }
      EXPECT_EQ(packed.free_blocks(), alone.free_blocks());
      EXPECT_EQ(packed.first_position(a[0]), window == 0 ? 0 : 16);
      const auto step = random<E, 3>({3, 1, 32}, 7);
      Tensor<E, 3> y_packed({3, 1, 32}), y_alone({3, 1, 32});
      m.forward(step.view(), y_packed.view(), ws, packed, a);
      m.forward(step.view(), y_alone.view(), ws, alone, b);
      EXPECT_TRUE(ref::same_bits(y_packed.view(), y_alone.view()));
    }
  }
}

TEST(PagedKVCache, APackedPrefillIsBitIdenticalToPrefillingEachSequenceAlone) {
  check_paged_prefill<float>({kKinds[0], kKinds[1]});
  // A pool short of blocks for all of them changes nothing, naming the blocks; so does a
  // count of ids other than the sequences'.
  attn::MultiHeadAttentionOptions o;
  o.d_in = 32, o.num_heads = 4, o.num_kv_heads = 2, o.head_dim = 16, o.causal = true;
  attn::TorchGenerator gen(3);
  const attn::MultiHeadAttention<float> m(o, gen);
  PagedKVCache<float> small(paged_options(kKinds[0], 3, 16, 2, 16));
  const std::vector<Index> ids = {small.add_sequence(), small.add_sequence()};
  const auto x = attn::test::random_tensor<float, 2>({40, 32}, 8);
  Tensor<float, 2> y({40, 32});
  attn::Workspace ws;
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>([&] {
                m.forward(x.view(), attn::PackedSequences(std::vector<Index>{0, 20, 40}), y.view(),
                          ws, small, ids);
              }),
              AllOf(HasSubstr("need 4 blocks"), HasSubstr("3 of N=3 are free")));
  EXPECT_EQ(small.length(ids[0]) + small.length(ids[1]), 0);
  EXPECT_EQ(small.free_blocks(), 3);
  EXPECT_THROW(m.forward(x.view(), attn::PackedSequences(std::vector<Index>{0, 40}), y.view(), ws,
                         small, ids),
               attn::ShapeError);
}

TEST(PagedKVCache, ABf16PackedPrefillIsBitIdenticalToPrefillingEachSequenceAlone) {
  check_paged_prefill<bfloat16>({kKinds[0]});
}

TEST(PagedKVCache, AValueHeadSizeOfItsOwnMatchesTheContiguousCache) {
  // value_head_dim 8 against keys of 16 (GQA, RoPE): a prefill of 21 tokens, then two decode
  // steps, through a paged cache of blocks of 8 and a KVCache of the same sizes: the same bits.
  attn::MultiHeadAttentionOptions o;
  o.d_in = 32, o.num_heads = 4, o.num_kv_heads = 2, o.head_dim = 16, o.value_head_dim = 8;
  o.causal = true;
  o.rope = attn::RotaryOptions{16, 16, 10000.0, attn::RopeStyle::kHalfSplit, 64};
  attn::TorchGenerator gen(9);
  attn::MultiHeadAttention<float> m(o, gen);
  m.eval();
  PagedKVCacheOptions po = paged_options(kKinds[0], 8, 8, 2, 16);
  po.value_head_dim = 8;
  PagedKVCache<float> paged(po);
  KVCacheOptions fo{1, 2, 16, 32};
  fo.value_head_dim = 8;
  KVCache<float> flat(fo);
  attn::Workspace ws;
  const Index s = paged.add_sequence();
  for (const Index t : {Index{21}, Index{1}, Index{1}}) {
    const auto x = attn::test::random_tensor<float, 3>({1, t, 32}, 70 + t);
    Tensor<float, 3> got({1, t, 32}), want({1, t, 32});
    m.forward(x.view(), got.view(), ws, paged, {s});
    m.forward(x.view(), want.view(), ws, flat);
    EXPECT_TRUE(ref::same_bits(got.view(), want.view())) << t << " tokens";
  }
  // A cache whose value rows are the key size is refused, naming both.
  PagedKVCache<float> wrong(paged_options(kKinds[0], 8, 8, 2, 16));
  const Index w = wrong.add_sequence();
  const auto x = attn::test::random_tensor<float, 3>({1, 2, 32}, 1);
  Tensor<float, 3> y({1, 2, 32});
  EXPECT_THAT(
      attn::test::thrown<attn::ShapeError>([&] { m.forward(x.view(), y.view(), ws, wrong, {w}); }),
      AllOf(HasSubstr("value_head_dim=16"), HasSubstr("value_head_dim=8")));
}

TEST(PagedKVCache, RequestsAheadFollowTheBlockTable) {
  // A decode pass asks for each key row (and its scales) some keys ahead. Over a run of a
  // sequence's blocks that ends inside the pass, the rows ahead past the run's end are the
  // next ones in the block table, not the pool's next block: in a fragmented pool (no two of
  // the sequence's blocks neighbours), the plan of each run of a 128-key pass from slot 0 asks
  // kKeysAhead keys ahead (the next block's rows) and addresses exactly the rows and scales
  // that follow the run; with no table entry left past the last run, the plan keeps to the
  // run.
  for (const Kind& kind : {kKinds[0], kKinds[1]}) {  // float rows; int8 rows with scales
    SCOPED_TRACE(kind.name);
    PagedKVCache<float> paged(paged_options(kind, 64, 16, 2, 40));
    fragment(paged);
    const Index s = paged.add_sequence();
    append_to(paged, {s}, nullptr, {}, 130, 3);
    const attn::PagedBatch batch = paged.batch(&s, 1);
    const attn::detail::StoredRows& keys = batch.stored.k;
    const Index ahead = attn::detail::kKeysAhead, n = 128;
    static_assert(attn::detail::kKeysAhead == 16, "a run (one block) holds the rows ahead");
    ASSERT_EQ(keys.table_stride, 9);  // 130 tokens: 9 blocks
    for (Index h = 0; h < 2; ++h) {
      for (Index slot = 0; slot < n; slot += 16) {  // each run: one block (scattered)
        const Index run = 16, rest = n - slot;
        const attn::detail::KeyPrefetch plan = attn::detail::key_prefetch(
            keys, nullptr, 0, h, slot, run, rest, 40, 40, Index(sizeof(float)));
        ASSERT_EQ(plan.keys, ahead);
        ASSERT_EQ(plan.split, run - ahead);
        for (Index j = plan.split; j < run; ++j) {
          const Index at = slot + j + ahead;  // < 144: inside the table's 9 blocks
          EXPECT_EQ(plan.k_alt + static_cast<std::uintptr_t>(j * keys.row_stride),
                    reinterpret_cast<std::uintptr_t>(keys.row(0, h, at)))
              << "slot " << slot << " key " << j;
          if (keys.scales != nullptr) {
            EXPECT_EQ(plan.ks_alt + static_cast<std::uintptr_t>(j * plan.ks_rs),
                      reinterpret_cast<std::uintptr_t>(keys.scales_of(0, h, at)))
                << "slot " << slot << " key " << j;
          }
        }
      }
    }
    // A run through the end of the table's last block (slots 128 .. 143): no entry after it.
    const attn::detail::KeyPrefetch last =
        attn::detail::key_prefetch(keys, nullptr, 0, 0, 128, 16, 16, 40, 40, Index(sizeof(float)));
    EXPECT_EQ(last.split, std::numeric_limits<Index>::max());
  }
}

TEST(PagedKVCache, RequestsAheadReachAsFarAsTheNextRunOfBlocks) {
  // Short rows are asked for kBytesAhead of rows ahead (keys_ahead(): 51 keys of 40-byte int8
  // rows), past a run's end only as far as the next run of neighbouring blocks goes; shorter,
  // kKeysAhead keys (the next block). A head-major pool of 16 blocks of 16 rows, 2 heads,
  // addressed by hand: each request lands on the row the table puts there.
  using attn::detail::keys_ahead;
  using attn::detail::kKeysAhead;
  static_assert(keys_ahead(40) == 51 && keys_ahead(64) == 32 && keys_ahead(128) == kKeysAhead);
  const Index width = 40, block_rows = 16, blocks = 16;
  std::vector<unsigned char> pool(static_cast<std::size_t>(2 * blocks * block_rows * width));
  attn::detail::StoredRows keys;
  keys.element = attn::KVElement::kInt8;
  keys.data = pool.data();
  keys.row_stride = width, keys.item_stride = block_rows * width;
  keys.head_stride = blocks * keys.item_stride;
  keys.block_rows = block_rows;
  const auto plan_of = [&](const std::vector<Index>& table, Index h, Index run) {
    keys.table = table.data(), keys.table_stride = Index(table.size());
    return attn::detail::key_prefetch(keys, nullptr, 0, h, 0, run, 128, width, width);
  };
  const auto expect_rows_ahead = [&](const attn::detail::KeyPrefetch& plan, Index h, Index run) {
    for (Index j = 0; j < run; ++j) {
      const std::uintptr_t asked = j < plan.split
                                       ? reinterpret_cast<std::uintptr_t>(keys.row(0, h, 0)) +
                                             static_cast<std::uintptr_t>((j + plan.keys) * width)
                                       : plan.k_alt + static_cast<std::uintptr_t>(j * width);
      EXPECT_EQ(asked, reinterpret_cast<std::uintptr_t>(keys.row(0, h, j + plan.keys)))
          << "key " << j;
    }
  };
  for (Index h = 0; h < 2; ++h) {
    // Blocks 0, 1, then a run of 8 neighbours from 5: the requests of the first run (32 keys)
    // reach 51 keys ahead, into the second run.
    const std::vector<Index> long_run = {0, 1, 5, 6, 7, 8, 9, 10, 11, 12};
    const attn::detail::KeyPrefetch far = plan_of(long_run, h, 32);
    EXPECT_EQ(far.keys, 51);
    expect_rows_ahead(far, h, 32);
    // Blocks 0, 1, then scattered: kKeysAhead keys ahead, the next block's rows.
    const std::vector<Index> scattered = {0, 1, 5, 7, 9, 11, 13, 15, 3, 14};
    const attn::detail::KeyPrefetch near = plan_of(scattered, h, 32);
    EXPECT_EQ(near.keys, kKeysAhead);
    expect_rows_ahead(near, h, 32);
    // Two neighbours after the run (5, 6), then a jump: as far as they go (32 keys).
    const std::vector<Index> two = {0, 1, 5, 6, 9, 11, 13, 15, 3, 14};
    const attn::detail::KeyPrefetch mid = plan_of(two, h, 32);
    EXPECT_EQ(mid.keys, 32);
    expect_rows_ahead(mid, h, 32);
  }
  // A contiguous cache's rows: kBytesAhead of them ahead.
  keys.table = nullptr;
  EXPECT_EQ(attn::detail::key_prefetch(keys, nullptr, 0, 0, 0, 128, 128, width, width).keys, 51);
}

TEST(PagedKVCache, NonFiniteValuesOutsideAQuerysWindowChangeNoBitOfIt) {
  // A float pool's sequence of 200 tokens (blocks of 16), 2 new queries with a window of 50
  // (H 4, H_kv 2: 4 rows per key/value head): query 0 (position 198) sees keys 149..198,
  // query 1 keys 150..199. Each multiplies the other's extra key with weight 0 (the product
  // runs over the rows' keys together, checked after on the accumulators, not scanned before).
  // A NaN or an infinity in the value of key 149 (seen by query 0 only) or 199 (query 1 only)
  // changes no bit of the other query's output, and makes the element it sits in not finite
  // in the outputs of the query that sees it (heads 2 and 3: key/value head 1), every other
  // element finite.
  const Index heads = 4, kv_heads = 2, hd = 16, n = 200, window = 50;
  const auto k = attn::test::random_tensor<float, 3>({kv_heads, n, hd}, 41);
  const auto v = attn::test::random_tensor<float, 3>({kv_heads, n, hd}, 43);
  const auto q = attn::test::random_tensor<float, 4>({1, heads, 2, hd}, 47);
  attn::Workspace ws;
  const auto step = [&](const Tensor<float, 3>& values) {
    PagedKVCache<float> paged(paged_options(kKinds[0], 16, 16, kv_heads, hd));
    const Index s = paged.add_sequence();
    paged.append(s, k.view(), values.view());
    Tensor<float, 4> out({1, heads, 2, hd});
    attn::paged_attention(q.view(), paged, {s}, out.view(), ws, {}, window);
    return out;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const attn::Isa isa : attn::test::runnable_sets()) {
    attn::set_isa(isa);
    const Tensor<float, 4> clean = step(v);
    for (const auto& [key, query] : std::vector<std::pair<Index, Index>>{{149, 0}, {199, 1}}) {
      for (const float x : {nan, inf}) {
        SCOPED_TRACE(std::string(attn::isa_name(isa)) + " key " + std::to_string(key) +
                     (std::isnan(x) ? " NaN" : " inf"));
        Tensor<float, 3> dirty = v;
        dirty(1, key, 5) = x;
        const Tensor<float, 4> out = step(dirty);
        for (Index h = 0; h < heads; ++h) {
          for (Index i = 0; i < 2; ++i) {
            for (Index e = 0; e < hd; ++e) {
              if (i != query) {
                EXPECT_EQ(out(0, h, i, e), clean(0, h, i, e)) << h << " " << i << " " << e;
              } else {
                EXPECT_EQ(std::isfinite(out(0, h, i, e)), h < 2 || e != 5)
                    << h << " " << i << " " << e;
              }
            }
          }
        }
      }
    }
  }
  attn::set_isa(attn::best_isa());
}

}  // namespace
}  // namespace paged_kv_cache_test

#include "support/bodies_end.hpp"
