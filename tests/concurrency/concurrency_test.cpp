// SPDX-License-Identifier: MIT
// tests/concurrency/concurrency_test.cpp: the safe side of the thread-safety contract
// (docs/design.md, "Threads and determinism"): const members (forward, forward_with_weights,
// named_parameters() const) on one module from several std::threads at once, each with its own
// Workspace, give the single-threaded results bit for bit (in training mode: the same set of
// dropout draws).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>
#include <utility>
#include <vector>

#include "attn/attn.hpp"
#include "support/test_support.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace {

constexpr int kThreads = 4;
constexpr int kRepeats = 5;

template <class Scalar>
void check_mha_threads() {
  attn::TorchGenerator gen(42);
  auto options = attn::MultiHeadAttentionOptions::pytorch(32, 4, true, 24, 40);
  const attn::MultiHeadAttention<Scalar> mha(options, gen);
  // a different query per thread, keys/values shared; masks shared too (read-only)
  const auto key = attn::test::random_tensor<Scalar, 3>({2, 9, 24}, 1);
  const auto value = attn::test::random_tensor<Scalar, 3>({2, 9, 40}, 2);
  attn::Tensor<bool, 2> padding({2, 9});
  padding(1, 7) = padding(1, 8) = true;
  attn::AttentionMask<Scalar> mask;
  mask.key_padding(padding).causal(attn::CausalAlignment::kBottomRight);
  std::vector<attn::Tensor<Scalar, 3>> queries, expected;
  for (int t = 0; t < kThreads; ++t) {
    queries.push_back(attn::test::random_tensor<Scalar, 3>({2, 7, 32}, 100 + t));
    expected.push_back(mha.forward(queries.back().view(), key.view(), value.view(), mask));
  }
  const auto expected_weights =
      mha.forward_with_weights(queries[0].view(), key.view(), value.view(), mask);

  std::vector<std::vector<Scalar>> outputs(kThreads), weights(kThreads);
  std::vector<char> stable(kThreads, 1);  // not vector<bool>: threads write neighbours
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      attn::Workspace ws;  // one per thread
      attn::Tensor<Scalar, 3> out({2, 7, 32});
      for (int r = 0; r < kRepeats; ++r) {
        mha.forward(queries[t].view(), key.view(), value.view(), out.view(), ws, mask);
        if (r > 0 && out.to_vector() != outputs[t]) stable[t] = 0;
        outputs[t] = out.to_vector();
      }
      weights[t] = mha.forward_with_weights(queries[0].view(), key.view(), value.view(), mask)
                       .weights.to_vector();
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_TRUE(stable[t]) << "thread " << t;
    EXPECT_EQ(outputs[t], expected[t].to_vector()) << "thread " << t;
    EXPECT_EQ(weights[t], expected_weights.weights.to_vector()) << "thread " << t;
  }
}

TEST(Concurrency, ConstMultiHeadAttentionForwardFromThreadsMatchesSingleThreadFloat) {
  check_mha_threads<float>();
}

TEST(Concurrency, ConstMultiHeadAttentionForwardFromThreadsMatchesSingleThreadDouble) {
  check_mha_threads<double>();
}

TEST(Concurrency, ConstSelfAttentionForwardFromThreadsMatchesSingleThread) {
  attn::manual_seed(123);
  attn::CausalAttention<float> ca(16, 8, 12, 0.0, true);
  ca.eval();
  const attn::CausalAttention<float>& shared = ca;
  const auto x = attn::test::random_tensor<float, 3>({3, 12, 16}, 7);
  const auto expected = shared.forward(x.view()).to_vector();
  std::vector<std::vector<float>> outputs(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      attn::Workspace ws;
      attn::Tensor<float, 3> out({3, 12, 8});
      for (int r = 0; r < kRepeats; ++r) shared.forward(x.view(), out.view(), ws);
      outputs[t] = out.to_vector();
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(outputs[t], expected) << "thread " << t;
}

// Training mode: each call draws the dropout masks of its own call number (the counter is
// atomic). Calls from several threads get distinct numbers, so together they give exactly
// the outputs of as many calls in a row, in some order. named_parameters() const, read
// meanwhile, sees the weights unchanged.
TEST(Concurrency, TrainingModeCallsFromThreadsDrawDistinctDropoutCalls) {
  attn::TorchGenerator gen(9);
  attn::MultiHeadAttention<float> mha(
      attn::MultiHeadAttentionOptions::pytorch(16, 2, true, 0, 0, 0.3), gen);
  const auto x = attn::test::random_tensor<float, 3>({2, 10, 16}, 3);
  constexpr int kCalls = kThreads * kRepeats;
  mha.seed(5);
  std::vector<std::vector<float>> sequential;
  for (int c = 0; c < kCalls; ++c) sequential.push_back(mha.forward(x.view()).to_vector());
  const std::vector<float> weights_before =
      attn::test::to_vector(std::as_const(mha).named_parameters()[0].matrix());

  mha.seed(5);
  const attn::MultiHeadAttention<float>& shared = mha;
  std::vector<std::vector<float>> outputs(kCalls);
  std::vector<char> weights_unchanged(kThreads, 1);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      attn::Workspace ws;
      attn::Tensor<float, 3> out({2, 10, 16});
      for (int r = 0; r < kRepeats; ++r) {
        shared.forward(x.view(), out.view(), ws);
        outputs[static_cast<std::size_t>(t * kRepeats + r)] = out.to_vector();
        if (attn::test::to_vector(shared.named_parameters()[0].matrix()) != weights_before) {
          weights_unchanged[static_cast<std::size_t>(t)] = 0;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_TRUE(weights_unchanged[t]) << "thread " << t;
  std::sort(sequential.begin(), sequential.end());
  std::sort(outputs.begin(), outputs.end());
  EXPECT_EQ(outputs, sequential);
  EXPECT_EQ(std::adjacent_find(sequential.begin(), sequential.end()), sequential.end())
      << "dropout made every call differ";
}

}  // namespace

#include "support/bodies_end.hpp"
