// SPDX-License-Identifier: MIT
// tests/attention/training_aliasing_test.cpp: every module's training and incremental
// overloads with outputs that share memory with their inputs, as the inference overloads
// allow them:
//  - the training forward in place (forward(x, x, saved, ws)): the output and, through the
//    backward, every gradient equal the out-of-place run's, bit for bit (the input is
//    copied before anything is written, so both runs do the same arithmetic). The forward
//    once kept a view of x in `saved` and then overwrote x: the gradients of every module
//    and the wrapper's very output were wrong, with no error;
//  - the backward with an input gradient that is grad_out: refused, naming both;
//  - the incremental forward with x inside the cache's storage (copied first, the same bits
//    as from a separate x), with out inside the cache's storage (refused: the cache is read
//    after out is written), and for the modules that cannot run it, refused.
// Every module kind: SimpleSelfAttention, SelfAttention, CausalAttention,
// MultiHeadAttentionWrapper, MultiHeadAttention (x, and query/key/value with out over each),
// CrossAttention (out over x_q and over x_kv).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace training_aliasing_test {

namespace {

using attn::Gradients;
using attn::Index;
using attn::KVCache;
using attn::SavedForward;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
using ::testing::HasSubstr;

using View = TensorView<double, 3>;
using ConstView = TensorView<const double, 3>;

constexpr Index kB = 2, kT = 5;

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

/// What one training step produced: the output, every input gradient, every parameter
/// gradient (in named_parameters() order).
struct Step {
  std::vector<double> out;
  std::vector<std::vector<double>> input_grads;
  std::vector<std::vector<double>> param_grads;
};

/// Compares a step run out of place with the same step in place, bit for bit.
void expect_same_step(const Step& expected, const Step& got, const std::string& what) {
  EXPECT_TRUE(same_bits(expected.out, got.out)) << what << ": output";
  ASSERT_EQ(expected.input_grads.size(), got.input_grads.size());
  for (std::size_t i = 0; i < got.input_grads.size(); ++i) {
    EXPECT_TRUE(same_bits(expected.input_grads[i], got.input_grads[i]))
        << what << ": gradient of input " << i;
  }
  ASSERT_EQ(expected.param_grads.size(), got.param_grads.size());
  for (std::size_t i = 0; i < got.param_grads.size(); ++i) {
    EXPECT_TRUE(same_bits(expected.param_grads[i], got.param_grads[i]))
        << what << ": gradient of parameter " << i;
  }
}

std::vector<std::vector<double>> parameter_grads(const Gradients<double>& grads) {
  std::vector<std::vector<double>> out;
  for (const auto& g : grads) out.push_back(attn::test::to_vector(g.matrix()));
  return out;
}

/// One training step of a single-input module: forward(x, out, saved, ws), then
/// backward(w, saved, grad_x, grads, ws). In place, out is x itself (d_in == d_out).
template <class Module>
Step self_step(Module& m, const Tensor<double, 3>& x, const Tensor<double, 3>& w, bool in_place) {
  attn::Workspace ws;
  SavedForward<double> saved;
  Gradients<double> grads(m.named_parameters());
  Tensor<double, 3> gx(x.shape());
  Step s;
  if (in_place) {
    Tensor<double, 3> inout = x;
    m.forward(ConstView(inout.view()), inout.view(), saved, ws);
    m.backward(w.view(), saved, gx.view(), grads, ws);
    s.out = attn::test::to_vector(inout);
  } else {
    Tensor<double, 3> out(w.shape());
    m.forward(x.view(), out.view(), saved, ws);
    m.backward(w.view(), saved, gx.view(), grads, ws);
    s.out = attn::test::to_vector(out);
  }
  s.input_grads.push_back(attn::test::to_vector(gx));
  s.param_grads = parameter_grads(grads);
  return s;
}

template <class Module>
void expect_in_place_training_is_exact(Module& m, Index d, const std::string& what) {
  const auto x = attn::test::random_tensor<double>(Shape<3>{kB, kT, d}, 1);
  const auto w = attn::test::random_tensor<double>(Shape<3>{kB, kT, d}, 2);
  expect_same_step(self_step(m, x, w, false), self_step(m, x, w, true), what);
}

/// The backward refuses an input gradient that is grad_out itself.
template <class Module>
void expect_backward_refuses_grad_out_as_grad_x(Module& m, Index d, const std::string& what) {
  SCOPED_TRACE(what);
  const auto x = attn::test::random_tensor<double>(Shape<3>{kB, kT, d}, 1);
  attn::Workspace ws;
  SavedForward<double> saved;
  Gradients<double> grads(m.named_parameters());
  Tensor<double, 3> out({kB, kT, d});
  m.forward(x.view(), out.view(), saved, ws);
  Tensor<double, 3> g = attn::test::random_tensor<double>(Shape<3>{kB, kT, d}, 2);
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>(
                  [&] { m.backward(ConstView(g.view()), saved, g.view(), grads, ws); }),
              HasSubstr("overlaps"));
}

