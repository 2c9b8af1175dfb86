// SPDX-License-Identifier: MIT
// tests/nn/gradients_test.cpp: Gradients (attn/nn/gradients.hpp), one buffer per named
// parameter, laid out like the module's memory: names, order, shapes and strides of every
// naming, of() for any view of the parameters' memory, zero(), copies and errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>

#include "attn/attn.hpp"
#include "support/scalar_types.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace gradients_test {

namespace {

using attn::Gradients;
using attn::Index;
using attn::MultiHeadAttention;
using attn::MultiHeadAttentionOptions;
using attn::ParameterList;
using attn::ParameterNames;
using attn::Tensor;
using attn::TensorView;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

template <class Scalar>
class GradientsTest : public ::testing::Test {};
TYPED_TEST_SUITE(GradientsTest, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

/// Every gradient has its parameter's name, rank, shape and strides, in the same order,
/// and starts at zero.
template <class Scalar, class List>
void expect_mirrors(const Gradients<Scalar>& grads, const List& params) {
  ASSERT_EQ(grads.size(), params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    SCOPED_TRACE(params[i].name());
    EXPECT_EQ(grads[i].name(), params[i].name());
    EXPECT_EQ(grads[i].rank(), params[i].rank());
    EXPECT_EQ(grads[i].shape(), params[i].shape());
    EXPECT_EQ(grads[i].matrix().strides(), params[i].matrix().strides());
    EXPECT_NE(static_cast<const void*>(grads[i].matrix().data()),
              static_cast<const void*>(params[i].matrix().data()));
    for (Index r = 0; r < grads[i].matrix().extent(0); ++r) {
      for (Index c = 0; c < grads[i].matrix().extent(1); ++c) {
        ASSERT_EQ(grads[i].matrix()(r, c), Scalar(0));
      }
    }
  }
}

TYPED_TEST(GradientsTest, MirrorEveryNamingOfAMultiHeadModule) {
  using Scalar = TypeParam;
  attn::TorchGenerator gen(1);
  const MultiHeadAttention<Scalar> mha(MultiHeadAttentionOptions::pytorch(8, 2), gen);
  for (const ParameterNames names :
       {ParameterNames::kMultiheadAttention, ParameterNames::kSeparateProjections,
        ParameterNames::kNotebook, ParameterNames::kNotebookRaw}) {
    SCOPED_TRACE(static_cast<int>(names));
    const auto params = mha.named_parameters(names);
    const Gradients<Scalar> grads(params);
    expect_mirrors(grads, params);
  }
  const Gradients<Scalar> grads(mha.named_parameters());
  EXPECT_THAT(grads.names(),
              ElementsAre("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"));
}

TYPED_TEST(GradientsTest, TheFusedBlockIsOneContiguousGradientUnderAnyNames) {
  using Scalar = TypeParam;
  attn::manual_seed(2);
  MultiHeadAttention<Scalar> mha(6, 6, 8, 0.0, 3, /*qkv_bias=*/true);
  Gradients<Scalar> by_notebook(mha.named_parameters(ParameterNames::kNotebook));
  // The backward writes the fused (3 D, d_in) weight's gradient in one go...
  const TensorView<Scalar, 2> fused = by_notebook.of(mha.in_proj_weight());
  EXPECT_EQ(fused.shape(), (attn::Shape<2>{18, 6}));
  EXPECT_TRUE(fused.is_contiguous());
  for (Index r = 0; r < 18; ++r) {
    for (Index c = 0; c < 6; ++c) fused(r, c) = static_cast<Scalar>(100 * r + c);
  }
  const TensorView<Scalar, 1> bias = by_notebook.of(mha.in_proj_bias());
  for (Index i = 0; i < 18; ++i) bias(i) = static_cast<Scalar>(i);
  // ... and each name sees its rows.
  EXPECT_EQ(by_notebook.at("W_key.weight").matrix()(0, 1), Scalar(601));
  EXPECT_EQ(by_notebook.at("W_value.weight").matrix()(5, 5), Scalar(1705));
  EXPECT_EQ(by_notebook.at("W_value.bias").vector()(2), Scalar(14));
  // Raw names: (d_in, d_out), the transpose, like the parameter.
  Gradients<Scalar> raw(mha.named_parameters(ParameterNames::kNotebookRaw));
  raw.of(mha.in_proj_weight())(7, 4) = Scalar(3);  // W_key row 1, input feature 4
  EXPECT_EQ(raw.at("W_key").matrix()(4, 1), Scalar(3));
  // Views of a part of the storage work too (one projection, the out_proj weight).
  Gradients<Scalar> pytorch(mha.named_parameters());
  pytorch.of(mha.w_value().weight())(0, 0) = Scalar(9);
  EXPECT_EQ(pytorch.at("in_proj_weight").matrix()(12, 0), Scalar(9));
  pytorch.of(mha.out_proj().weight())(1, 2) = Scalar(4);
  EXPECT_EQ(pytorch.at("out_proj.weight").matrix()(1, 2), Scalar(4));
  pytorch.zero();
  EXPECT_EQ(pytorch.at("in_proj_weight").matrix()(12, 0), Scalar(0));
  EXPECT_EQ(pytorch.at("out_proj.weight").matrix()(1, 2), Scalar(0));
}

TYPED_TEST(GradientsTest, SeparateKeyValueStorageAndTheWrapperHeads) {
  using Scalar = TypeParam;
  attn::TorchGenerator gen(3);
  const MultiHeadAttention<Scalar> mha(MultiHeadAttentionOptions::pytorch(8, 2, true, 5, 5), gen);
  Gradients<Scalar> grads(mha.named_parameters());
  EXPECT_THAT(grads.names(), ElementsAre("q_proj_weight", "k_proj_weight", "v_proj_weight",
                                         "in_proj_bias", "out_proj.weight", "out_proj.bias"));
  expect_mirrors(grads, mha.named_parameters());
  // K and V are stored as one (2 D, kdim) block: their gradients are one block too.
  const auto kv = grads.of(attn::TensorView<const Scalar, 2>(mha.k_proj_weight().data(), {16, 5}));
  EXPECT_EQ(kv.data() + 8 * 5, grads.at("v_proj_weight").matrix().data());

  attn::manual_seed(4);
  const attn::MultiHeadAttentionWrapper<Scalar> wrapper(4, 3, 6, 0.0, 2, true);
  Gradients<Scalar> heads(wrapper.named_parameters());
  expect_mirrors(heads, wrapper.named_parameters());
  EXPECT_EQ(heads.of(wrapper.head(1).w_key().weight()).data(),
            heads.at("heads.1.W_key.weight").matrix().data());
}

TYPED_TEST(GradientsTest, GradientsAreAlignedLikeTheWeights) {
  using Scalar = TypeParam;
  attn::Linear<Scalar> layer(16, 4, true);
  const Gradients<Scalar> grads(layer.named_parameters());
  const auto address = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  ASSERT_EQ(address(layer.weight().data()) % 64, 0u);
  EXPECT_EQ(address(grads.at("weight").matrix().data()) % 64, 0u);
  EXPECT_EQ(address(grads.at("bias").matrix().data()) % 64, 0u);
  attn::Linear<Scalar> no_bias(3, 2, false);
  EXPECT_THAT(Gradients<Scalar>(no_bias.named_parameters()).names(), ElementsAre("weight"));
}

TYPED_TEST(GradientsTest, CopiesOwnTheirValuesAndMovesKeepThem) {
  using Scalar = TypeParam;
  attn::Linear<Scalar> layer(3, 2, true);
  Gradients<Scalar> grads(layer.named_parameters());
  grads.at("bias").vector()(1) = Scalar(5);
  Gradients<Scalar> copy = grads;
  EXPECT_EQ(copy.at("bias").vector()(1), Scalar(5));
  copy.at("bias").vector()(1) = Scalar(6);
  EXPECT_EQ(grads.at("bias").vector()(1), Scalar(5));
  EXPECT_EQ(copy.of(layer.bias())(1), Scalar(6));  // of() finds the copy's own buffers
  const Scalar* before = grads.at("weight").matrix().data();
  Gradients<Scalar> moved = std::move(grads);
  EXPECT_EQ(moved.at("weight").matrix().data(), before);
  EXPECT_EQ(moved.at("bias").vector()(1), Scalar(5));
  copy = moved;
  EXPECT_EQ(copy.at("bias").vector()(1), Scalar(5));
  EXPECT_NE(copy.at("bias").matrix().data(), moved.at("bias").matrix().data());
}

TEST(Gradients, ErrorsNameTheParameters) {
  attn::Linear<float> layer(3, 2, true);
  Gradients<float> grads(layer.named_parameters());
  EXPECT_THAT(attn::test::thrown<attn::IndexError>([&] { (void)grads.at("weights"); }),
              HasSubstr("no parameter 'weights' (the parameters "
                        "are weight, bias)"));
  const attn::Linear<float> other = layer;  // a copy has its own memory
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>([&] { grads.of(other.weight()); }),
              HasSubstr("Gradients::of: a view of shape (2, 3) "
                        "is not in the memory"));
  Tensor<float, 2> w({2, 3});
  ParameterList<float> twice;
  twice.add("w", w.view()).add("w", attn::slice(w.view(), 0, 1, 2));
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>([&] { Gradients<float>{twice}; }),
              HasSubstr("parameter name 'w' appears twice"));
  ParameterList<float> overlap;
  overlap.add("a", w.view()).add("b", attn::slice(w.view(), 0, 1, 2));
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>([&] { Gradients<float>{overlap}; }),
              HasSubstr("'a' and 'b' share memory"));
  const Gradients<float> none(attn::SimpleSelfAttention<float>().named_parameters());
  EXPECT_TRUE(none.empty());
  EXPECT_THAT(attn::test::thrown<attn::IndexError>([&] { (void)none.at("x"); }),
              HasSubstr("(the parameters are none)"));
}

}  // namespace

}  // namespace gradients_test

#include "support/bodies_end.hpp"
