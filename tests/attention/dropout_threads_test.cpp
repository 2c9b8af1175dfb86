// SPDX-License-Identifier: MIT
// tests/attention/dropout_threads_test.cpp: dropout on the attention weights (p = 0 and
// eval identity, seeding and determinism, the 1/(1-p) scale, keep rate, both kernel paths
// dropping the same weights) and thread-count invariance: results for 1, 2 and 3 OpenMP
// threads are compared byte for byte, for both kernel paths and MultiHeadAttention, with
// and without dropout.
//
// Tolerances: outputs against the reference use ref::kernel_tolerance ((d + T_k) eps, see
// reference_attention.hpp) divided by (1 - p), since kept weights are scaled by 1/(1 - p).
// Kept weights are compared with the undropped weight times 1/(1 - p) to 2 ulp (one
// rounding of the product, one of the reciprocal).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attention/reference_attention.hpp"
#include "attn/attn.hpp"
#include "support/test_support.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace dropout_threads_test {

namespace {

using attn::AttentionMask;
using attn::AttentionOptions;
using attn::AttentionPath;
using attn::CausalAlignment;
using attn::Index;
using attn::MultiHeadAttention;
using attn::MultiHeadAttentionOptions;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
namespace ref = attn::test::ref;

constexpr AttentionPath kPaths[] = {AttentionPath::kMaterialized, AttentionPath::kStreaming};

const char* name(AttentionPath path) {
  return path == AttentionPath::kMaterialized ? "materialized" : "streaming";
}

/// Restores the thread count (attn's and Eigen's) when the test ends.
class ThreadCountGuard {
 public:
  ThreadCountGuard() : saved_(attn::num_threads()) {}
  ~ThreadCountGuard() { attn::set_num_threads(saved_); }
  ThreadCountGuard(const ThreadCountGuard&) = delete;
  ThreadCountGuard& operator=(const ThreadCountGuard&) = delete;

 private:
  int saved_;
};

constexpr int kThreadCounts[] = {1, 2, 3};

/// Byte equality of two tensors' storage.
template <class Scalar, std::size_t Rank>
::testing::AssertionResult same_bytes(const Tensor<Scalar, Rank>& a,
                                      const Tensor<Scalar, Rank>& b) {
  if (a.shape() != b.shape()) return ::testing::AssertionFailure() << "shapes differ";
  if (std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(Scalar)) == 0) {
    return ::testing::AssertionSuccess();
  }
  return ref::same_bits(a.view(), b.view());  // names the first differing element
}

template <class Scalar>
class DropoutAndThreads : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(DropoutAndThreads, Scalars, );

// ---------------------------------------------------------------- threads

TEST(Threads, OpenMpThreadCountCanBeSet) {
  // Without OpenMP every invariance test below would pass trivially: say so.
#if !ATTN_HAS_OPENMP
  GTEST_SKIP() << "built without OpenMP (ATTN_OPENMP=OFF): one thread only";
#endif
  ThreadCountGuard guard;
  attn::set_num_threads(3);
  EXPECT_EQ(attn::num_threads(), 3);
  attn::set_num_threads(1);
  EXPECT_EQ(attn::num_threads(), 1);
}

TEST(Threads, GuardRestoresTheThreadCount) {
  const int before = attn::num_threads();
  {
    ThreadCountGuard guard;
    attn::set_num_threads(before == 2 ? 3 : 2);
  }
  EXPECT_EQ(attn::num_threads(), before);
}

struct KernelCase {
  Index b, h, tq, tk, d, dv;
  bool masked;
};