TEST(TrainingAliasing, SimpleSelfAttentionInPlaceIsExact) {
  attn::SimpleSelfAttention<double> m;
  expect_in_place_training_is_exact(m, 6, "SimpleSelfAttention");
  attn::SimpleSelfAttention<double> scaled(true);
  expect_in_place_training_is_exact(scaled, 6, "SimpleSelfAttention(scaled)");
  expect_backward_refuses_grad_out_as_grad_x(m, 6, "SimpleSelfAttention");
}

TEST(TrainingAliasing, SelfAttentionInPlaceIsExact) {
  attn::manual_seed(1);
  attn::SelfAttention<double> m(6, 6, /*qkv_bias=*/true);
  expect_in_place_training_is_exact(m, 6, "SelfAttention");
  attn::SelfAttention<double> raw(6, 6, attn::kRandInit);
  expect_in_place_training_is_exact(raw, 6, "SelfAttention(v1)");
  expect_backward_refuses_grad_out_as_grad_x(m, 6, "SelfAttention");
}

TEST(TrainingAliasing, CausalAttentionInPlaceIsExact) {
  attn::manual_seed(2);
  attn::CausalAttention<double> m(6, 6, 8, 0.0, /*qkv_bias=*/true);
  expect_in_place_training_is_exact(m, 6, "CausalAttention");
  expect_backward_refuses_grad_out_as_grad_x(m, 6, "CausalAttention");
}

TEST(TrainingAliasing, MultiHeadAttentionWrapperInPlaceIsExact) {
  attn::manual_seed(3);
  attn::MultiHeadAttentionWrapper<double> m(6, 3, 8, 0.0, 2, /*qkv_bias=*/true);  // 2 x 3 = 6
  expect_in_place_training_is_exact(m, 6, "MultiHeadAttentionWrapper");
  expect_backward_refuses_grad_out_as_grad_x(m, 6, "MultiHeadAttentionWrapper");
}

TEST(TrainingAliasing, MultiHeadSelfAttentionInPlaceIsExact) {
  attn::manual_seed(4);
  attn::MultiHeadAttention<double> m(6, 6, 8, 0.0, 2, /*qkv_bias=*/true);
  expect_in_place_training_is_exact(m, 6, "MultiHeadAttention(x)");
  expect_backward_refuses_grad_out_as_grad_x(m, 6, "MultiHeadAttention(x)");
  // Unbatched: (T, d) in place.
  const auto x = attn::test::random_tensor<double>(Shape<2>{kT, 6}, 5);
  const auto w = attn::test::random_tensor<double>(Shape<2>{kT, 6}, 6);
  attn::Workspace ws;
  SavedForward<double> s1, s2;
  Gradients<double> g1(m.named_parameters()), g2(m.named_parameters());
  Tensor<double, 2> out({kT, 6}), gx1({kT, 6}), gx2({kT, 6});
  m.forward(x.view(), out.view(), s1, ws);
  m.backward(w.view(), s1, gx1.view(), g1, ws);
  Tensor<double, 2> inout = x;
  m.forward(TensorView<const double, 2>(inout.view()), inout.view(), s2, ws);
  m.backward(w.view(), s2, gx2.view(), g2, ws);
  EXPECT_TRUE(same_bits(attn::test::to_vector(out), attn::test::to_vector(inout)));
  EXPECT_TRUE(same_bits(attn::test::to_vector(gx1), attn::test::to_vector(gx2)));
  EXPECT_TRUE(same_bits(parameter_grads(g1)[0], parameter_grads(g2)[0]));
}

