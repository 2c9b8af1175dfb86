// SPDX-License-Identifier: MIT
// tests/parity/notebook_parity_test.cpp: the notebooks' CausalAttention,
// MultiHeadAttentionWrapper and MultiHeadAttention against their PyTorch versions: seeded
// construction reproduces the weights bit for bit, and outputs match on both kernel paths.
#include <gtest/gtest.h>

#include <string>

#include "attn/attn.hpp"
#include "fixtures/pytorch/notebook_cases.hpp"
#include "parity/parity_support.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace notebook_parity_test {

namespace {

using attn::Index;
using attn::select;
using attn::test::reduction_tolerance;
using attn::test::pytorch::bit_equal;
using attn::test::pytorch::CaseName;
using attn::test::pytorch::expected_values;
using attn::test::pytorch::near;
using attn::test::pytorch::notebook_cases;
using attn::test::pytorch::NotebookCase;
using attn::test::pytorch::NotebookModule;
using attn::test::pytorch::view;

// Chained reductions (first-order error bounds add; Higham, ch. 3): the projections (d_in
// terms), the scores (at most d_out terms), the softmax sum and weights * V (T terms each)
// and, for MultiHeadAttention, out_proj (d_out terms). The factor 8 of reduction_tolerance
// covers PyTorch's and attn's independent float32 roundings (the script measured PyTorch's
// float32 error at <= 1.6e-7 here), |x|.|y| exceeding |x.y| and exp()'s amplification.
template <class S>
double output_tolerance(const NotebookCase<S>& c) {
  return reduction_tolerance<S>(c.d_in + 2 * c.d_out + 2 * c.x.shape[1]);
}

// Head h's slices of the stacked (heads, d_out, d_in) weights and (heads, d_out) biases.
template <class S>
attn::TensorView<const S, 2> weight(const attn::test::pytorch::Array<S>& a, Index h) {
  return select(view<3>(a), 0, h);
}
template <class S>
attn::TensorView<const S, 1> bias(const attn::test::pytorch::Array<S>& a, Index h) {
  return select(view<2>(a), 0, h);
}

// Loads head h of the fixture into anything with w_query() / w_key() / w_value() returning
// a Linear or a LinearView.
template <class S, class Module>
void load_projections(Module& m, const NotebookCase<S>& c, Index h) {
  m.w_query().set_weight(weight(c.w_query, h));
  m.w_key().set_weight(weight(c.w_key, h));
  m.w_value().set_weight(weight(c.w_value, h));
  if (c.qkv_bias) {
    m.w_query().set_bias(bias(c.b_query, h));
    m.w_key().set_bias(bias(c.b_key, h));
    m.w_value().set_bias(bias(c.b_value, h));
  }
}

template <class S, class Module>
void expect_projections(const Module& m, const NotebookCase<S>& c, Index h) {
  const std::string head = " of head " + std::to_string(h);
  EXPECT_TRUE(bit_equal(m.w_query().weight(), weight(c.w_query, h), "W_query.weight" + head));
  EXPECT_TRUE(bit_equal(m.w_key().weight(), weight(c.w_key, h), "W_key.weight" + head));
  EXPECT_TRUE(bit_equal(m.w_value().weight(), weight(c.w_value, h), "W_value.weight" + head));
  if (c.qkv_bias) {
    EXPECT_TRUE(bit_equal(m.w_query().bias(), bias(c.b_query, h), "W_query.bias" + head));
    EXPECT_TRUE(bit_equal(m.w_key().bias(), bias(c.b_key, h), "W_key.bias" + head));
    EXPECT_TRUE(bit_equal(m.w_value().bias(), bias(c.b_value, h), "W_value.bias" + head));
  } else {
    EXPECT_FALSE(m.w_query().has_bias());
  }
}

// ---- per module: build (from the global generator), load, check ----

template <class S>
void check_causal_attention(const NotebookCase<S>& c, bool load) {
  attn::CausalAttention<S> ca(c.d_in, c.d_out, c.context_length, 0.0, c.qkv_bias);
  if (load) {
    load_projections(ca, c, 0);
  } else {
    expect_projections(ca, c, 0);
  }
  ca.eval();
  const auto x = view<3>(c.x);
  const auto expected = expected_values(c.output);
  const double tol = output_tolerance(c);
  EXPECT_TRUE(near(ca.forward(x).view(), c.output, expected, tol, "CausalAttention::forward"));
  EXPECT_TRUE(near(ca.forward_with_weights(x).output.view(), c.output, expected, tol,
                   "CausalAttention::forward_with_weights"));
}

template <class S>
void check_wrapper(const NotebookCase<S>& c, bool load) {
  attn::MultiHeadAttentionWrapper<S> wrapper(c.d_in, c.d_out, c.context_length, 0.0, c.num_heads,
                                             c.qkv_bias);
  ASSERT_EQ(wrapper.num_heads(), c.num_heads);
  for (Index h = 0; h < c.num_heads; ++h) {
    if (load) {
      load_projections(wrapper.head(h), c, h);
    } else {
      expect_projections(wrapper.head(h), c, h);
    }
  }
  wrapper.eval();
  const auto x = view<3>(c.x);
  const auto expected = expected_values(c.output);
  const double tol = output_tolerance(c);
  EXPECT_TRUE(near(wrapper.forward(x).view(), c.output, expected, tol,
                   "MultiHeadAttentionWrapper::forward"));
  // The materialised path, head by head: head h is columns [h d_out, (h+1) d_out).
  attn::Tensor<S, 3> by_head({x.extent(0), x.extent(1), c.num_heads * c.d_out});
  for (Index h = 0; h < c.num_heads; ++h) {
    const auto r = wrapper.head(h).forward_with_weights(x);
    attn::copy(r.output.view(), attn::slice(by_head.view(), 2, h * c.d_out, (h + 1) * c.d_out));
  }
  EXPECT_TRUE(near(by_head.view(), c.output, expected, tol,
                   "MultiHeadAttentionWrapper heads' forward_with_weights"));
}

template <class S>
void check_multi_head_attention(const NotebookCase<S>& c, bool load) {
  attn::MultiHeadAttention<S> mha(c.d_in, c.d_out, c.context_length, 0.0, c.num_heads, c.qkv_bias);
  ASSERT_EQ(mha.out_proj().has_bias(), c.qkv_bias) << "notebook 003: out_proj bias = qkv_bias";
  if (load) {
    load_projections(mha, c, 0);
    mha.out_proj().set_weight(view<2>(c.out_proj_weight));
    if (c.qkv_bias) mha.out_proj().set_bias(view<1>(c.out_proj_bias));
  } else {
    expect_projections(mha, c, 0);
    EXPECT_TRUE(bit_equal(mha.out_proj().weight(), c.out_proj_weight, "out_proj.weight"));
    if (c.qkv_bias) {
      EXPECT_TRUE(bit_equal(mha.out_proj().bias(), c.out_proj_bias, "out_proj.bias"));
    }
  }
  mha.eval();
  const auto x = view<3>(c.x);
  const auto expected = expected_values(c.output);
  const double tol = output_tolerance(c);
  EXPECT_TRUE(near(mha.forward(x).view(), c.output, expected, tol, "MultiHeadAttention::forward"));
  EXPECT_TRUE(near(mha.forward_with_weights(x).output.view(), c.output, expected, tol,
                   "MultiHeadAttention::forward_with_weights"));
}

template <class S>
void check(const NotebookCase<S>& c, bool load) {
  if (!load) attn::manual_seed(c.seed);  // as torch.manual_seed(seed) before the constructor
  switch (c.module) {
    case NotebookModule::kCausalAttention:
      check_causal_attention(c, load);
      break;
    case NotebookModule::kMultiHeadAttentionWrapper:
      check_wrapper(c, load);
      break;
    case NotebookModule::kMultiHeadAttention:
      check_multi_head_attention(c, load);
      break;
  }
}

class NotebookParityFloat : public ::testing::TestWithParam<NotebookCase<float>> {};
TEST_P(NotebookParityFloat, LoadedWeightsMatchPyTorch) { check(GetParam(), /*load=*/true); }
TEST_P(NotebookParityFloat, SeedReproducesWeightsAndOutput) { check(GetParam(), false); }
INSTANTIATE_TEST_SUITE_P(PyTorch, NotebookParityFloat, ::testing::ValuesIn(notebook_cases<float>()),
                         CaseName{});

class NotebookParityDouble : public ::testing::TestWithParam<NotebookCase<double>> {};
TEST_P(NotebookParityDouble, LoadedWeightsMatchPyTorch) { check(GetParam(), /*load=*/true); }
TEST_P(NotebookParityDouble, SeedReproducesWeightsAndOutput) { check(GetParam(), false); }
INSTANTIATE_TEST_SUITE_P(PyTorch, NotebookParityDouble,
                         ::testing::ValuesIn(notebook_cases<double>()), CaseName{});

}  // namespace

}  // namespace notebook_parity_test

#include "support/bodies_end.hpp"
