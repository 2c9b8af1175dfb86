// SPDX-License-Identifier: MIT
// tests/attention/module_backward_test.cpp: every module's backward (attention/
// module_backward.hpp through the module API): central finite differences in double of the
// module's own forward for the inputs and every parameter, with masks, for the simple,
// single-head v1 (raw transposed parameters) and v2, causal, wrapper, multi-head (fused,
// separate kdim/vdim, self, cross, key = value; grouped-query, rotary, windowed; value heads
// of their own size) and
// cross-attention classes; unbatched
// inputs; bit-identical gradients for 1, 2 and 3 threads; accumulation; the checks.
// (PyTorch's own gradients: tests/parity/grad_fixtures_test.cpp.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "support/finite_difference.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace module_backward_test {

namespace {

using attn::AttentionMask;
using attn::Index;
using attn::Shape;
using attn::Tensor;
namespace fd = attn::test::fd;

constexpr Index kB = 2, kT = 5, kTk = 6, kD = 6;

Tensor<double, 3> input(Index t, Index d, std::uint64_t seed) {
  return attn::test::random_tensor<double>(Shape<3>{kB, t, d}, seed);
}

/// Checks module m's backward against finite differences of its forward: `forward(out)`
/// runs the module's inference forward on the inputs into out; `backward(grad_out, grads,
/// input grads)` its training forward and backward. Inputs are perturbed through `inputs`,
/// parameters through the module's named_parameters().
template <class Module>
void check_module(
    Module& m, std::vector<Tensor<double, 3>*> inputs, const Shape<3>& out_shape,
    const std::function<void(attn::TensorView<double, 3>)>& forward,
    const std::function<void(attn::TensorView<const double, 3>, attn::Gradients<double>&,
                             std::vector<Tensor<double, 3>>&)>& backward) {
  const auto w = attn::test::random_tensor<double>(out_shape, 99);
  attn::Gradients<double> grads(m.named_parameters());
  std::vector<Tensor<double, 3>> input_grads;
  for (const auto* x : inputs) input_grads.emplace_back(x->shape());
  backward(w.view(), grads, input_grads);
  std::vector<fd::Variable> variables;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    variables.push_back(
        fd::variable("input " + std::to_string(i), inputs[i]->view(), input_grads[i].view()));
  }
  const auto params = m.named_parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    variables.push_back(fd::variable(params[i].name(), params[i].matrix(), grads[i].matrix()));
  }
  const auto loss = [&] {
    Tensor<double, 3> out(out_shape);
    forward(out.view());
    return fd::weighted_sum(out.view(), w.view());
  };
  EXPECT_TRUE(fd::check(loss, variables));
}

/// A module with one input x (B, T, d_in): SimpleSelfAttention, SelfAttention, ... .
template <class Module>
void check_self(Module& m, Index d_in, Index d_out, const AttentionMask<double>& mask = {}) {
  Tensor<double, 3> x = input(kT, d_in, 1);
  attn::Workspace ws;
  check_module(
      m, {&x}, {kB, kT, d_out},
      [&](attn::TensorView<double, 3> out) { m.forward(x.view(), out, ws, mask); },
      [&](attn::TensorView<const double, 3> w, attn::Gradients<double>& grads,
          std::vector<Tensor<double, 3>>& g) {
        attn::SavedForward<double> saved;
        Tensor<double, 3> out({kB, kT, d_out});
        m.forward(x.view(), out.view(), saved, ws, mask);
        m.backward(w, saved, g[0].view(), grads, ws);
      });
}

TEST(ModuleBackward, SimpleSelfAttentionMatchesFiniteDifferences) {
  attn::SimpleSelfAttention<double> m;
  check_self(m, kD, kD);
  AttentionMask<double> mask;
  mask.causal().key_lengths({kT, 3});
  attn::SimpleSelfAttention<double> scaled(true);
  check_self(scaled, kD, kD, mask);
}

TEST(ModuleBackward, SelfAttentionV1AndV2MatchFiniteDifferences) {
  attn::manual_seed(1);
  attn::SelfAttention<double> v1(kD, 4, attn::kRandInit);  // raw (d_in, d_out) parameters
  check_self(v1, kD, 4);
  attn::SelfAttention<double> v2(kD, 4, /*qkv_bias=*/true);
  AttentionMask<double> mask;
  mask.key_lengths({kT, 2});
  check_self(v2, kD, 4, mask);
}