TYPED_TEST(DropoutAndThreads, KernelIsBitIdenticalForOneTwoAndThreeThreads) {
  using Scalar = TypeParam;
  ThreadCountGuard guard;
  const KernelCase cases[] = {
      {2, 3, 200, 230, 16, 8, true},   // 24 tasks over (batch, head, query tile)
      {1, 1, 64, 300, 64, 64, false},  // a single task: the products may thread instead
      {1, 2, 130, 260, 8, 8, false},
  };
  for (const KernelCase& c : cases) {
    const auto q = attn::test::random_tensor<Scalar>(Shape<4>{c.b, c.h, c.tq, c.d}, 1);
    const auto k = attn::test::random_tensor<Scalar>(Shape<4>{c.b, c.h, c.tk, c.d}, 2);
    const auto v = attn::test::random_tensor<Scalar>(Shape<4>{c.b, c.h, c.tk, c.dv}, 3);
    const auto pad = ref::random_bools(Shape<2>{c.b, c.tk}, 4, 0.2);
    AttentionMask<Scalar> mask;
    if (c.masked) mask.causal(CausalAlignment::kBottomRight).key_padding(pad.view());
    for (const double p : {0.0, 0.2}) {
      AttentionOptions options;
      options.dropout = p;
      options.dropout_seed = 99;
      options.dropout_call = 5;
      for (const AttentionPath path : kPaths) {
        SCOPED_TRACE(std::string(name(path)) + " T_q=" + std::to_string(c.tq) +
                     " p=" + std::to_string(p));
        const bool weights = path == AttentionPath::kMaterialized;
        Tensor<Scalar, 4> first_out, first_weights;
        for (const int threads : kThreadCounts) {
          attn::set_num_threads(threads);
          Tensor<Scalar, 4> w;
          auto out = ref::run_kernel<Scalar>(q.view(), k.view(), v.view(), mask, options, path,
                                             weights ? &w : nullptr);
          if (threads == 1) {
            first_out = std::move(out);
            first_weights = std::move(w);
            continue;
          }
          EXPECT_TRUE(same_bytes(out, first_out)) << threads << " threads";
          if (weights) {
            EXPECT_TRUE(same_bytes(w, first_weights)) << threads << " threads";
          }
        }
      }
    }
  }
}

TYPED_TEST(DropoutAndThreads, MultiHeadForwardIsBitIdenticalForOneTwoAndThreeThreads) {
  using Scalar = TypeParam;
  ThreadCountGuard guard;
  struct Config {
    Index b, t, d, heads;
  };
  // Large enough that a GEMM in the projections could use several threads; the second is
  // GPT-2's width with one query tile per head. Unoptimised (sanitizer) builds use smaller
  // widths, still with several query tiles and blocks.
  const std::vector<Config> configs = ref::kOptimizedBuild
                                          ? std::vector<Config>{{2, 256, 128, 4}, {1, 64, 768, 12}}
                                          : std::vector<Config>{{2, 130, 64, 4}, {1, 64, 192, 3}};
  for (const Config& c : configs) {
    SCOPED_TRACE("B=" + std::to_string(c.b) + " T=" + std::to_string(c.t) +
                 " D=" + std::to_string(c.d));
    attn::manual_seed(1);
    MultiHeadAttention<Scalar> mha(c.d, c.d, c.t, /*dropout=*/0.1, c.heads, /*qkv_bias=*/true);
    const auto x = attn::test::random_tensor<Scalar>(Shape<3>{c.b, c.t, c.d}, 5);
    for (const bool training : {false, true}) {
      SCOPED_TRACE(training ? "train (dropout 0.1)" : "eval");
      mha.train(training);
      Tensor<Scalar, 3> first;
      Tensor<Scalar, 4> first_weights;
      for (const int threads : kThreadCounts) {
        attn::set_num_threads(threads);
        mha.seed(11);
        auto y = mha.forward(x.view());
        mha.seed(11);
        auto r = mha.forward_with_weights(x.view());
        if (threads == 1) {
          first = std::move(y);
          first_weights = std::move(r.weights);
          continue;
        }
        EXPECT_TRUE(same_bytes(y, first)) << threads << " threads";
        EXPECT_TRUE(same_bytes(r.weights, first_weights)) << threads << " threads";
      }
    }
  }
}

TYPED_TEST(DropoutAndThreads, CrossAttentionIsBitIdenticalForOneTwoAndThreeThreads) {
  using Scalar = TypeParam;
  ThreadCountGuard guard;
  struct Config {
    Index b, heads, tq;
  };
  // The second has a single (batch, head, query tile) task.
  for (const Config& c : {Config{2, 4, 100}, Config{1, 1, 64}}) {
    SCOPED_TRACE("B=" + std::to_string(c.b) + " H=" + std::to_string(c.heads) +
                 " T_q=" + std::to_string(c.tq));
    const Index tk = 300, d = 64;
    auto options = MultiHeadAttentionOptions::pytorch(d, c.heads, true, 0, 0, /*dropout=*/0.2);
    attn::TorchGenerator gen(6);
    MultiHeadAttention<Scalar> mha(options, gen);
    const auto query = attn::test::random_tensor<Scalar>(Shape<3>{c.b, c.tq, d}, 7);
    const auto kv = attn::test::random_tensor<Scalar>(Shape<3>{c.b, tk, d}, 8);
    for (const bool training : {false, true}) {
      SCOPED_TRACE(training ? "train (dropout 0.2)" : "eval");
      mha.train(training);
      Tensor<Scalar, 3> first, first_materialized;
      for (const int threads : kThreadCounts) {
        attn::set_num_threads(threads);
        mha.seed(12);
        auto y = mha.forward(query.view(), kv.view(), kv.view());  // streaming
        mha.seed(12);
        auto r = mha.forward_with_weights(query.view(), kv.view(), kv.view());  // materialised
        if (threads == 1) {
          first = std::move(y);
          first_materialized = std::move(r.output);
          continue;
        }
        EXPECT_TRUE(same_bytes(y, first)) << threads << " threads, streaming";
        EXPECT_TRUE(same_bytes(r.output, first_materialized))
            << threads << " threads, materialized";
      }
    }
  }
}

