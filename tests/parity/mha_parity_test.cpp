// SPDX-License-Identifier: MIT
// tests/parity/mha_parity_test.cpp: MultiHeadAttention and CrossAttention against
// torch.nn.MultiheadAttention fixtures (self/cross, kdim/vdim, biases, every mask kind).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "fixtures/pytorch/mha_cases.hpp"
#include "parity/parity_support.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace mha_parity_test {

namespace {

using attn::Index;
using attn::test::reduction_tolerance;
using attn::test::pytorch::CaseName;
using attn::test::pytorch::Causal;
using attn::test::pytorch::Expected;
using attn::test::pytorch::expected_values;
using attn::test::pytorch::mha_cases;
using attn::test::pytorch::MhaCase;
using attn::test::pytorch::near;
using attn::test::pytorch::view;
using attn::test::pytorch::with_view;

// ---- tolerances ----
// The output is a chain of reductions: the input projection (max(E, kdim, vdim) terms), the
// scores (head_dim terms), the softmax sum and weights * V (T_k terms each) and out_proj
// (E terms). Rounding-error bounds of chained dot products add to first order (Higham,
// ch. 3: |fl(x.y) - x.y| <= n eps |x|.|y|), so n is the sum of the lengths. The factor 8 of
// reduction_tolerance covers two independent roundings (PyTorch's and attn's; they use
// different summation orders), |x|.|y| exceeding |x.y| and the amplification of a score
// error by exp(). For float the fixtures hold PyTorch's own float32 results; the script
// prints PyTorch float32 vs float64 (up to 1.5e-6 here, against a float tolerance ~4e-5).
template <class S>
Index key_length(const MhaCase<S>& c) {
  return c.self_attention ? c.query.shape[1] : c.key.shape[1];
}
template <class S>
double output_tolerance(const MhaCase<S>& c) {
  const Index n = std::max({c.embed_dim, c.kdim, c.vdim}) + c.embed_dim / c.num_heads +
                  2 * key_length(c) + c.embed_dim;
  return reduction_tolerance<S>(n);
}
// The weights depend on the Q/K projections, the scores and the softmax sum only.
template <class S>
double weights_tolerance(const MhaCase<S>& c) {
  return reduction_tolerance<S>(std::max(c.embed_dim, c.kdim) + c.embed_dim / c.num_heads +
                                key_length(c));
}

// ---- loading a fixture into attn ----

/// How the boolean attn_mask reaches attn: the stored mask (`blocked`, PyTorch's
/// polarity); for causal cases also AttentionMask::causal(alignment) instead of it, or the
/// module's own causal option (MultiHeadAttentionOptions::causal + causal_alignment).
enum class MaskForm { kStored, kCausalBound, kModuleCausal };

template <class S>
std::vector<MaskForm> mask_forms(const MhaCase<S>& c) {
  if (c.causal == Causal::kNone) return {MaskForm::kStored};
  return {MaskForm::kStored, MaskForm::kCausalBound, MaskForm::kModuleCausal};
}
inline const char* form_name(MaskForm f) {
  switch (f) {
    case MaskForm::kCausalBound:
      return "AttentionMask::causal()";
    case MaskForm::kModuleCausal:
      return "MultiHeadAttentionOptions::causal";
    default:
      return "stored attn_mask";
  }
}

template <class S>
attn::MultiHeadAttention<S> load_module(const MhaCase<S>& c, MaskForm form = MaskForm::kStored) {
  auto options =
      attn::MultiHeadAttentionOptions::pytorch(c.embed_dim, c.num_heads, c.bias, c.kdim, c.vdim);
  if (form == MaskForm::kModuleCausal) {
    options.causal = true;
    options.causal_alignment = attn::test::pytorch::alignment(c.causal);
  }
  attn::MultiHeadAttention<S> mha(options);
  mha.eval();
  if (c.in_proj_weight.present()) {
    mha.set_in_proj(view<2>(c.in_proj_weight),
                    c.bias ? view<1>(c.in_proj_bias) : attn::TensorView<const S, 1>{});
  } else {
    attn::copy(view<2>(c.q_proj_weight), mha.q_proj_weight());
    attn::copy(view<2>(c.k_proj_weight), mha.k_proj_weight());
    attn::copy(view<2>(c.v_proj_weight), mha.v_proj_weight());
    if (c.bias) attn::copy(view<1>(c.in_proj_bias), mha.in_proj_bias());
  }
  mha.out_proj().set_weight(view<2>(c.out_proj_weight));
  if (c.bias) mha.out_proj().set_bias(view<1>(c.out_proj_bias));
  return mha;
}

/// The three inputs as PyTorch received them: one view for self-attention, so attn sees
/// the same tensor three times (its fused-QKV path), and one for key_is_value.
template <class S>
struct Inputs {
  attn::TensorView<const S, 3> query, key, value;
};
template <class S>
Inputs<S> inputs_of(const MhaCase<S>& c) {
  Inputs<S> in;
  in.query = view<3>(c.query);
  in.key = c.self_attention ? in.query : view<3>(c.key);
  in.value = c.self_attention ? in.query : (c.key_is_value ? in.key : view<3>(c.value));
  return in;
}

template <class S>
attn::AttentionMask<S> make_mask(const MhaCase<S>& c, MaskForm form) {
  attn::AttentionMask<S> mask;
  if (form == MaskForm::kCausalBound) {
    mask.causal(attn::test::pytorch::alignment(c.causal));
  } else if (form == MaskForm::kStored && c.attn_mask_bool.present()) {
    with_view(c.attn_mask_bool, [&](auto m) { mask.blocked(m); });
  }
  if (c.attn_mask_float.present()) {
    with_view(c.attn_mask_float, [&](auto m) { mask.additive(m); });
  }
  if (c.key_padding_mask.present()) mask.key_padding(view<2>(c.key_padding_mask));
  return mask;
}

/// PyTorch's output with its NaN rows (no visible key) replaced by attn's defined result:
/// zero context, so out_proj gives its bias (or zero without bias).
template <class S>
Expected expected_output(const MhaCase<S>& c) {
  return expected_values(c.output, [&](Index i) {
    return c.bias ? static_cast<double>(c.out_proj_bias.values[i % c.embed_dim]) : 0.0;
  });
}

// ---- checks ----

template <class S>
void check_forward(const MhaCase<S>& c) {
  const Inputs<S> in = inputs_of(c);
  const Expected expected = expected_output(c);
  const double tol = output_tolerance(c);
  for (const MaskForm form : mask_forms(c)) {
    SCOPED_TRACE(form_name(form));
    const auto mha = load_module(c, form);
    const auto mask = make_mask(c, form);
    // Allocating forward: the module's default (streaming) path.
    const attn::Tensor<S, 3> out = mha.forward(in.query, in.key, in.value, mask);
    EXPECT_TRUE(near(out.view(), c.output, expected, tol, std::string(c.name) + " forward"));
    // Preallocated output and a reused workspace (second call: warm workspace).
    attn::Tensor<S, 3> into(out.shape());
    attn::Workspace ws;
    for (int call = 0; call < 2; ++call) {
      mha.forward(in.query, in.key, in.value, into.view(), ws, mask);
      EXPECT_TRUE(near(into.view(), c.output, expected, tol,
                       std::string(c.name) + " forward into out, call " + std::to_string(call)));
    }
  }
}

template <class S>
void check_forward_with_weights(const MhaCase<S>& c) {
  const Inputs<S> in = inputs_of(c);
  const Expected output = expected_output(c);
  const Expected per_head = expected_values(c.weights_per_head);
  const Expected averaged = expected_values(c.weights_averaged);
  for (const MaskForm form : mask_forms(c)) {
    SCOPED_TRACE(form_name(form));
    const auto mha = load_module(c, form);
    // forward_with_weights runs the materialised path.
    const auto r = mha.forward_with_weights(in.query, in.key, in.value, make_mask(c, form));
    const std::string name = c.name;
    EXPECT_TRUE(near(r.output.view(), c.output, output, output_tolerance(c),
                     name + " forward_with_weights output"));
    EXPECT_TRUE(near(r.weights.view(), c.weights_per_head, per_head, weights_tolerance(c),
                     name + " per-head weights"));
    EXPECT_TRUE(near(attn::average_heads(r.weights.view()).view(), c.weights_averaged, averaged,
                     weights_tolerance(c), name + " average_heads(weights)"));
  }
}

// Distinct copies of query, key and value force the general path (one GEMM per input),
// whatever path the shared-tensor form takes.
template <class S>
void check_distinct_copies(const MhaCase<S>& c) {
  const auto mha = load_module(c);
  const Inputs<S> in = inputs_of(c);
  const attn::Tensor<S, 3> query(in.query), key(in.key), value(in.value);
  const auto mask = make_mask(c, MaskForm::kStored);
  const auto out = mha.forward(query.view(), key.view(), value.view(), mask);
  EXPECT_TRUE(near(out.view(), c.output, expected_output(c), output_tolerance(c),
                   std::string(c.name) + " forward with copies"));
  const auto r = mha.forward_with_weights(query.view(), key.view(), value.view(), mask);
  EXPECT_TRUE(near(r.output.view(), c.output, expected_output(c), output_tolerance(c),
                   std::string(c.name) + " forward_with_weights with copies"));
}

// The fully-masked cases must really contain PyTorch NaN rows, or they test nothing.
template <class S>
void check_nan_rows_present() {
  int fully_masked_cases = 0;
  for (const MhaCase<S>& c : mha_cases<S>()) {
    if (std::string(c.name).find("FullyMasked") == std::string::npos) continue;
    ++fully_masked_cases;
    EXPECT_GT(expected_output(c).replaced, 0) << c.name << ": no NaN row in PyTorch's output";
    EXPECT_GT(expected_values(c.weights_per_head).replaced, 0) << c.name;
  }
  EXPECT_EQ(fully_masked_cases, 2);
}

TEST(MhaParityFixtures, FullyMaskedCasesHaveNanRowsInPyTorch) {
  check_nan_rows_present<float>();
  check_nan_rows_present<double>();
}

class MhaParityFloat : public ::testing::TestWithParam<MhaCase<float>> {};
TEST_P(MhaParityFloat, ForwardMatchesPyTorch) { check_forward(GetParam()); }
TEST_P(MhaParityFloat, ForwardWithWeightsMatchesPyTorch) { check_forward_with_weights(GetParam()); }
TEST_P(MhaParityFloat, DistinctInputCopiesMatchPyTorch) { check_distinct_copies(GetParam()); }
INSTANTIATE_TEST_SUITE_P(PyTorch, MhaParityFloat, ::testing::ValuesIn(mha_cases<float>()),
                         CaseName{});

class MhaParityDouble : public ::testing::TestWithParam<MhaCase<double>> {};
TEST_P(MhaParityDouble, ForwardMatchesPyTorch) { check_forward(GetParam()); }
TEST_P(MhaParityDouble, ForwardWithWeightsMatchesPyTorch) {
  check_forward_with_weights(GetParam());
}
TEST_P(MhaParityDouble, DistinctInputCopiesMatchPyTorch) { check_distinct_copies(GetParam()); }
INSTANTIATE_TEST_SUITE_P(PyTorch, MhaParityDouble, ::testing::ValuesIn(mha_cases<double>()),
                         CaseName{});

// CrossAttention(d_q, d_kv, d_out, num_heads, qkv_bias=true) is nn.MultiheadAttention with
// kdim = vdim = d_kv, bias=True, called with key = value.
template <class S>
void check_cross_attention_class() {
  const auto cases = mha_cases<S>();
  const auto it = std::find_if(cases.begin(), cases.end(), [](const MhaCase<S>& c) {
    return std::string(c.name) == "CrossKvSharedBias";
  });
  ASSERT_NE(it, cases.end());
  const MhaCase<S>& c = *it;
  ASSERT_TRUE(c.key_is_value && c.bias && c.kdim == c.vdim);
  attn::CrossAttention<S> cross(c.embed_dim, c.kdim, c.embed_dim, c.num_heads, /*qkv_bias=*/true);
  cross.eval();
  auto& m = cross.module();
  attn::copy(view<2>(c.q_proj_weight), m.q_proj_weight());
  attn::copy(view<2>(c.k_proj_weight), m.k_proj_weight());
  attn::copy(view<2>(c.v_proj_weight), m.v_proj_weight());
  attn::copy(view<1>(c.in_proj_bias), m.in_proj_bias());
  m.out_proj().set_weight(view<2>(c.out_proj_weight));
  m.out_proj().set_bias(view<1>(c.out_proj_bias));
  const auto x_q = view<3>(c.query), x_kv = view<3>(c.key);
  EXPECT_TRUE(near(cross.forward(x_q, x_kv).view(), c.output, expected_output(c),
                   output_tolerance(c), "CrossAttention::forward"));
  const auto r = cross.forward_with_weights(x_q, x_kv);
  EXPECT_TRUE(near(r.output.view(), c.output, expected_output(c), output_tolerance(c),
                   "CrossAttention::forward_with_weights"));
  EXPECT_TRUE(near(r.weights.view(), c.weights_per_head, expected_values(c.weights_per_head),
                   weights_tolerance(c), "CrossAttention weights"));
}

TEST(CrossAttentionParity, FloatMatchesMultiheadAttentionWithKdim) {
  check_cross_attention_class<float>();
}
TEST(CrossAttentionParity, DoubleMatchesMultiheadAttentionWithKdim) {
  check_cross_attention_class<double>();
}

}  // namespace

}  // namespace mha_parity_test

#include "support/bodies_end.hpp"