TEST(ModuleBackward, CausalAttentionAndWrapperMatchFiniteDifferences) {
  attn::manual_seed(2);
  attn::CausalAttention<double> causal(kD, 4, 7, 0.0, true);
  check_self(causal, kD, 4);
  attn::MultiHeadAttentionWrapper<double> wrapper(kD, 3, 7, 0.0, 2, true);
  Tensor<bool, 2> padding({kB, kT});
  padding(1, 1) = true;
  AttentionMask<double> mask;
  mask.key_padding(padding.view());
  check_self(wrapper, kD, 6, mask);
}

TEST(ModuleBackward, MultiHeadSelfAttentionMatchesFiniteDifferences) {
  attn::manual_seed(3);
  attn::MultiHeadAttention<double> notebook(kD, kD, 7, 0.0, 2, true);  // causal, out_proj bias
  check_self(notebook, kD, kD);
  attn::MultiHeadAttention<double> torch_like(
      attn::MultiHeadAttentionOptions::pytorch(kD, 3, /*bias=*/false));
  Tensor<bool, 2> blocked({kT, kT});
  blocked(0, 1) = blocked(2, 4) = true;
  Tensor<double, 2> additive({kT, kT});
  additive(3, 0) = -0.5;
  AttentionMask<double> mask;
  mask.blocked(blocked.view()).additive(additive.view());
  check_self(torch_like, kD, kD, mask);
}

// Llama-style layers: grouped-query and multi-query heads (dK, dV summed over each group),
// rotary embeddings in both pair conventions (dQ, dK rotated back by R^T), partial rotary,
// a sliding window, an explicit head_dim, value heads of another size (value_head_dim).
TEST(ModuleBackward, GroupedQueryRotaryAndWindowedAttentionMatchFiniteDifferences) {
  attn::manual_seed(8);
  struct Config {
    Index kv_heads, rotary_dim, window;
    attn::RopeStyle style;
    bool bias;
    Index value_head_dim;
  };
  const Config configs[] = {
      {2, 4, 0, attn::RopeStyle::kHalfSplit, true, 0},
      {1, 2, 2, attn::RopeStyle::kInterleaved, false, 0},
      {4, 0, 3, attn::RopeStyle::kHalfSplit, false, 0},  // MHA with a window
      {2, 0, 0, attn::RopeStyle::kHalfSplit, false, 0},  // no rope: GQA alone
      {2, 4, 2, attn::RopeStyle::kHalfSplit, true, 3},   // value heads narrower (DeepSeek)
      {4, 0, 0, attn::RopeStyle::kHalfSplit, false, 5},  // and wider
  };
  for (const Config& c : configs) {
    SCOPED_TRACE("H_kv " + std::to_string(c.kv_heads) + ", rotary_dim " +
                 std::to_string(c.rotary_dim) + ", window " + std::to_string(c.window) +
                 ", value_head_dim " + std::to_string(c.value_head_dim));
    attn::MultiHeadAttentionOptions o;
    o.d_in = kD;
    o.num_heads = 4;
    o.num_kv_heads = c.kv_heads;
    o.head_dim = 4;
    o.value_head_dim = c.value_head_dim;
    o.qkv_bias = c.bias;
    o.out_bias = c.bias;
    o.causal = true;
    o.sliding_window = c.window;
    if (c.rotary_dim > 0) {
      o.rope.head_dim = 4;
      o.rope.rotary_dim = c.rotary_dim;
      o.rope.style = c.style;
      o.rope.theta = 100.0;  // angles that turn noticeably over 5 positions
    }
    attn::MultiHeadAttention<double> m(o);
    check_self(m, kD, kD);
  }
}