// ---------------------------------------------------------------- dropout: identities

TYPED_TEST(DropoutAndThreads, KernelDropoutZeroIsIdentity) {
  using Scalar = TypeParam;
  const auto q = attn::test::random_tensor<Scalar>(Shape<4>{2, 2, 100, 8}, 10);
  const auto k = attn::test::random_tensor<Scalar>(Shape<4>{2, 2, 150, 8}, 11);
  AttentionOptions zero;
  zero.dropout = 0.0;
  zero.dropout_seed = 1234;
  zero.dropout_call = 3;
  for (const AttentionPath path : kPaths) {
    SCOPED_TRACE(name(path));
    const auto plain = ref::run_kernel<Scalar>(q.view(), k.view(), k.view(), {}, {}, path);
    const auto with_zero = ref::run_kernel<Scalar>(q.view(), k.view(), k.view(), {}, zero, path);
    EXPECT_TRUE(same_bytes(plain, with_zero));
  }
}

TYPED_TEST(DropoutAndThreads, ModulesInEvalModeIgnoreDropout) {
  using Scalar = TypeParam;
  const Index b = 2, t = 60, d = 8;
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{b, t, d}, 12);
  {
    attn::manual_seed(3);
    MultiHeadAttention<Scalar> dropped(d, d, t, 0.5, 2);
    attn::manual_seed(3);
    const MultiHeadAttention<Scalar> plain(d, d, t, 0.0, 2);
    EXPECT_TRUE(dropped.is_training());  // modules start in training mode, like PyTorch
    EXPECT_FALSE(same_bytes(dropped.forward(x.view()), plain.forward(x.view())));
    dropped.eval();
    EXPECT_FALSE(dropped.is_training());
    EXPECT_TRUE(same_bytes(dropped.forward(x.view()), plain.forward(x.view())));
  }
  {
    attn::manual_seed(4);
    attn::CausalAttention<Scalar> dropped(d, 4, t, 0.5);
    attn::manual_seed(4);
    const attn::CausalAttention<Scalar> plain(d, 4, t, 0.0);
    dropped.eval();
    EXPECT_TRUE(same_bytes(dropped.forward(x.view()), plain.forward(x.view())));
  }
  {
    attn::manual_seed(5);
    attn::MultiHeadAttentionWrapper<Scalar> dropped(d, 4, t, 0.5, 2);
    attn::manual_seed(5);
    const attn::MultiHeadAttentionWrapper<Scalar> plain(d, 4, t, 0.0, 2);
    dropped.eval();
    EXPECT_TRUE(same_bytes(dropped.forward(x.view()), plain.forward(x.view())));
  }
  {
    attn::manual_seed(6);
    attn::CrossAttention<Scalar> dropped(d, 5, d, 2, false, 0.5);
    attn::manual_seed(6);
    const attn::CrossAttention<Scalar> plain(d, 5, d, 2, false, 0.0);
    const auto kv = attn::test::random_tensor<Scalar>(Shape<3>{b, 90, 5}, 13);
    dropped.eval();
    EXPECT_TRUE(
        same_bytes(dropped.forward(x.view(), kv.view()), plain.forward(x.view(), kv.view())));
  }
}

TYPED_TEST(DropoutAndThreads, ModuleWithDropoutZeroInTrainingEqualsEval) {
  using Scalar = TypeParam;
  attn::manual_seed(7);
  MultiHeadAttention<Scalar> mha(8, 8, 40, 0.0, 2);
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{2, 40, 8}, 14);
  ASSERT_TRUE(mha.is_training());
  const auto train = mha.forward(x.view());
  mha.eval();
  EXPECT_TRUE(same_bytes(train, mha.forward(x.view())));
}

