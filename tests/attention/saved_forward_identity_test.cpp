// SPDX-License-Identifier: MIT
// tests/attention/saved_forward_identity_test.cpp: a backward checks that `saved` is the
// record of this very module's training forward: its identity and its configuration, not
// only its address. A module replaced in place (assigned a new one: the same address, other
// sizes) once passed the address check, and the backward then read past its buffers (ASan:
// heap-buffer-overflow in the projections' backward) or, with the same sizes but another
// mask bound, returned wrong gradients. Each case below must be refused with an error naming
// the recorded configuration and this module's.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "attn/attn.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace saved_forward_identity_test {

namespace {

using attn::Gradients;
using attn::Index;
using attn::MultiHeadAttention;
using attn::MultiHeadAttentionOptions;
using attn::SavedForward;
using attn::Shape;
using attn::Tensor;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr Index kB = 2, kT = 4;

MultiHeadAttentionOptions options(Index d, Index heads, bool causal) {
  MultiHeadAttentionOptions o = MultiHeadAttentionOptions::pytorch(d, heads, true);
  o.causal = causal;
  return o;
}

/// Fills `saved` from m's training forward on a (kB, kT, d) input, and returns the input:
/// `saved` reads it in place, so it must outlive the backward.
template <class Module>
[[nodiscard]] Tensor<float, 3> train_forward(const Module& m, Index d_in, Index d_out,
                                             SavedForward<float>& saved) {
  auto x = attn::test::random_tensor<float>(Shape<3>{kB, kT, d_in}, 1);
  Tensor<float, 3> out({kB, kT, d_out});
  attn::Workspace ws;
  m.forward(x.view(), out.view(), saved, ws);
  return x;
}

/// m.backward with arguments of m's own shapes (as a caller would pass after the swap).
template <class Module>
void backward(Module& m, Index d_in, Index d_out, const SavedForward<float>& saved) {
  Gradients<float> grads(m.named_parameters());
  const auto g = attn::test::random_tensor<float>(Shape<3>{kB, kT, d_out}, 2);
  Tensor<float, 3> gx({kB, kT, d_in});
  attn::Workspace ws;
  m.backward(g.view(), saved, gx.view(), grads, ws);
}

TEST(SavedForwardIdentity, AModuleReplacedByOneOfOtherSizesIsRefused) {
  attn::manual_seed(1);
  MultiHeadAttention<float> m(options(6, 2, false));
  SavedForward<float> saved;
  const auto input = train_forward(m, 6, 6, saved);
  m = MultiHeadAttention<float>(options(8, 2, false));  // same address, d_in 6 -> 8
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { backward(m, 8, 8, saved); }),
              AllOf(HasSubstr("training forward"), HasSubstr("d_in=6"), HasSubstr("d_in=8")));
}

// Only the input width differs: the heads the kernel reads have the recorded shapes, so
// nothing but the configuration tells; the projections' backward read the saved 6-wide
// input rows as 8-wide ones (heap-buffer-overflow).
TEST(SavedForwardIdentity, AModuleReplacedByOneOfOtherInputWidthIsRefused) {
  attn::manual_seed(8);
  MultiHeadAttentionOptions o = options(6, 2, false);
  MultiHeadAttention<float> m(o);
  SavedForward<float> saved;
  const auto input = train_forward(m, 6, 6, saved);
  o.d_in = 8;
  o.d_out = 6;
  m = MultiHeadAttention<float>(o);
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { backward(m, 8, 6, saved); }),
              AllOf(HasSubstr("d_in=6"), HasSubstr("d_in=8")));
}

TEST(SavedForwardIdentity, AModuleReplacedByOneOfOtherHeadsIsRefused) {
  attn::manual_seed(2);
  MultiHeadAttention<float> m(options(6, 2, false));
  SavedForward<float> saved;
  const auto input = train_forward(m, 6, 6, saved);
  m = MultiHeadAttention<float>(options(6, 3, false));  // same sizes, head_dim 3 -> 2
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { backward(m, 6, 6, saved); }),
              AllOf(HasSubstr("num_heads=2"), HasSubstr("num_heads=3")));
}