// Three inputs: separate weights (kdim/vdim), a fused weight read by three tensors, and key =
// value (one tensor, one gradient view given twice); each also with value heads of another
// size (value_head_dim: W_v's GEMMs apart from W_q's and W_k's).
TEST(ModuleBackward, MultiHeadCrossAttentionMatchesFiniteDifferences) {
  attn::manual_seed(4);
  struct Config {
    Index kdim, vdim;
    bool key_is_value;
    Index value_head_dim;
  };
  for (const Config c : {Config{5, 3, false, 0}, Config{kD, kD, false, 0}, Config{4, 4, true, 0},
                         Config{5, 3, false, 2}, Config{kD, kD, false, 4}, Config{4, 4, true, 2}}) {
    SCOPED_TRACE("kdim " + std::to_string(c.kdim) + " vdim " + std::to_string(c.vdim) +
                 " value_head_dim " + std::to_string(c.value_head_dim));
    attn::MultiHeadAttentionOptions o =
        attn::MultiHeadAttentionOptions::pytorch(kD, 2, true, c.kdim, c.vdim);
    o.value_head_dim = c.value_head_dim;
    attn::MultiHeadAttention<double> m(o);
    Tensor<double, 3> q = input(kT, kD, 5), k = input(kTk, c.kdim, 6), v = input(kTk, c.vdim, 7);
    Tensor<bool, 2> padding({kB, kTk});
    padding(0, 2) = true;
    AttentionMask<double> mask;
    mask.key_padding(padding.view());
    attn::Workspace ws;
    const auto value = [&]() -> Tensor<double, 3>& { return c.key_is_value ? k : v; };
    std::vector<Tensor<double, 3>*> inputs{&q, &k};
    if (!c.key_is_value) inputs.push_back(&v);
    check_module(
        m, inputs, {kB, kT, kD},
        [&](attn::TensorView<double, 3> out) {
          m.forward(q.view(), k.view(), value().view(), out, ws, mask);
        },
        [&](attn::TensorView<const double, 3> w, attn::Gradients<double>& grads,
            std::vector<Tensor<double, 3>>& g) {
          attn::SavedForward<double> saved;
          Tensor<double, 3> out({kB, kT, kD});
          m.forward(q.view(), k.view(), value().view(), out.view(), saved, ws, mask);
          const auto gv = c.key_is_value ? g[1].view() : g[2].view();
          m.backward(w, saved, g[0].view(), g[1].view(), gv, grads, ws);
        });
  }
}

TEST(ModuleBackward, CrossAttentionMatchesFiniteDifferences) {
  attn::manual_seed(5);
  attn::CrossAttention<double> m(kD, 4, kD, 2, true);
  Tensor<double, 3> xq = input(kT, kD, 8), xkv = input(kTk, 4, 9);
  attn::Workspace ws;
  check_module(
      m, {&xq, &xkv}, {kB, kT, kD},
      [&](attn::TensorView<double, 3> out) { m.forward(xq.view(), xkv.view(), out, ws); },
      [&](attn::TensorView<const double, 3> w, attn::Gradients<double>& grads,
          std::vector<Tensor<double, 3>>& g) {
        attn::SavedForward<double> saved;
        Tensor<double, 3> out({kB, kT, kD});
        m.forward(xq.view(), xkv.view(), out.view(), saved, ws);
        m.backward(w, saved, g[0].view(), g[1].view(), grads, ws);
      });
}

// An unbatched (T, d) call is a batch of one.
TEST(ModuleBackward, UnbatchedInputsAreABatchOfOne) {
  attn::manual_seed(6);
  attn::MultiHeadAttention<double> m(kD, kD, 7, 0.0, 2, true);
  const auto x = attn::test::random_tensor<double>(Shape<2>{kT, kD}, 10);
  const auto w = attn::test::random_tensor<double>(Shape<2>{kT, kD}, 11);
  attn::Workspace ws;
  attn::SavedForward<double> saved;
  Tensor<double, 2> out({kT, kD}), gx({kT, kD});
  attn::Gradients<double> grads(m.named_parameters()), batched_grads(m.named_parameters());
  m.forward(x.view(), out.view(), saved, ws);
  m.backward(w.view(), saved, gx.view(), grads, ws);
  Tensor<double, 3> out3({1, kT, kD}), gx3({1, kT, kD});
  m.forward(attn::unsqueeze(x.view(), 0), out3.view(), saved, ws);
  m.backward(attn::unsqueeze(w.view(), 0), saved, gx3.view(), batched_grads, ws);
  EXPECT_EQ(attn::test::to_vector(gx), attn::test::to_vector(gx3));
  for (std::size_t i = 0; i < grads.size(); ++i) {
    EXPECT_EQ(attn::test::to_vector(grads[i].matrix()),
              attn::test::to_vector(batched_grads[i].matrix()))
        << grads[i].name();
  }
}