// ---------------------------------------------------------------- dropout: determinism

TYPED_TEST(DropoutAndThreads, SameSeedGivesSameOutputAndSuccessiveCallsDiffer) {
  using Scalar = TypeParam;
  const Index t = 80, d = 16;
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{2, t, d}, 15);
  attn::manual_seed(8);
  MultiHeadAttention<Scalar> a(d, d, t, 0.3, 4);
  attn::manual_seed(8);
  MultiHeadAttention<Scalar> b(d, d, t, 0.3, 4);
  a.seed(21);
  b.seed(21);
  const auto a1 = a.forward(x.view());
  const auto b1 = b.forward(x.view());
  EXPECT_TRUE(same_bytes(a1, b1)) << "same weights, same seed";
  const auto a2 = a.forward(x.view());
  EXPECT_FALSE(same_bytes(a1, a2)) << "successive calls draw new masks";
  a.seed(21);
  EXPECT_TRUE(same_bytes(a.forward(x.view()), a1)) << "seed() restarts the stream";
  EXPECT_TRUE(same_bytes(a.forward(x.view()), a2));
  b.seed(22);
  EXPECT_FALSE(same_bytes(b.forward(x.view()), a1)) << "another seed, other masks";
}

TYPED_TEST(DropoutAndThreads, CausalAttentionDropoutIsSeededAndAdvances) {
  using Scalar = TypeParam;
  attn::manual_seed(9);
  attn::CausalAttention<Scalar> ca(6, 4, 50, 0.4);
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{2, 50, 6}, 16);
  ca.seed(5);
  const auto first = ca.forward(x.view());
  const auto second = ca.forward(x.view());
  EXPECT_FALSE(same_bytes(first, second));
  ca.seed(5);
  EXPECT_TRUE(same_bytes(ca.forward(x.view()), first));
}

// ---------------------------------------------------------------- dropout: what is dropped

/// The materialised weights with dropout, the undropped weights, and the keep decisions
/// read off them (a weight of 0 where the undropped one is positive was dropped).
template <class Scalar>
struct Dropped {
  Tensor<Scalar, 4> out, weights, weights0;
  std::vector<char> keep;
  Index dropped = 0, visible = 0;
};

template <class Scalar>
Dropped<Scalar> run_dropped(TensorView<const Scalar, 4> q, TensorView<const Scalar, 4> k,
                            TensorView<const Scalar, 4> v, const AttentionMask<Scalar>& mask,
                            const AttentionOptions& options) {
  Dropped<Scalar> r;
  r.out = ref::run_kernel<Scalar>(q, k, v, mask, options, AttentionPath::kMaterialized, &r.weights);
  ref::run_kernel<Scalar>(q, k, v, mask, {}, AttentionPath::kMaterialized, &r.weights0);
  r.keep.resize(static_cast<std::size_t>(r.weights.size()));
  for (Index i = 0; i < r.weights.size(); ++i) {
    const bool visible = r.weights0.data()[i] > Scalar(0);
    r.keep[static_cast<std::size_t>(i)] = r.weights.data()[i] != Scalar(0);
    r.visible += visible;
    r.dropped += visible && r.weights.data()[i] == Scalar(0);
  }
  return r;
}

TYPED_TEST(DropoutAndThreads, KeptWeightsAreSoftmaxOverOneMinusPAndKeepRateIsP) {
  using Scalar = TypeParam;
  const Index b = 2, h = 2, t = 128, d = 8;
  const auto q = attn::test::random_tensor<Scalar>(Shape<4>{b, h, t, d}, 17);
  const auto k = attn::test::random_tensor<Scalar>(Shape<4>{b, h, t, d}, 18);
  for (const double p : {0.1, 0.5, 0.9}) {
    SCOPED_TRACE("p=" + std::to_string(p));
    AttentionOptions options;
    options.dropout = p;
    options.dropout_seed = 31;
    const auto r = run_dropped<Scalar>(q.view(), k.view(), k.view(), {}, options);
    ASSERT_EQ(r.visible, r.weights.size());  // no mask: every undropped weight is positive
    const Scalar scale = Scalar(1) / static_cast<Scalar>(1.0 - p);
    for (Index i = 0; i < r.weights.size(); ++i) {
      const Scalar w = r.weights.data()[i];
      if (w == Scalar(0)) continue;
      const Scalar expected = r.weights0.data()[i] * scale;
      ASSERT_NEAR(w, expected, 2 * std::numeric_limits<Scalar>::epsilon() * expected)
          << "element " << i;
    }
    // 65536 Bernoulli(p) draws: the standard deviation of the rate is <= 0.002.
    const double rate = static_cast<double>(r.dropped) / static_cast<double>(r.visible);
    EXPECT_NEAR(rate, p, 0.01);
  }
}