// forward(query, key, value, out = one of them, saved, ws): the three inputs are distinct
// tensors of the output's shape; out is written over query, key or value in turn.
TEST(TrainingAliasing, MultiHeadQueryKeyValueInPlaceIsExact) {
  attn::manual_seed(5);
  attn::MultiHeadAttention<double> m(attn::MultiHeadAttentionOptions::pytorch(6, 2, true));
  const auto q = attn::test::random_tensor<double>(Shape<3>{kB, kT, 6}, 1);
  const auto k = attn::test::random_tensor<double>(Shape<3>{kB, kT, 6}, 2);
  const auto v = attn::test::random_tensor<double>(Shape<3>{kB, kT, 6}, 3);
  const auto w = attn::test::random_tensor<double>(Shape<3>{kB, kT, 6}, 4);
  const auto step = [&](int alias) {
    Tensor<double, 3> in[3] = {q, k, v};
    Tensor<double, 3> separate({kB, kT, 6});
    const View out = alias < 0 ? separate.view() : in[alias].view();
    attn::Workspace ws;
    SavedForward<double> saved;
    Gradients<double> grads(m.named_parameters());
    Tensor<double, 3> gq(q.shape()), gk(k.shape()), gv(v.shape());
    m.forward(ConstView(in[0].view()), ConstView(in[1].view()), ConstView(in[2].view()), out, saved,
              ws);
    m.backward(w.view(), saved, gq.view(), gk.view(), gv.view(), grads, ws);
    Step s;
    s.out = attn::test::to_vector(out);
    s.input_grads = {attn::test::to_vector(gq), attn::test::to_vector(gk),
                     attn::test::to_vector(gv)};
    s.param_grads = parameter_grads(grads);
    return s;
  };
  const Step expected = step(-1);
  for (int alias = 0; alias < 3; ++alias) {
    expect_same_step(expected, step(alias), "out over input " + std::to_string(alias));
  }
}

TEST(TrainingAliasing, CrossAttentionInPlaceIsExact) {
  attn::manual_seed(6);
  attn::CrossAttention<double> m(/*d_q=*/6, /*d_kv=*/6, /*d_out=*/6, /*num_heads=*/2, true);
  const auto xq = attn::test::random_tensor<double>(Shape<3>{kB, kT, 6}, 1);
  const auto xkv = attn::test::random_tensor<double>(Shape<3>{kB, kT, 6}, 2);
  const auto w = attn::test::random_tensor<double>(Shape<3>{kB, kT, 6}, 3);
  const auto step = [&](int alias) {
    Tensor<double, 3> in[2] = {xq, xkv};
    Tensor<double, 3> separate({kB, kT, 6});
    const View out = alias < 0 ? separate.view() : in[alias].view();
    attn::Workspace ws;
    SavedForward<double> saved;
    Gradients<double> grads(m.named_parameters());
    Tensor<double, 3> gq(xq.shape()), gkv(xkv.shape());
    m.forward(ConstView(in[0].view()), ConstView(in[1].view()), out, saved, ws);
    m.backward(w.view(), saved, gq.view(), gkv.view(), grads, ws);
    Step s;
    s.out = attn::test::to_vector(out);
    s.input_grads = {attn::test::to_vector(gq), attn::test::to_vector(gkv)};
    s.param_grads = parameter_grads(grads);
    return s;
  };
  const Step expected = step(-1);
  expect_same_step(expected, step(0), "out over x_q");
  expect_same_step(expected, step(1), "out over x_kv");
  // grad_x_q given as grad_out: refused.
  attn::Workspace ws;
  SavedForward<double> saved;
  Gradients<double> grads(m.named_parameters());
  Tensor<double, 3> out({kB, kT, 6}), gkv(xkv.shape());
  m.forward(xq.view(), xkv.view(), out.view(), saved, ws);
  Tensor<double, 3> g = w;
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>(
                  [&] { m.backward(ConstView(g.view()), saved, g.view(), gkv.view(), grads, ws); }),
              HasSubstr("overlaps"));
}

// ---- the incremental forward ----