TEST(ModuleBackward, BitIdenticalForAnyThreadCountWithDropout) {
  const int saved_threads = attn::num_threads();
  attn::manual_seed(7);
  attn::MultiHeadAttention<float> m(64, 64, 300, /*dropout=*/0.1, 4, true);
  const auto x = attn::test::random_tensor<float>(Shape<3>{2, 300, 64}, 12);
  const auto w = attn::test::random_tensor<float>(Shape<3>{2, 300, 64}, 13);
  const auto run = [&](int threads) {
    attn::set_num_threads(threads);
    m.seed(42);  // the same dropout call numbers each run
    attn::Workspace ws;
    attn::SavedForward<float> saved;
    Tensor<float, 3> out({2, 300, 64}), gx({2, 300, 64});
    attn::Gradients<float> grads(m.named_parameters());
    m.forward(x.view(), out.view(), saved, ws);
    m.backward(w.view(), saved, gx.view(), grads, ws);
    std::vector<float> all = attn::test::to_vector(gx);
    for (const auto& g : grads) {
      const auto v = attn::test::to_vector(g.matrix());
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  const auto one = run(1);
  EXPECT_EQ(run(2), one);
  EXPECT_EQ(run(3), one);
  attn::set_num_threads(saved_threads);
}

TEST(ModuleBackward, AddsIntoTheGradients) {
  attn::manual_seed(8);
  attn::MultiHeadAttention<double> m(kD, kD, 7, 0.0, 2, true);
  const auto x = input(kT, kD, 14), w = input(kT, kD, 15);
  attn::Workspace ws;
  attn::SavedForward<double> saved;
  Tensor<double, 3> out({kB, kT, kD}), gx({kB, kT, kD});
  attn::Gradients<double> grads(m.named_parameters());
  m.forward(x.view(), out.view(), saved, ws);
  m.backward(w.view(), saved, gx.view(), grads, ws);
  const auto once = attn::test::to_vector(gx);
  const auto w_once = attn::test::to_vector(grads.at("in_proj_weight").matrix());
  m.backward(w.view(), saved, gx.view(), grads, ws);
  const auto twice = attn::test::to_vector(gx);
  const auto w_twice = attn::test::to_vector(grads.at("in_proj_weight").matrix());
  for (std::size_t i = 0; i < once.size(); ++i) EXPECT_NEAR(twice[i], 2 * once[i], 1e-14);
  for (std::size_t i = 0; i < w_once.size(); ++i) EXPECT_NEAR(w_twice[i], 2 * w_once[i], 1e-14);
}

TEST(ModuleBackward, RejectsMismatchedArgumentsNamingThem) {
  using ::testing::HasSubstr;
  attn::manual_seed(9);
  attn::MultiHeadAttention<float> m(kD, kD, 7, 0.0, 2, true), other(kD, kD, 7, 0.0, 2, true);
  const auto x = attn::test::random_tensor<float>(Shape<3>{kB, kT, kD}, 16);
  Tensor<float, 3> out({kB, kT, kD}), gx({kB, kT, kD}), wrong({kB, kT + 1, kD});
  attn::Workspace ws;
  attn::SavedForward<float> saved, empty;
  attn::Gradients<float> grads(m.named_parameters()), other_grads(other.named_parameters());
  m.forward(x.view(), out.view(), saved, ws);
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>(
                  [&] { m.backward(out.view(), empty, gx.view(), grads, ws); }),
              HasSubstr("training forward"));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>(
                  [&] { other.backward(out.view(), saved, gx.view(), other_grads, ws); }),
              HasSubstr("training forward"));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>(
                  [&] { m.backward(wrong.view(), saved, gx.view(), grads, ws); }),
              HasSubstr("grad_out has shape (2, 6, 6)"));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>(
                  [&] { m.backward(out.view(), saved, wrong.view(), grads, ws); }),
              HasSubstr("grad_query has shape (2, 6, 6)"));
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>(
                  [&] { m.backward(out.view(), saved, gx.view(), other_grads, ws); }),
              HasSubstr("Gradients::of"));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>(
                  [&] { m.backward(gx.view(), saved, gx.view(), grads, ws); }),
              HasSubstr("overlaps"));
}

}  // namespace

}  // namespace module_backward_test

#include "support/bodies_end.hpp"
