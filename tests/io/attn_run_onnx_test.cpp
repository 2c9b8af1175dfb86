// SPDX-License-Identifier: MIT
// tests/io/attn_run_onnx_test.cpp: `attn_run --format onnx` (tools/attn_run/onnx.hpp) on every
// committed ONNX Attention case (tests/fixtures/onnx/, made by scripts/onnx/ from ONNX Runtime
// 1.30 and the operator's definition in float64): each valid case's outputs against
// expected.safetensors within 1e-5 relative (and 1e-6 absolute; infinities exactly), on every
// kernel set this CPU runs; each case the operator refuses with an error naming what is
// wrong; and the flags' parsing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/io/io.hpp"
#include "attn_run/cli.hpp"
#include "io/file_test_support.hpp"
#include "support/test_support.hpp"

namespace attn_run_onnx_test {

namespace {

using attn::io::SafetensorsFile;
using attn_run::ParsedArguments;
using ::testing::HasSubstr;

const std::string kDir = std::string(ATTN_IO_FIXTURES_DIR) + "/../onnx";

// The tolerance the fixtures' README allows a float32 implementation that rounds where the
// definition does (softmax_precision FLOAT16 / BFLOAT16 included).
constexpr double kRtol = 1e-5, kAtol = 1e-6;

struct Case {
  std::string name, dir;
  nlohmann::json json;
};

std::vector<Case> cases() {
  std::vector<Case> all;
  for (const auto& entry : std::filesystem::directory_iterator(kDir)) {
    if (!entry.is_directory()) continue;
    Case c;
    c.name = entry.path().filename().string();
    c.dir = entry.path().string();
    std::ifstream in(c.dir + "/case.json");
    c.json = nlohmann::json::parse(in);
    all.push_back(std::move(c));
  }
  std::sort(all.begin(), all.end(), [](const Case& a, const Case& b) { return a.name < b.name; });
  return all;
}

// The case's attn_run arguments with its files' paths.
std::vector<std::string> argv_of(const Case& c, const std::string& output) {
  std::vector<std::string> argv;
  for (const auto& a : c.json.at("attn_run_args")) {
    const std::string arg = a.get<std::string>();
    argv.push_back(arg == "inputs.safetensors" ? c.dir + "/inputs.safetensors"
                   : arg == "out.safetensors"  ? output
                                               : arg);
  }
  return argv;
}

struct RunResult {
  int status = 0;
  std::string err;
};
RunResult run(const Case& c, const std::string& output) {
  std::ostringstream out, err;
  RunResult r;
  r.status = attn_run::main(argv_of(c, output), out, err);
  r.err = err.str();
  return r;
}

// Every element of `name` in `got` against `want`: same shape, |got - want| <= atol +
// rtol |want|, infinities equal, no NaN. Returns how many elements are out of tolerance.
std::size_t compare(const SafetensorsFile& got, const SafetensorsFile& want,
                    const std::string& name, const std::string& where) {
  EXPECT_EQ(got.shape(name), want.shape(name)) << where << " " << name;
  if (got.shape(name) != want.shape(name)) return 1;
  const std::vector<double> g = got.values<double>(name), w = want.values<double>(name);
  std::size_t bad = 0;
  double worst = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    const bool ok =
        std::isinf(w[i]) ? g[i] == w[i] : std::abs(g[i] - w[i]) <= kAtol + kRtol * std::abs(w[i]);
    if (!ok) {
      ++bad;
      worst = std::max(worst, std::abs(g[i] - w[i]));
    }
  }
  EXPECT_EQ(bad, 0u) << where << " " << name << ": " << bad << " of " << w.size()
                     << " elements out of tolerance, worst |diff| " << worst;
  return bad;
}

TEST(AttnRunOnnx, EveryValidCaseMatchesTheDefinitionOnEveryKernelSet) {
  const std::vector<Case> all = cases();
  ASSERT_GE(all.size(), 250u) << "fixtures missing in " << kDir;
  attn::test::TempDir tmp;
  std::size_t valid = 0;
  for (const attn::Isa isa : attn::test::runnable_sets()) {
    attn::set_isa(isa);
    for (const Case& c : all) {
      if (c.json.at("expect_error").get<bool>()) continue;
      const std::string where = c.name + " (" + attn::isa_name(isa) + ")";
      const std::string output = tmp.file(c.name + ".safetensors");
      const RunResult r = run(c, output);
      ASSERT_EQ(r.status, 0) << where << ": " << r.err;
      const SafetensorsFile got = SafetensorsFile::open(output);
      const SafetensorsFile want = SafetensorsFile::open(c.dir + "/expected.safetensors");
      std::set<std::string> expected_names;
      for (const auto& n : c.json.at("outputs")) expected_names.insert(n.get<std::string>());
      const std::vector<std::string> names = got.names();
      EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), expected_names) << where;
      for (const std::string& name : expected_names) {
        EXPECT_EQ(got.dtype(name), attn::io::DType::kF32) << where << " " << name;
        compare(got, want, name, where);
      }
      ++valid;
    }
  }
  attn::set_isa(attn::best_isa());
  EXPECT_GE(valid, 238u);
}