attn::MultiHeadAttentionOptions causal_options() {
  attn::MultiHeadAttentionOptions o;
  o.d_in = 8;
  o.num_heads = 2;
  o.num_kv_heads = 1;
  o.causal = true;
  o.qkv_bias = true;
  return o;
}

/// Runs `m` incrementally over x (B=1, T=4, 8 features) from a fresh cache (1 key/value head
/// of `hd`) and returns the output; `place` puts x and out where the test wants them inside
/// the cache's storage (or leaves them apart).
template <class Module>
std::vector<double> cached_run(const Module& m, Index hd, const Tensor<double, 3>& x,
                               bool x_in_cache) {
  KVCache<double> cache(1, 1, hd, 64);
  attn::Workspace ws;
  Tensor<double, 3> out({1, 4, 8});
  if (x_in_cache) {
    // x occupies the first 32 elements of the storage: item 0's first key rows, exactly
    // where the first step's keys are written.
    const View staged(cache.k_storage().data(), x.shape());
    attn::copy(x.view(), staged);
    m.forward(ConstView(staged), out.view(), ws, cache);
  } else {
    m.forward(x.view(), out.view(), ws, cache);
  }
  return attn::test::to_vector(out);
}

template <class Module>
void expect_cached_aliasing_handled(const Module& m, Index hd, const std::string& what) {
  SCOPED_TRACE(what);
  const auto x = attn::test::random_tensor<double>(Shape<3>{1, 4, 8}, 7);
  EXPECT_TRUE(same_bits(cached_run(m, hd, x, false), cached_run(m, hd, x, true)))
      << "x inside the cache's storage";
  // x in place (out is x): as out of place.
  {
    KVCache<double> cache(1, 1, hd, 64);
    attn::Workspace ws;
    Tensor<double, 3> inout = x;
    m.forward(ConstView(inout.view()), inout.view(), ws, cache);
    EXPECT_TRUE(same_bits(cached_run(m, hd, x, false), attn::test::to_vector(inout)));
  }
  // out inside the cache's storage: refused, the cache untouched.
  KVCache<double> cache(1, 1, hd, 64);
  attn::Workspace ws;
  const View out(cache.v_storage().data(), {1, 4, 8});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { m.forward(x.view(), out, ws, cache); }),
              HasSubstr("cache"));
  EXPECT_EQ(cache.length(0), 0);
}

TEST(TrainingAliasing, IncrementalForwardCopiesInputsInTheCacheAndRefusesOutputsThere) {
  attn::TorchGenerator gen(3);
  const attn::MultiHeadAttention<double> mha(causal_options(), gen);
  expect_cached_aliasing_handled(mha, 4, "MultiHeadAttention");
  attn::manual_seed(8);
  attn::CausalAttention<double> causal(8, 8, 16, 0.0, true);
  causal.eval();
  expect_cached_aliasing_handled(causal, 8, "CausalAttention");
}

TEST(TrainingAliasing, ModulesWithoutACausalCoreRefuseTheIncrementalForward) {
  attn::manual_seed(9);
  const auto x = attn::test::random_tensor<double>(Shape<3>{1, 3, 8}, 1);
  Tensor<double, 3> out({1, 3, 8});
  attn::Workspace ws;
  KVCache<double> cache(1, 1, 8, 16);
  const attn::SimpleSelfAttention<double> simple;
  EXPECT_THROW(simple.forward(x.view(), out.view(), ws, cache), attn::ConfigError);
  const attn::MultiHeadAttentionWrapper<double> wrapper(8, 4, 16, 0.0, 2);
  EXPECT_THROW(wrapper.forward(x.view(), out.view(), ws, cache), attn::ConfigError);
  // Not causal: their whole-sequence forward lets a token see later tokens; a cache cannot.
  const attn::SelfAttention<double> self(8, 8);
  EXPECT_THAT(
      attn::test::thrown<attn::ConfigError>([&] { self.forward(x.view(), out.view(), ws, cache); }),
      HasSubstr("causal"));
  const attn::CrossAttention<double> cross(8, 8, 8, 1);
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>(
                  [&] { cross.forward(x.view(), x.view(), out.view(), ws, cache); }),
              HasSubstr("causal"));
  EXPECT_EQ(cache.length(0), 0);
}

}  // namespace

}  // namespace training_aliasing_test

#include "support/bodies_end.hpp"
