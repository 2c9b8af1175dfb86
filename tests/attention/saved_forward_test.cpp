// SPDX-License-Identifier: MIT
// tests/attention/saved_forward_test.cpp: the training forward of every module
// (forward(inputs..., out, saved, ws, mask), attn/attention/saved_forward.hpp): it computes
// the very same output as the inference forward, and `saved` holds what the backward needs:
// the input rows, Q/K/V as the kernel read them, the context out_proj read, the mask and the
// kernel's resolved options (scale, dropout seed and call number, path).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "attention/reference_attention.hpp"
#include "attn/attn.hpp"
#include "support/scalar_types.hpp"
#include "support/test_support.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace saved_forward_test {

namespace {

using attn::AttentionMask;
using attn::AttentionPath;
using attn::Index;
using attn::MultiHeadAttention;
using attn::MultiHeadAttentionOptions;
using attn::SavedForward;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
namespace ref = attn::test::ref;

template <class Scalar>
class SavedForwardTest : public ::testing::Test {};
TYPED_TEST_SUITE(SavedForwardTest, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

/// (B, T, D) -> (B, H, T, hd) heads of a projection computed on its own.
template <class Scalar>
Tensor<Scalar, 4> heads_of(const Tensor<Scalar, 3>& x, Index heads) {
  return Tensor<Scalar, 4>(ref::heads_of(x.view(), heads));
}

/// Q, K, V in `saved` against each projection applied on its own (LinearView::forward).
template <class Scalar, class Module>
void expect_projections(const SavedForward<Scalar>& saved, const Module& m,
                        TensorView<const Scalar, 3> query, TensorView<const Scalar, 3> key,
                        TensorView<const Scalar, 3> value, Index heads) {
  const double tol = attn::test::reduction_tolerance<Scalar>(query.extent(2) + key.extent(2));
  EXPECT_TRUE(ref::all_near(saved.query, heads_of(m.w_query().forward(query), heads).view(), tol));
  EXPECT_TRUE(ref::all_near(saved.key, heads_of(m.w_key().forward(key), heads).view(), tol));
  EXPECT_TRUE(ref::all_near(saved.value, heads_of(m.w_value().forward(value), heads).view(), tol));
}

TYPED_TEST(SavedForwardTest, MultiHeadSelfAttentionSavesWhatItComputed) {
  using Scalar = TypeParam;
  attn::manual_seed(5);
  MultiHeadAttention<Scalar> mha(6, 8, 16, /*dropout=*/0.2, 2, /*qkv_bias=*/true);  // causal
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{2, 7, 6}, 1);
  const auto pad = ref::random_bools(Shape<2>{2, 7}, 2, 0.2);
  AttentionMask<Scalar> mask;
  mask.key_padding(pad.view());
  Tensor<Scalar, 3> expected({2, 7, 8}), out({2, 7, 8});
  attn::Workspace ws;
  mha.seed(11);
  mha.forward(x.view(), expected.view(), ws, mask);  // call 0 of seed 11
  mha.seed(11);
  SavedForward<Scalar> saved;
  EXPECT_FALSE(saved.filled());
  mha.forward(x.view(), out.view(), saved, ws, mask);
  EXPECT_TRUE(ref::same_bits(out.view(), expected.view()));
  ASSERT_TRUE(saved.filled());
  EXPECT_EQ(saved.batch, 2);
  EXPECT_EQ(saved.query_tokens, 7);
  EXPECT_EQ(saved.key_tokens, 7);
  EXPECT_TRUE(saved.self_attention);
  EXPECT_TRUE(saved.key_is_value);
  for (int p = 0; p < 3; ++p) {  // contiguous input rows are read in place, not copied
    EXPECT_EQ(saved.inputs[p].data, x.data());
    EXPECT_EQ(saved.inputs[p].rows, 14);
    EXPECT_EQ(saved.inputs[p].ld, 6);
  }
  expect_projections(saved, mha, x.view(), x.view(), x.view(), 2);
  // out_proj read exactly the saved context.
  EXPECT_TRUE(ref::same_bits(mha.out_proj().forward(saved.context).view(), out.view()));
  EXPECT_EQ(saved.options.scale.value(), 1.0 / std::sqrt(4.0));
  EXPECT_EQ(saved.options.dropout, 0.2);
  EXPECT_EQ(saved.options.dropout_seed, 11u);
  EXPECT_EQ(saved.options.dropout_call, 0u);
  EXPECT_EQ(saved.options.path, AttentionPath::kStreaming);
  EXPECT_TRUE(saved.mask.has_key_padding());
  EXPECT_EQ(saved.mask.padding_mask().data(), pad.data());
  // The next call claims the next dropout call number; eval mode records no dropout.
  const std::size_t bytes = saved.bytes();
  mha.forward(x.view(), out.view(), saved, ws, mask);
  EXPECT_EQ(saved.options.dropout_call, 1u);
  EXPECT_EQ(saved.bytes(), bytes);
  mha.eval();
  mha.forward(x.view(), out.view(), saved, ws);
  EXPECT_EQ(saved.options.dropout, 0.0);
  EXPECT_FALSE(saved.mask.has_key_padding());
}

TYPED_TEST(SavedForwardTest, CrossAttentionWithStridedInputsStagesTheirRows) {
  using Scalar = TypeParam;
  attn::TorchGenerator gen(6);
  const MultiHeadAttention<Scalar> mha(MultiHeadAttentionOptions::pytorch(8, 2, true, 5, 3), gen);
  const auto query = attn::test::random_tensor<Scalar>(Shape<3>{2, 4, 8}, 3);
  // key: the first 6 of 8 tokens of each batch item (rows not evenly spaced: staged);
  // value: contiguous.
  const auto long_key = attn::test::random_tensor<Scalar>(Shape<3>{2, 8, 5}, 4);
  const TensorView<const Scalar, 3> key = attn::slice(long_key.view(), 1, 0, 6);
  const auto value = attn::test::random_tensor<Scalar>(Shape<3>{2, 6, 3}, 5);
  Tensor<Scalar, 3> expected({2, 4, 8}), out({2, 4, 8});
  attn::Workspace ws;
  mha.forward(query.view(), key, value.view(), expected.view(), ws);
  SavedForward<Scalar> saved;
  mha.forward(query.view(), key, value.view(), out.view(), saved, ws);
  EXPECT_TRUE(ref::same_bits(out.view(), expected.view()));
  EXPECT_FALSE(saved.self_attention);
  EXPECT_FALSE(saved.key_is_value);
  EXPECT_EQ(saved.key_tokens, 6);
  EXPECT_EQ(saved.inputs[0].data, query.data());
  EXPECT_EQ(saved.inputs[2].data, value.data());
  const auto& staged = saved.inputs[1];
  ASSERT_NE(staged.data, key.data());
  ASSERT_EQ(staged.rows, 12);
  const TensorView<const Scalar, 3> rows(staged.data, {2, 6, 5}, {6 * staged.ld, staged.ld, 1});
  EXPECT_TRUE(ref::same_bits(rows, key));
  expect_projections(saved, mha, query.view(), key, value.view(), 2);
  EXPECT_TRUE(ref::same_bits(mha.out_proj().forward(saved.context).view(), out.view()));
}

TYPED_TEST(SavedForwardTest, SingleHeadModulesKeepTheContextTheyOutput) {
  using Scalar = TypeParam;
  attn::manual_seed(7);
  attn::SelfAttention<Scalar> v1(5, 3, attn::kRandInit);
  v1.set_scaled(false);  // notebook 001's unscaled form
  attn::CausalAttention<Scalar> causal(5, 4, 9, 0.3, true);
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{3, 6, 5}, 6);
  attn::Workspace ws;
  SavedForward<Scalar> saved;
  Tensor<Scalar, 3> out({3, 6, 3});
  v1.forward(x.view(), out.view(), saved, ws);
  EXPECT_TRUE(ref::same_bits(out.view(), v1.forward(x.view()).view()));
  EXPECT_TRUE(ref::same_bits(saved.context, TensorView<const Scalar, 3>(out.view())));
  EXPECT_EQ(saved.options.scale.value(), 1.0);
  expect_projections(saved, v1, x.view(), x.view(), x.view(), 1);
  // Unbatched, with dropout in training mode.
  const auto x2 = attn::select(x.view(), 0, 1);
  Tensor<Scalar, 2> out2({6, 4});
  causal.seed(3);
  const auto expected = causal.forward(x2);
  causal.seed(3);
  causal.forward(x2, out2.view(), saved, ws);
  EXPECT_TRUE(ref::same_bits(out2.view(), expected.view()));
  EXPECT_EQ(saved.batch, 1);
  EXPECT_EQ(saved.options.dropout, 0.3);
  EXPECT_EQ(saved.options.dropout_seed, 3u);
  EXPECT_TRUE(
      ref::same_bits(saved.context, TensorView<const Scalar, 3>(attn::unsqueeze(out2.view(), 0))));
}