TEST(AttnRunOnnx, EveryRefusedCaseFailsNamingWhatIsWrong) {
  attn::test::TempDir tmp;
  std::size_t refused = 0;
  for (const Case& c : cases()) {
    if (!c.json.at("expect_error").get<bool>()) continue;
    const std::string output = tmp.file(c.name + ".safetensors");
    const RunResult r = run(c, output);
    EXPECT_NE(r.status, 0) << c.name;
    EXPECT_FALSE(std::filesystem::exists(output)) << c.name << " wrote an output";
    // The definition's message starts with what it refuses: Q, K, attn_mask, past_key,
    // q_num_heads, scale, ... The error names the same.
    const std::string spec = c.json.at("spec_error").get<std::string>();
    const std::string subject = spec.substr(0, spec.find_first_of(" :,'"));
    EXPECT_THAT(r.err, HasSubstr(subject)) << c.name << ": " << spec;
    ++refused;
  }
  EXPECT_GE(refused, 19u);
}

TEST(AttnRunOnnx, ParsesTheOperatorsAttributesAndRefusesMisplacedFlags) {
  const ParsedArguments ok = attn_run::parse_arguments({"--format",
                                                        "onnx",
                                                        "--input",
                                                        "x",
                                                        "--output",
                                                        "y",
                                                        "--q-num-heads",
                                                        "8",
                                                        "--kv-num-heads",
                                                        "2",
                                                        "--is-causal",
                                                        "1",
                                                        "--scale",
                                                        "0.125",
                                                        "--softcap",
                                                        "30",
                                                        "--qk-matmul-output-mode",
                                                        "2",
                                                        "--softmax-precision",
                                                        "10"});
  ASSERT_EQ(ok.action, ParsedArguments::Action::kRun) << ok.error;
  const attn_run::OnnxOptions& o = ok.arguments.onnx_options;
  EXPECT_TRUE(ok.arguments.onnx);
  EXPECT_EQ(o.q_num_heads, 8);
  EXPECT_EQ(o.kv_num_heads, 2);
  EXPECT_EQ(o.is_causal, 1);
  EXPECT_EQ(o.scale, 0.125);
  EXPECT_EQ(o.softcap, 30.0);
  EXPECT_EQ(o.qk_matmul_output_mode, 2);
  EXPECT_EQ(o.softmax_precision, 10);
  const auto error_of = [](std::vector<std::string> argv) {
    const ParsedArguments p = attn_run::parse_arguments(argv);
    EXPECT_EQ(p.action, ParsedArguments::Action::kError);
    return p.error;
  };
  EXPECT_THAT(error_of({"--format", "onnx", "--input", "x", "--output", "y", "--weights", "w"}),
              HasSubstr("--weights is not used with --format onnx"));
  EXPECT_THAT(error_of({"--format", "onnx", "--input", "x", "--output", "y", "--causal"}),
              HasSubstr("--causal is not used with --format onnx"));
  EXPECT_THAT(error_of({"--weights", "w", "--input", "x", "--output", "y", "--num-heads", "2",
                        "--softcap", "5"}),
              HasSubstr("--softcap needs --format onnx"));
  EXPECT_THAT(error_of({"--format", "onnx", "--input", "x", "--output", "y", "--is-causal", "2"}),
              HasSubstr("--is-causal expects 0 or 1"));
  EXPECT_THAT(error_of({"--format", "onnx", "--input", "x", "--output", "y", "--scale", "nan"}),
              HasSubstr("--scale expects a finite number"));
  EXPECT_THAT(error_of({"--format", "onnx", "--output", "y"}), HasSubstr("--input is required"));
}

}  // namespace

}  // namespace attn_run_onnx_test