TYPED_TEST(DropoutAndThreads, BothPathsDropTheSameWeights) {
  using Scalar = TypeParam;
  const Index b = 2, h = 2, tq = 150, tk = 270, d = 8, dv = 6;
  const double p = 0.3;
  const auto q = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tq, d}, 19);
  const auto k = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tk, d}, 20);
  const auto v = attn::test::random_tensor<Scalar>(Shape<4>{b, h, tk, dv}, 21);
  const auto pad = ref::random_bools(Shape<2>{b, tk}, 22, 0.2);
  AttentionMask<Scalar> mask;
  mask.causal(CausalAlignment::kBottomRight).key_padding(pad.view());
  AttentionOptions options;
  options.dropout = p;
  options.dropout_seed = 77;
  options.dropout_call = 4;
  const auto r = run_dropped<Scalar>(q.view(), k.view(), v.view(), mask, options);
  EXPECT_GT(r.dropped, 0);
  ref::DenseMask dense(b, h, tq, tk);
  dense.causal(CausalAlignment::kBottomRight).key_padding(pad.view());
  const auto expected = ref::attention(q.view(), k.view(), v.view(), dense,
                                       1 / std::sqrt(ref::Real(d)), &r.keep, ref::Real(p));
  const double tol = ref::kernel_tolerance<Scalar>(d, tk) / (1 - p);
  EXPECT_TRUE(ref::all_near(r.out.view(), expected.output.view(), tol)) << "materialized";
  const auto streaming = ref::run_kernel<Scalar>(q.view(), k.view(), v.view(), mask, options,
                                                 AttentionPath::kStreaming);
  EXPECT_TRUE(ref::all_near(streaming.view(), expected.output.view(), tol)) << "streaming";
  const auto materialized_no_weights = ref::run_kernel<Scalar>(
      q.view(), k.view(), v.view(), mask, options, AttentionPath::kMaterialized);
  EXPECT_TRUE(same_bytes(materialized_no_weights, r.out));
  // Another call number draws other masks.
  AttentionOptions next = options;
  next.dropout_call = 5;
  const auto other =
      ref::run_kernel<Scalar>(q.view(), k.view(), v.view(), mask, next, AttentionPath::kStreaming);
  EXPECT_FALSE(ref::all_near(other.view(), streaming.view(), 1e-3));
}

TYPED_TEST(DropoutAndThreads, MultiHeadStreamingAndWeightsPathsDropTheSame) {
  using Scalar = TypeParam;
  const Index b = 2, t = 200, d = 16, heads = 2;
  const double p = 0.25;
  attn::manual_seed(10);
  MultiHeadAttention<Scalar> mha(d, d, t, p, heads, true);
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{b, t, d}, 23);
  mha.seed(3);
  const auto streamed = mha.forward(x.view());
  mha.seed(3);
  const auto with_weights = mha.forward_with_weights(x.view());
  const double tol = (ref::kernel_tolerance<Scalar>(d / heads, t) +
                      static_cast<double>(2 * d) * std::numeric_limits<Scalar>::epsilon()) /
                     (1 - p);
  EXPECT_TRUE(ref::all_near(streamed.view(), with_weights.output.view(), tol));
  // The weights carry the drops: about p of the visible (causal) weights are 0.
  Index visible = 0, dropped = 0;
  for (Index bi = 0; bi < b; ++bi)
    for (Index h = 0; h < heads; ++h)
      for (Index i = 0; i < t; ++i)
        for (Index j = 0; j <= i; ++j) {
          ++visible;
          dropped += with_weights.weights(bi, h, i, j) == Scalar(0);
        }
  EXPECT_NEAR(static_cast<double>(dropped) / static_cast<double>(visible), p, 0.01);
}

}  // namespace

}  // namespace dropout_threads_test

#include "support/bodies_end.hpp"