TYPED_TEST(SavedForwardTest, WrapperRecordsEveryHeadAndSimpleAttentionItsInput) {
  using Scalar = TypeParam;
  attn::manual_seed(8);
  const attn::MultiHeadAttentionWrapper<Scalar> wrapper(4, 3, 8, 0.0, 3, true);
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{2, 8, 4}, 7);
  attn::Workspace ws;
  SavedForward<Scalar> saved;
  Tensor<Scalar, 3> out({2, 8, 9});
  wrapper.forward(x.view(), out.view(), saved, ws);
  EXPECT_TRUE(ref::same_bits(out.view(), wrapper.forward(x.view()).view()));
  ASSERT_EQ(saved.parts.size(), 3u);
  for (Index h = 0; h < 3; ++h) {
    const auto& part = saved.parts[static_cast<std::size_t>(h)];
    EXPECT_NE(part.owner, nullptr);
    EXPECT_NE(part.owner, saved.owner);
    EXPECT_TRUE(ref::same_bits(
        part.context, attn::slice(TensorView<const Scalar, 3>(out.view()), 2, 3 * h, 3 * h + 3)));
    expect_projections(part, wrapper.head(h), x.view(), x.view(), x.view(), 1);
  }
  // SimpleSelfAttention: q = k = v = x, read from x's rows (here staged: x is transposed).
  const attn::SimpleSelfAttention<Scalar> simple(true);
  Tensor<Scalar, 3> xt({2, 4, 8});
  attn::copy(attn::transpose(x.view(), 1, 2), xt.view());
  const auto strided = attn::transpose(TensorView<const Scalar, 3>(xt.view()), 1, 2);  // (2, 8, 4)
  Tensor<Scalar, 3> simple_out({2, 8, 4});
  simple.forward(strided, simple_out.view(), saved, ws);
  EXPECT_TRUE(ref::same_bits(simple_out.view(), simple.forward(x.view()).view()));
  EXPECT_TRUE(saved.self_attention);
  EXPECT_NE(saved.inputs[0].data, xt.data());
  EXPECT_TRUE(
      ref::same_bits(TensorView<const Scalar, 3>(saved.inputs[0].data, {2, 8, 4}), x.view()));
  EXPECT_TRUE(ref::same_bits(saved.context, TensorView<const Scalar, 3>(simple_out.view())));
  EXPECT_EQ(saved.options.scale.value(), 0.5);
}

}  // namespace

}  // namespace saved_forward_test

#include "support/bodies_end.hpp"
