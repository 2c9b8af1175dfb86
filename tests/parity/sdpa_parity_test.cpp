// SPDX-License-Identifier: MIT
// tests/parity/sdpa_parity_test.cpp: scaled_dot_product_attention on both kernel paths
// against a float64 reference of softmax(q k^T * scale + mask) v (masks of every kind and
// rank, causal alignments, custom scale, fully masked rows, multi-tile lengths).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "fixtures/pytorch/sdpa_cases.hpp"
#include "parity/parity_support.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace sdpa_parity_test {
namespace {

using attn::AttentionPath;
using attn::Index;
using attn::test::reduction_tolerance;
using attn::test::pytorch::CaseName;
using attn::test::pytorch::Causal;
using attn::test::pytorch::Expected;
using attn::test::pytorch::expected_values;
using attn::test::pytorch::near;
using attn::test::pytorch::sdpa_cases;
using attn::test::pytorch::SdpaCase;
using attn::test::pytorch::view;
using attn::test::pytorch::with_view;

// ---- tolerances ----
// The reference is float64 computed from the stored inputs, so only attn's rounding counts.
// Output: scores (d terms), the softmax sum and weights * v (T_k terms each) are chained
// reductions whose first-order error bounds add (Higham, ch. 3). Weights: scores and the
// softmax sum. The factor 8 of reduction_tolerance covers |x|.|y| exceeding |x.y|, the
// amplification of a score error by exp() and the online softmax's rescaling.
template <class S>
double output_tolerance(const SdpaCase<S>& c) {
  return reduction_tolerance<S>(c.q.shape[3] + 2 * c.k.shape[2]);
}
template <class S>
double weights_tolerance(const SdpaCase<S>& c) {
  return reduction_tolerance<S>(c.q.shape[3] + c.k.shape[2]);
}

template <class S>
attn::AttentionMask<S> make_mask(const SdpaCase<S>& c) {
  attn::AttentionMask<S> mask;
  if (c.mask_bool.present()) {
    with_view(c.mask_bool, [&](auto m) {
      if (c.mask_allows) {
        mask.allowed(m);
      } else {
        mask.blocked(m);
      }
    });
  }
  if (c.mask_additive.present()) {
    with_view(c.mask_additive, [&](auto m) { mask.additive(m); });
  }
  if (c.key_padding.present()) mask.key_padding(view<2>(c.key_padding));
  if (c.causal != Causal::kNone) mask.causal(attn::test::pytorch::alignment(c.causal));
  return mask;
}

template <class S>
attn::AttentionOptions options_of(const SdpaCase<S>& c, AttentionPath path) {
  attn::AttentionOptions options;
  if (c.has_scale) options.scale = c.scale;
  options.path = path;
  return options;
}

inline const char* path_name(AttentionPath p) {
  switch (p) {
    case AttentionPath::kMaterialized:
      return "materialized";
    case AttentionPath::kStreaming:
      return "streaming";
    default:
      return "auto";
  }
}

// The reference's NaN rows (no visible key) are zeros in attn, exactly.
template <class S>
void check_output_paths(const SdpaCase<S>& c) {
  const auto q = view<4>(c.q), k = view<4>(c.k), v = view<4>(c.v);
  const auto mask = make_mask(c);
  const Expected expected = expected_values(c.output);
  for (const AttentionPath path :
       {AttentionPath::kAuto, AttentionPath::kMaterialized, AttentionPath::kStreaming}) {
    const std::string what = std::string(c.name) + " output, " + path_name(path) + " path";
    const auto out = attn::scaled_dot_product_attention(q, k, v, mask, options_of(c, path));
    EXPECT_TRUE(near(out.view(), c.output, expected, output_tolerance(c), what));
    // The in-place form with a reused workspace (second call: warm workspace).
    attn::Tensor<S, 4> into(out.shape());
    attn::Workspace ws;
    for (int call = 0; call < 2; ++call) {
      attn::scaled_dot_product_attention<S>(q, k, v, into.view(), ws, mask, options_of(c, path));
      EXPECT_TRUE(near(into.view(), c.output, expected, output_tolerance(c),
                       what + " into out, call " + std::to_string(call)));
    }
  }
}

template <class S>
void check_with_weights(const SdpaCase<S>& c) {
  const auto r = attn::scaled_dot_product_attention_with_weights(
      view<4>(c.q), view<4>(c.k), view<4>(c.v), make_mask(c), options_of(c, AttentionPath::kAuto));
  EXPECT_TRUE(near(r.output.view(), c.output, expected_values(c.output), output_tolerance(c),
                   std::string(c.name) + " with_weights output"));
  EXPECT_TRUE(near(r.weights.view(), c.weights, expected_values(c.weights), weights_tolerance(c),
                   std::string(c.name) + " weights"));
}

// The cases that store weights (all but the long one, kept small on purpose).
template <class S>
std::vector<SdpaCase<S>> cases_with_weights() {
  std::vector<SdpaCase<S>> cases;
  for (const auto& c : sdpa_cases<S>()) {
    if (c.weights.present()) cases.push_back(c);
  }
  return cases;
}

class SdpaParityFloat : public ::testing::TestWithParam<SdpaCase<float>> {};
TEST_P(SdpaParityFloat, OutputMatchesReferenceOnEveryPath) { check_output_paths(GetParam()); }
INSTANTIATE_TEST_SUITE_P(PyTorch, SdpaParityFloat, ::testing::ValuesIn(sdpa_cases<float>()),
                         CaseName{});

class SdpaParityDouble : public ::testing::TestWithParam<SdpaCase<double>> {};
TEST_P(SdpaParityDouble, OutputMatchesReferenceOnEveryPath) { check_output_paths(GetParam()); }
INSTANTIATE_TEST_SUITE_P(PyTorch, SdpaParityDouble, ::testing::ValuesIn(sdpa_cases<double>()),
                         CaseName{});

class SdpaWeightsParityFloat : public ::testing::TestWithParam<SdpaCase<float>> {};
TEST_P(SdpaWeightsParityFloat, WeightsMatchReference) { check_with_weights(GetParam()); }
INSTANTIATE_TEST_SUITE_P(PyTorch, SdpaWeightsParityFloat,
                         ::testing::ValuesIn(cases_with_weights<float>()), CaseName{});

class SdpaWeightsParityDouble : public ::testing::TestWithParam<SdpaCase<double>> {};
TEST_P(SdpaWeightsParityDouble, WeightsMatchReference) { check_with_weights(GetParam()); }
INSTANTIATE_TEST_SUITE_P(PyTorch, SdpaWeightsParityDouble,
                         ::testing::ValuesIn(cases_with_weights<double>()), CaseName{});

// The fully-masked cases must really contain reference NaN rows, or they test nothing.
template <class S>
void check_nan_rows_present() {
  int fully_masked_cases = 0;
  for (const SdpaCase<S>& c : sdpa_cases<S>()) {
    if (std::string(c.name).find("FullyMasked") == std::string::npos) continue;
    ++fully_masked_cases;
    EXPECT_GT(expected_values(c.output).replaced, 0) << c.name << ": no NaN row";
  }
  EXPECT_EQ(fully_masked_cases, 2);
}

TEST(SdpaParityFixtures, FullyMaskedCasesHaveNanRowsInReference) {
  check_nan_rows_present<float>();
  check_nan_rows_present<double>();
}

}  // namespace
}  // namespace sdpa_parity_test

#include "support/bodies_end.hpp"
