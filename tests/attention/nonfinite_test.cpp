// SPDX-License-Identifier: MIT
// tests/attention/nonfinite_test.cpp: NaN and infinity in the attention kernels,
// on both paths and every kernel set this CPU runs.
//  - A NaN or infinity a query can see (in its query, a visible key or value, its scores)
//    makes that query's output non-finite, as PyTorch's arithmetic does. Before: exp(NaN)
//    was 2.4e38 on AVX2/AVX-512, so a NaN key took all the weight and every query returned
//    that key's value, finite; the streaming path also turned a NaN sum into zeros.
//  - What a query cannot see (masked, past key_lengths, future tokens under causal) never
//    affects it: its output is exactly what it is with those values replaced by finite ones.
//    Before: a value NaN past the causal bound inside a tile reached the earlier queries of
//    the tile through 0 * NaN.
//  - Only masks make a row "fully masked" (zeros); scores that overflow to -inf from the data
//    follow IEEE (NaN), as in PyTorch.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "support/scalar_types.hpp"
#include "support/test_support.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace nonfinite_test {
namespace {

using attn::Index;
using attn::Isa;

template <class Scalar>
using T4 = attn::Tensor<Scalar, 4>;

using attn::test::runnable_sets;

struct Path {
  attn::AttentionPath path;
  const char* name;
};
constexpr Path kPaths[] = {{attn::AttentionPath::kStreaming, "streaming"},
                           {attn::AttentionPath::kMaterialized, "materialized"}};

// One head, T_q = T_k = 70 (more than a 64-query tile), d = 8.
constexpr Index kT = 70, kD = 8;

// One head: `rows` queries against `keys` keys and values, uniform in [-1, 1) (q, k, v drawn
// in that order from `seed`).
template <class Scalar>
struct Inputs {
  T4<Scalar> q, k, v;
  explicit Inputs(Index rows = kT, Index keys = kT, std::uint64_t seed = 99)
      : q({1, 1, rows, kD}), k({1, 1, keys, kD}), v({1, 1, keys, kD}) {
    attn::TorchGenerator gen(seed);
    gen.fill_uniform(q.view(), -1.0, 1.0);
    gen.fill_uniform(k.view(), -1.0, 1.0);
    gen.fill_uniform(v.view(), -1.0, 1.0);
  }
};

// The attention of `in` under `mask` on `path`, with `values` in place of in.v (null: in.v).
template <class Scalar>
T4<Scalar> attend(const Inputs<Scalar>& in, const attn::AttentionMask<Scalar>& mask, Path path,
                  const T4<Scalar>* values = nullptr) {
  T4<Scalar> out({1, 1, in.q.extent(2), kD});
  attn::AttentionOptions options;
  options.path = path.path;
  attn::scaled_dot_product_attention<Scalar>(in.q.view(), in.k.view(),
                                             (values != nullptr ? *values : in.v).view(),
                                             out.view(), mask, options);
  return out;
}

template <class Scalar>
bool row_finite(const T4<Scalar>& out, Index i) {
  for (Index e = 0; e < kD; ++e) {
    if (!std::isfinite(out(0, 0, i, e))) return false;
  }
  return true;
}

template <class Scalar>
class NonFiniteTest : public ::testing::Test {
 protected:
  void TearDown() override { attn::set_isa(attn::best_isa()); }
};
TYPED_TEST_SUITE(NonFiniteTest, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

// Under causal masking, key 40 holds a NaN (in K, or in V, or an infinity in V). Queries
// 0..39 cannot see it: their outputs must equal those of the same inputs with the key
// finite, bit for bit. Queries 40..69 see it: their outputs must not be finite.
TYPED_TEST(NonFiniteTest, CausalFutureKeysNeverReachEarlierQueries) {
  using Scalar = TypeParam;
  const Scalar nan = std::numeric_limits<Scalar>::quiet_NaN();
  const Scalar inf = std::numeric_limits<Scalar>::infinity();
  attn::AttentionMask<Scalar> causal;
  causal.causal();
  const Index bad = 40;
  for (const Isa isa : runnable_sets()) {
    attn::set_isa(isa);
    for (const Path path : kPaths) {
      const Inputs<Scalar> clean;
      const T4<Scalar> expected = attend(clean, causal, path);
      for (int where = 0; where < 3; ++where) {
        Inputs<Scalar> dirty;
        if (where == 0) dirty.k(0, 0, bad, 3) = nan;
        if (where == 1) dirty.v(0, 0, bad, 5) = nan;
        if (where == 2) dirty.v(0, 0, bad, 0) = inf;
        const T4<Scalar> out = attend(dirty, causal, path);
        const std::string at =
            std::string(attn::isa_name(isa)) + " " + path.name + " case " + std::to_string(where);
        for (Index i = 0; i < kT; ++i) {
          if (i < bad) {
            for (Index e = 0; e < kD; ++e) {
              ASSERT_EQ(out(0, 0, i, e), expected(0, 0, i, e)) << at << " query " << i;
            }
          } else {
            EXPECT_FALSE(row_finite(out, i)) << at << " query " << i << " sees key " << bad;
          }
        }
      }
    }
  }
}

// The streaming path over whole key tiles of 128, several query tiles reading each: the
// call marks once which V tiles hold a NaN or an infinity. T 300 (tiles [0, 128), [128, 256)
// and a partial one), causal: a NaN or an infinity in V at key 5, 200 or 280 reaches exactly
// the queries that see it; the others keep the clean inputs' bits.
TYPED_TEST(NonFiniteTest, NonFiniteValuesInWholeKeyTilesReachOnlyTheQueriesThatSeeThem) {
  using Scalar = TypeParam;
  constexpr Index kLong = 300;
  const Scalar nan = std::numeric_limits<Scalar>::quiet_NaN();
  const Scalar inf = std::numeric_limits<Scalar>::infinity();
  attn::AttentionMask<Scalar> causal;
  causal.causal();
  const Inputs<Scalar> in(kLong, kLong, 7);
  const auto attend_long = [&](const T4<Scalar>& values) {
    return attend(in, causal, kPaths[0], &values);
  };
  for (const Isa isa : runnable_sets()) {
    attn::set_isa(isa);
    const T4<Scalar> expected = attend_long(in.v);
    for (const Index bad : {Index(5), Index(200), Index(280)}) {
      for (const Scalar x : {nan, inf}) {
        T4<Scalar> dirty = in.v;
        dirty(0, 0, bad, 3) = x;
        const T4<Scalar> out = attend_long(dirty);
        const std::string at = std::string(attn::isa_name(isa)) + " key " + std::to_string(bad) +
                               (std::isnan(x) ? " NaN" : " inf");
        for (Index i = 0; i < kLong; ++i) {
          for (Index e = 0; e < kD && i < bad; ++e) {
            ASSERT_EQ(out(0, 0, i, e), expected(0, 0, i, e)) << at << " query " << i;
          }
          if (i >= bad) {
            EXPECT_FALSE(std::isfinite(out(0, 0, i, 3))) << at << " query " << i;
          }
        }
      }
    }
  }
}

// A decode step's few query rows (2 queries, 300 keys, causal bottom-right: query 0 sees keys
// 0..298, query 1 all; key 7 blocked for both): the streaming kernel takes each tile's product
// over the value rows unscanned and checks the accumulators after it. A NaN or an infinity in
// V at a key a query cannot see (7 for both, 299 for query 0: both inside a tile the two
// queries multiply, their weight 0) changes none of its bits; at a key it sees (200, 299 for
// query 1), its element is not finite.
TYPED_TEST(NonFiniteTest, DecodeRowsCheckedAfterTheProductKeepTheScannedBits) {
  using Scalar = TypeParam;
  constexpr Index kRows = 2, kLong = 300;
  attn::Tensor<bool, 2> blocked({kRows, kLong});
  blocked.fill(false);
  for (Index i = 0; i < kRows; ++i) blocked(i, 7) = true;
  attn::AttentionMask<Scalar> mask;
  mask.causal(attn::CausalAlignment::kBottomRight).blocked(blocked.view());
  const Inputs<Scalar> in(kRows, kLong, 8);
  const auto attend_rows = [&](const T4<Scalar>& values) {
    return attend(in, mask, kPaths[0], &values);
  };
  const Scalar nan = std::numeric_limits<Scalar>::quiet_NaN();
  const Scalar inf = std::numeric_limits<Scalar>::infinity();
  for (const Isa isa : runnable_sets()) {
    attn::set_isa(isa);
    const T4<Scalar> expected = attend_rows(in.v);
    for (const Index bad : {Index(7), Index(200), Index(299)}) {
      for (const Scalar x : {nan, inf, -inf}) {
        T4<Scalar> dirty = in.v;
        dirty(0, 0, bad, 3) = x;
        const T4<Scalar> out = attend_rows(dirty);
        for (Index i = 0; i < kRows; ++i) {
          const bool sees = bad != 7 && (bad < 299 || i == 1);
          const std::string at = std::string(attn::isa_name(isa)) + " key " + std::to_string(bad) +
                                 " value " + std::to_string(x) + " query " + std::to_string(i);
          for (Index e = 0; e < kD; ++e) {
            if (sees && e == 3) {
              EXPECT_FALSE(std::isfinite(out(0, 0, i, e))) << at;
            } else if (!sees) {
              EXPECT_EQ(out(0, 0, i, e), expected(0, 0, i, e)) << at << " element " << e;
            } else {
              EXPECT_TRUE(std::isfinite(out(0, 0, i, e))) << at << " element " << e;
            }
          }
        }
      }
    }
  }
}

// The same for every element-wise mask kind and for key lengths: key 7 is hidden from every
// query, and NaN in its key and value changes nothing.
TYPED_TEST(NonFiniteTest, HiddenKeysNeverReachAnyQuery) {
  using Scalar = TypeParam;
  const Scalar nan = std::numeric_limits<Scalar>::quiet_NaN();
  const Index hidden = 7;
  attn::Tensor<bool, 2> blocked({kT, kT});
  blocked.fill(false);
  attn::Tensor<Scalar, 2> additive({kT, kT});
  additive.fill(Scalar(0.25));
  attn::Tensor<bool, 2> padding({1, kT});
  padding.fill(false);
  for (Index i = 0; i < kT; ++i) {
    blocked(i, hidden) = true;
    additive(i, hidden) = -std::numeric_limits<Scalar>::infinity();
  }
  padding(0, hidden) = true;
  std::vector<std::pair<std::string, attn::AttentionMask<Scalar>>> masks(4);
  masks[0].first = "blocked";
  masks[0].second.blocked(blocked.view());
  masks[1].first = "additive";
  masks[1].second.additive(additive.view());
  masks[2].first = "key_padding";
  masks[2].second.key_padding(padding.view());
  masks[3].first = "key_lengths";
  masks[3].second.key_lengths({hidden});  // keys >= 7 hidden
  for (const Isa isa : runnable_sets()) {
    attn::set_isa(isa);
    for (const Path path : kPaths) {
      for (const auto& [name, mask] : masks) {
        const Inputs<Scalar> clean;
        Inputs<Scalar> dirty;
        for (Index e = 0; e < kD; ++e) dirty.k(0, 0, hidden, e) = dirty.v(0, 0, hidden, e) = nan;
        if (name == "key_lengths") dirty.v(0, 0, kT - 1, 0) = nan;  // far past the length too
        const T4<Scalar> expected = attend(clean, mask, path), out = attend(dirty, mask, path);
        EXPECT_EQ(out.to_vector(), expected.to_vector())
            << attn::isa_name(isa) << " " << path.name << " " << name;
        for (Index i = 0; i < kT; ++i) ASSERT_TRUE(row_finite(out, i)) << name << " query " << i;
      }
    }
  }
}

// A NaN in one query poisons that query only; an infinite visible score (inf - inf in the
// softmax) gives NaN for the queries that see it.
TYPED_TEST(NonFiniteTest, NonFiniteQueriesAndScoresPoisonTheirOwnRows) {
  using Scalar = TypeParam;
  for (const Isa isa : runnable_sets()) {
    attn::set_isa(isa);
    for (const Path path : kPaths) {
      Inputs<Scalar> in;
      in.q(0, 0, 3, 1) = std::numeric_limits<Scalar>::quiet_NaN();
      in.k(0, 0, 20, 2) = std::numeric_limits<Scalar>::infinity();
      in.q(0, 0, 50, 2) = Scalar(1);  // q50 . k20 = +inf: query 50's softmax is NaN
      attn::AttentionMask<Scalar> causal;
      causal.causal();
      const T4<Scalar> out = attend(in, causal, path);
      for (Index i = 0; i < kT; ++i) {
        // Queries >= 20 see key 20, whose score is +-inf unless q(i, 2) is 0: every one of
        // them has an infinite score, and softmax over it is NaN (inf - inf), or the weight
        // of a -inf score is 0 and the row stays finite. Only check rows decided by the data.
        if (i == 3 || i == 50) {
          EXPECT_FALSE(row_finite(out, i)) << attn::isa_name(isa) << " " << path.name << " " << i;
        } else if (i < 20) {
          EXPECT_TRUE(row_finite(out, i)) << attn::isa_name(isa) << " " << path.name << " " << i;
        }
      }
    }
  }
}

// Scores that overflow to -inf from the data are not a mask: a row whose every visible score
// is -inf is NaN (IEEE, as PyTorch), while a row whose masks hide every key is zeros.
TYPED_TEST(NonFiniteTest, OnlyMasksMakeARowFullyMasked) {
  using Scalar = TypeParam;
  const Scalar huge = std::sqrt(std::numeric_limits<Scalar>::max());
  for (const Isa isa : runnable_sets()) {
    attn::set_isa(isa);
    for (const Path path : kPaths) {
      Inputs<Scalar> in;
      for (Index e = 0; e < kD; ++e) {
        in.q(0, 0, 10, e) = huge;
        for (Index j = 0; j < kT; ++j) in.k(0, 0, j, e) = -huge;
      }
      // Query 10's scores are -huge * huge * d: -inf in Scalar. The other queries' are large
      // but finite, and equal for every key (uniform weights).
      attn::AttentionMask<Scalar> lengths;
      lengths.key_lengths({kT});
      const T4<Scalar> out = attend(in, lengths, path);
      EXPECT_FALSE(row_finite(out, 10)) << attn::isa_name(isa) << " " << path.name;
      EXPECT_TRUE(std::isnan(out(0, 0, 10, 0))) << attn::isa_name(isa) << " " << path.name;
      EXPECT_TRUE(row_finite(out, 11));
      // Masks that hide every key: zeros, NaN keys and values notwithstanding.
      attn::AttentionMask<Scalar> none;
      none.key_lengths({0});
      in.k(0, 0, 0, 0) = in.v(0, 0, 1, 1) = std::numeric_limits<Scalar>::quiet_NaN();
      const T4<Scalar> zeros = attend(in, none, path);
      for (const Scalar x : zeros.to_vector()) ASSERT_EQ(x, Scalar(0)) << path.name;
    }
  }
}

// The weights the materialised path returns follow the same rules.
TYPED_TEST(NonFiniteTest, WeightsOfHiddenNaNKeysAreZero) {
  using Scalar = TypeParam;
  for (const Isa isa : runnable_sets()) {
    attn::set_isa(isa);
    Inputs<Scalar> in;
    in.k(0, 0, 60, 0) = std::numeric_limits<Scalar>::quiet_NaN();
    attn::AttentionMask<Scalar> causal;
    causal.causal();
    T4<Scalar> out({1, 1, kT, kD}), weights({1, 1, kT, kT});
    attn::scaled_dot_product_attention_with_weights<Scalar>(in.q.view(), in.k.view(), in.v.view(),
                                                            out.view(), weights.view(), causal);
    for (Index i = 0; i < 60; ++i) {
      Scalar sum = 0;
      for (Index j = 0; j < kT; ++j) {
        ASSERT_TRUE(std::isfinite(weights(0, 0, i, j))) << i << "," << j;
        sum += weights(0, 0, i, j);
      }
      EXPECT_NEAR(sum, Scalar(1), Scalar(1e-5)) << attn::isa_name(isa) << " row " << i;
    }
    EXPECT_TRUE(std::isnan(weights(0, 0, 60, 0))) << attn::isa_name(isa);
  }
}

}  // namespace
}  // namespace nonfinite_test

#include "support/bodies_end.hpp"
