// SPDX-License-Identifier: MIT
// tests/io/pytorch_fixtures_test.cpp: attn_run's core reproduces PyTorch 1.13's
// nn.MultiheadAttention on the committed safetensors fixtures (tests/fixtures/io/, written
// by scripts/parity_vs_pytorch.py), without Python.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/io/io.hpp"
#include "attn_run/run.hpp"
#include "io/fixture_support.hpp"

namespace pytorch_fixtures_test {
namespace {

using attn::io::FormatError;
using attn::io::SafetensorsFile;
using attn::io::SafetensorsWriter;
using attn_run::RunOptions;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

const std::string kDir = ATTN_IO_FIXTURES_DIR;

std::vector<std::string> fixture_cases() { return attn::test::fixture_cases(kDir); }

struct Comparison {
  double max_rel = 0, max_weights = 0;
  long skipped_rows = 0;
};

// Max |got - want| / max |want| over the rows PyTorch did not return NaN for.
Comparison compare(const SafetensorsFile& got, const SafetensorsFile& want) {
  Comparison c;
  const auto y = got.values<double>("output"), ref = want.values<double>("output");
  const auto finite = want.values<bool>("finite_rows");
  EXPECT_EQ(y.size(), ref.size());
  if (y.size() != ref.size() || finite.empty()) return c;
  const std::size_t width = ref.size() / finite.size();
  double scale = 0, err = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (!finite[i / width]) continue;
    scale = std::max(scale, std::abs(ref[i]));
    err = std::max(err, std::abs(y[i] - ref[i]));
    EXPECT_TRUE(std::isfinite(y[i]));
  }
  for (const bool f : finite) c.skipped_rows += f ? 0 : 1;
  c.max_rel = err / std::max(scale, 1e-30);
  if (want.contains("weights")) {
    const auto w = got.values<double>("weights"), wref = want.values<double>("weights");
    EXPECT_EQ(w.size(), wref.size());
    const std::size_t tk = wref.size() / finite.size();  // weights rows follow output rows
    for (std::size_t i = 0; i < std::min(w.size(), wref.size()); ++i) {
      if (!finite[i / tk]) continue;
      c.max_weights = std::max(c.max_weights, std::abs(w[i] - wref[i]));
    }
  }
  return c;
}

TEST(PytorchFixtures, EveryCaseMatchesPyTorch) {
  const std::vector<std::string> cases = fixture_cases();
  ASSERT_GE(cases.size(), 5u) << "fixtures missing in " << kDir;
  for (const std::string& name : cases) {
    SCOPED_TRACE(name);
    const auto [weights, input, expected] = attn::test::Fixture(kDir, name);
    const auto [options, use_double] = attn::test::fixture_run(expected.metadata());
    const SafetensorsWriter result =
        use_double ? attn_run::run_multi_head_attention<double>(weights, input, options)
                   : attn_run::run_multi_head_attention<float>(weights, input, options);
    const auto got = SafetensorsFile::from_bytes(result.to_bytes());
    EXPECT_EQ(got.shape("output"), expected.shape("output"));
    const Comparison c = compare(got, expected);
    const double tol = use_double ? 1e-12 : 1e-5;
    EXPECT_LE(c.max_rel, tol) << expected.metadata().at("case");
    EXPECT_LE(c.max_weights, tol) << expected.metadata().at("case");
    if (options.need_weights) {
      EXPECT_EQ(got.shape("weights"), expected.shape("weights"));
    }
  }
}

TEST(PytorchFixtures, FullyMaskedRowsAreZeroWhereTorchGivesNan) {
  // case045: bool (B*H, T_q, T_k) mask with two fully masked (batch, head, query) rows.
  const auto [weights, input, expected] = attn::test::Fixture(kDir, "case045");
  RunOptions options;
  options.num_heads = 4;
  options.need_weights = true;
  const auto got = SafetensorsFile::from_bytes(
      attn_run::run_multi_head_attention<float>(weights, input, options).to_bytes());
  const auto finite = expected.values<bool>("finite_rows");
  EXPECT_EQ(std::count(finite.begin(), finite.end(), false), 2);
  for (const float v : got.values<float>("output")) EXPECT_TRUE(std::isfinite(v));
}

// ---- the runner's input checks ----

SafetensorsFile small_weights() {
  attn::TorchGenerator gen(1);
  const attn::MultiHeadAttention<float> m(attn::MultiHeadAttentionOptions::pytorch(4, 2), gen);
  SafetensorsWriter w;
  attn::io::save_state_dict(m, w);
  return SafetensorsFile::from_bytes(w.to_bytes(), "w.safetensors");
}

SafetensorsFile inputs(SafetensorsWriter& w) {
  return SafetensorsFile::from_bytes(w.to_bytes(), "x.safetensors");
}

TEST(Runner, RejectsMissingQueryAndUnpairedKey) {
  RunOptions o;
  o.num_heads = 2;
  SafetensorsWriter none;
  none.add("x", attn::Tensor<float, 3>({1, 2, 4}));
  EXPECT_THAT([&] { attn_run::run_multi_head_attention<float>(small_weights(), inputs(none), o); },
              ThrowsMessage<FormatError>(HasSubstr("'x.safetensors' has no tensor 'query'")));
  SafetensorsWriter key_only;
  key_only.add("query", attn::Tensor<float, 3>({1, 2, 4}))
      .add("key", attn::Tensor<float, 3>({1, 3, 4}));
  EXPECT_THAT(
      [&] { attn_run::run_multi_head_attention<float>(small_weights(), inputs(key_only), o); },
      ThrowsMessage<FormatError>(HasSubstr("has 'key' but no 'value'")));
}

TEST(Runner, RejectsMisshapedMasksNamingTheExpectedShapes) {
  RunOptions o;
  o.num_heads = 2;
  SafetensorsWriter w;
  w.add("query", attn::Tensor<float, 3>({3, 2, 4}));
  w.add("attn_mask", attn::Tensor<bool, 3>({3, 2, 2}));  // B=3, needs B*H = 6
  EXPECT_THAT([&] { attn_run::run_multi_head_attention<float>(small_weights(), inputs(w), o); },
              ThrowsMessage<FormatError>(
                  HasSubstr("attn_mask has shape [3, 2, 2], expected (T_q, T_k) = [2, 2] or "
                            "(B * num_heads, T_q, T_k) = [6, 2, 2]")));
  SafetensorsWriter p;
  p.add("query", attn::Tensor<float, 3>({3, 2, 4}));
  p.add("key_padding_mask", attn::Tensor<bool, 2>({3, 3}));
  EXPECT_THAT([&] { attn_run::run_multi_head_attention<float>(small_weights(), inputs(p), o); },
              ThrowsMessage<FormatError>(
                  HasSubstr("key_padding_mask has shape [3, 3], expected (B, T_k) = [3, 2]")));
}

TEST(Runner, WrongEmbeddingSizeIsAShapeError) {
  RunOptions o;
  o.num_heads = 2;
  SafetensorsWriter w;
  w.add("query", attn::Tensor<float, 3>({1, 2, 5}));
  EXPECT_THAT([&] { attn_run::run_multi_head_attention<float>(small_weights(), inputs(w), o); },
              ThrowsMessage<attn::ShapeError>(HasSubstr("(1, 2, 5)")));
}

}  // namespace
}  // namespace pytorch_fixtures_test