// The same shapes everywhere; only the causal bound differs, so no size check can see it:
// the backward would redo the forward's softmax under another mask.
TEST(SavedForwardIdentity, AModuleReplacedByOneWithAnotherMaskIsRefused) {
  attn::manual_seed(3);
  MultiHeadAttention<float> m(options(6, 2, false));
  SavedForward<float> saved;
  const auto input = train_forward(m, 6, 6, saved);
  m = MultiHeadAttention<float>(options(6, 2, true));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { backward(m, 6, 6, saved); }),
              HasSubstr("causal"));
}

// Even an identical configuration is another module (other weights): refused.
TEST(SavedForwardIdentity, AModuleReplacedByAnIdenticalOneIsRefused) {
  attn::manual_seed(4);
  MultiHeadAttention<float> m(options(6, 2, false));
  SavedForward<float> saved;
  const auto input = train_forward(m, 6, 6, saved);
  m = MultiHeadAttention<float>(options(6, 2, false));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { backward(m, 6, 6, saved); }),
              HasSubstr("training forward"));
  // A new forward records the new module: the backward runs.
  const auto again = train_forward(m, 6, 6, saved);
  EXPECT_NO_THROW(backward(m, 6, 6, saved));
}

TEST(SavedForwardIdentity, EverySingleCoreModuleReplacedInPlaceIsRefused) {
  attn::manual_seed(5);
  {
    attn::SelfAttention<float> m(6, 4);
    SavedForward<float> saved;
    const auto input = train_forward(m, 6, 4, saved);
    m = attn::SelfAttention<float>(8, 4);
    EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { backward(m, 8, 4, saved); }),
                AllOf(HasSubstr("d_in=6"), HasSubstr("d_in=8")));
  }
  {
    attn::CausalAttention<float> m(6, 4, 8, 0.0);
    SavedForward<float> saved;
    const auto input = train_forward(m, 6, 4, saved);
    m = attn::CausalAttention<float>(6, 6, 8, 0.0);
    EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { backward(m, 6, 6, saved); }),
                AllOf(HasSubstr("d_out=4"), HasSubstr("d_out=6")));
  }
  {
    attn::CrossAttention<float> m(6, 4, 6, 2);
    SavedForward<float> saved;
    const auto xq = attn::test::random_tensor<float>(Shape<3>{kB, kT, 6}, 1);
    const auto xkv = attn::test::random_tensor<float>(Shape<3>{kB, kT + 1, 4}, 2);
    Tensor<float, 3> out({kB, kT, 6});
    attn::Workspace ws;
    m.forward(xq.view(), xkv.view(), out.view(), saved, ws);
    m = attn::CrossAttention<float>(6, 5, 6, 2);  // kdim 4 -> 5
    Gradients<float> grads(m.named_parameters());
    Tensor<float, 3> gq({kB, kT, 6}), gkv({kB, kT + 1, 5});
    EXPECT_THAT(attn::test::thrown<attn::ShapeError>(
                    [&] { m.backward(out.view(), saved, gq.view(), gkv.view(), grads, ws); }),
                AllOf(HasSubstr("kdim=4"), HasSubstr("kdim=5")));
  }
}

TEST(SavedForwardIdentity, AWrapperReplacedInPlaceIsRefused) {
  attn::manual_seed(6);
  attn::MultiHeadAttentionWrapper<float> m(6, 3, 8, 0.0, 2);
  SavedForward<float> saved;
  const auto input = train_forward(m, 6, 6, saved);
  m = attn::MultiHeadAttentionWrapper<float>(8, 3, 8, 0.0, 2);  // d_in 6 -> 8, same heads
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { backward(m, 8, 6, saved); }),
              AllOf(HasSubstr("d_in=6"), HasSubstr("d_in=8")));
  m = attn::MultiHeadAttentionWrapper<float>(6, 2, 8, 0.0, 3);  // 3 heads of 2
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { backward(m, 6, 6, saved); }),
              HasSubstr("training forward"));
}

// A copy is another module, with weights of its own: refused; the original still runs.
TEST(SavedForwardIdentity, ACopyIsAnotherModule) {
  attn::manual_seed(7);
  MultiHeadAttention<float> m(options(6, 2, false));
  SavedForward<float> saved;
  const auto input = train_forward(m, 6, 6, saved);
  MultiHeadAttention<float> copy = m;
  EXPECT_THROW(backward(copy, 6, 6, saved), attn::ShapeError);
  EXPECT_NO_THROW(backward(m, 6, 6, saved));
}

}  // namespace

}  // namespace saved_forward_identity_test

#include "support/bodies_end.hpp"
