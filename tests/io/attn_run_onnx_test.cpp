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
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/attn.hpp"
#include "attn/io/io.hpp"
#include "attn_run/cli.hpp"
#include "io/file_test_support.hpp"
#include "support/test_support.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

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

// BF16 and F16 inputs: the operator's type T1 is Q's, and the run against the float run on
// the same values (F32 files of them) differs by the definition's roundings to T1 (half-ulp
// u: 2^-9 bfloat16, 2^-11 float16): the scores x the softmax reads (|x| <= 8 / sqrt(8) + 0.5
// here: d = 8, inputs in [-1, 1], the mask's values up to 0.5), which move each probability
// by at most 2 u max|x| relative; the probabilities (u); Y (u |Y|). So |Y - Y_float| <=
// u (2 max|x| + 1) max|V| + u |Y_float|, max|V| <= 1 (and 1e-6 for the float run's own sums).
// present_key / present_value are the inputs' bits; --dtype bf16 (fp16) rounds F32 inputs to
// the same values; --output-dtype f32 widens Y exactly; softmax_precision FLOAT computes as the
// default, the softmax's result cast back to T1 (mode 3: rows that sum to 1 within T u).
TEST(AttnRunOnnx, Bf16AndF16InputsRunInTheirTypeCloseToTheFloatRun) {
  const attn::Index b = 2, hq = 4, hkv = 2, sq = 3, skv = 5, p = 4, d = 8, total = p + skv;
  const auto random = [](attn::Shape<4> shape, std::uint64_t seed) {
    return attn::test::random_tensor<float, 4>(shape, seed);  // uniform in [-1, 1]
  };
  const attn::Tensor<float, 4> q = random({b, hq, sq, d}, 1), k = random({b, hkv, skv, d}, 2),
                               v = random({b, hkv, skv, d}, 3), pk = random({b, hkv, p, d}, 4),
                               pv = random({b, hkv, p, d}, 5);
  attn::Tensor<float, 2> mask({sq, total});  // additive, one key hidden per row
  for (attn::Index i = 0; i < mask.size(); ++i) {
    mask.data()[i] = i % 4 == 1 ? -std::numeric_limits<float>::infinity() : 0.25f * (i % 3);
  }
  const auto file = [&](auto element) {
    using E = decltype(element);
    attn::io::SafetensorsWriter w;
    const auto put = [&](const char* name, const auto& t) {
      if constexpr (std::is_same_v<E, float>) {
        w.add(name, t);
      } else {
        w.add(name, attn::convert<E>(t));
      }
    };
    put("Q", q), put("K", k), put("V", v), put("past_key", pk), put("past_value", pv);
    put("attn_mask", mask);
    return SafetensorsFile::from_bytes(w.to_bytes(), "in.safetensors");
  };
  const auto widened = [](const SafetensorsFile& f) {
    attn::io::SafetensorsWriter w;
    for (const std::string& name : f.names()) {
      if (f.rank(name) == 2) w.add(name, f.get<float, 2>(name));
      if (f.rank(name) == 4) w.add(name, f.get<float, 4>(name));
    }
    return SafetensorsFile::from_bytes(w.to_bytes(), "f32.safetensors");
  };
  const auto run_on = [](const SafetensorsFile& in, const attn_run::OnnxOptions& o) {
    return SafetensorsFile::from_bytes(attn_run::run_onnx_attention<float>(in, o).to_bytes());
  };
  const double x_max = d / std::sqrt(static_cast<double>(d)) + 0.5;
  for (const bool bf16 : {true, false}) {
    SCOPED_TRACE(bf16 ? "BF16" : "F16");
    const double u = bf16 ? 1.0 / 512 : 1.0 / 2048;
    const attn::io::DType type = bf16 ? attn::io::DType::kBF16 : attn::io::DType::kF16;
    const SafetensorsFile in = bf16 ? file(attn::bfloat16()) : file(attn::float16());
    attn_run::OnnxOptions o;
    const SafetensorsFile got = run_on(in, o), want = run_on(widened(in), o);
    for (const char* name : {"Y", "present_key", "present_value"}) {
      EXPECT_EQ(got.dtype(name), type) << name;
      EXPECT_EQ(want.dtype(name), attn::io::DType::kF32) << name;
    }
    // present: past then the new keys, their bits.
    const std::vector<float> present = got.values<float>("present_key");
    const std::vector<float> past = in.values<float>("past_key"), now = in.values<float>("K");
    for (attn::Index i = 0; i < b * hkv; ++i) {
      for (attn::Index j = 0; j < total * d; ++j) {
        const float expected = j < p * d ? past[static_cast<std::size_t>(i * p * d + j)]
                                         : now[static_cast<std::size_t>(i * skv * d + j - p * d)];
        ASSERT_EQ(present[static_cast<std::size_t>(i * total * d + j)], expected) << i << " " << j;
      }
    }
    EXPECT_EQ(got.values<float>("present_value"), want.values<float>("present_value"));
    const std::vector<double> y = got.values<double>("Y"), y_float = want.values<double>("Y");
    ASSERT_EQ(y.size(), y_float.size());
    double worst = 0;
    for (std::size_t i = 0; i < y.size(); ++i) {
      const double bound = u * (2 * x_max + 1) + u * std::abs(y_float[i]) + 1e-6;
      EXPECT_LE(std::abs(y[i] - y_float[i]), bound) << "element " << i;
      worst = std::max(worst, std::abs(y[i] - y_float[i]));
    }
    EXPECT_GT(worst, 0.0);  // the roundings are there
    // The definition's roundings, computed here in double from the same values: the biased
    // scores rounded to T1, the softmax, P rounded to T1, Y = P V rounded to T1. attn's scores
    // are float sums (1e-7 from these), so a score or probability within that of a rounding
    // midpoint may round the other way: nearly every element has the same bits, and all are
    // within the bound above.
    const auto round_t1 = [&](double x) {
      return bf16 ? static_cast<double>(attn::bfloat16(x)) : static_cast<double>(attn::float16(x));
    };
    const std::vector<double> qv = in.values<double>("Q"), kv = want.values<double>("present_key"),
                              vv = want.values<double>("present_value"),
                              mv = in.values<double>("attn_mask");
    std::size_t same = 0;
    for (attn::Index bb = 0; bb < b; ++bb) {
      for (attn::Index h = 0; h < hq; ++h) {
        const attn::Index g = bb * hkv + h / (hq / hkv);
        for (attn::Index i = 0; i < sq; ++i) {
          std::vector<double> x(static_cast<std::size_t>(total));
          double top = -std::numeric_limits<double>::infinity(), sum = 0;
          for (attn::Index j = 0; j < total; ++j) {
            double dot = 0;
            for (attn::Index c = 0; c < d; ++c) {
              dot += qv[static_cast<std::size_t>(((bb * hq + h) * sq + i) * d + c)] *
                     kv[static_cast<std::size_t>((g * total + j) * d + c)];
            }
            x[j] = round_t1(dot / std::sqrt(static_cast<double>(d)) +
                            mv[static_cast<std::size_t>(i * total + j)]);
            top = std::max(top, x[j]);
          }
          for (double& e : x) sum += (e = std::exp(e - top));
          for (attn::Index c = 0; c < d; ++c) {
            double acc = 0;
            for (attn::Index j = 0; j < total; ++j) {
              acc += round_t1(x[j] / sum) * vv[static_cast<std::size_t>((g * total + j) * d + c)];
            }
            const std::size_t at = static_cast<std::size_t>(((bb * hq + h) * sq + i) * d + c);
            same += y[at] == round_t1(acc);
            EXPECT_LE(std::abs(y[at] - round_t1(acc)), u * (2 * x_max + 1) + u * std::abs(acc))
                << "element " << at;
          }
        }
      }
    }
    EXPECT_GE(same, y.size() * 95 / 100);
    // softmax_precision FLOAT: the same (the scores are T1's, the result cast back to T1).
    attn_run::OnnxOptions as_float = o;
    as_float.softmax_precision = attn_run::onnx::kFloat;
    EXPECT_EQ(run_on(in, as_float).values<float>("Y"), got.values<float>("Y"));
    // Mode 3: T1 probabilities, each row summing to 1 within T u (a row hides one key or more).
    attn_run::OnnxOptions probs = o;
    probs.qk_matmul_output_mode = 3;
    const SafetensorsFile with_probs = run_on(in, probs);
    EXPECT_EQ(with_probs.dtype("qk_matmul_output"), type);
    EXPECT_EQ(with_probs.values<float>("Y"), got.values<float>("Y"));
    const std::vector<double> pr = with_probs.values<double>("qk_matmul_output");
    for (std::size_t row = 0; row < pr.size() / total; ++row) {
      double sum = 0;
      for (attn::Index j = 0; j < total; ++j) sum += pr[row * total + j];
      EXPECT_NEAR(sum, 1.0, total * u) << "row " << row;
    }
  }
  // --dtype bf16 (fp16) on F32 inputs: rounded to the BF16 (F16) file's values, the same
  // outputs; written widened with --output-dtype f32.
  for (const bool bf16 : {true, false}) {
    const std::string dtype = bf16 ? "bf16" : "fp16";
    SCOPED_TRACE("--dtype " + dtype);
    const attn::io::DType type = bf16 ? attn::io::DType::kBF16 : attn::io::DType::kF16;
    const SafetensorsFile narrow_in = bf16 ? file(attn::bfloat16()) : file(attn::float16());
    const SafetensorsFile reference = run_on(narrow_in, {});
    const std::vector<std::string> argv{"--format", "onnx", "--input", "x",
                                        "--output", "y",    "--dtype", dtype};
    const ParsedArguments narrow = attn_run::parse_arguments(argv);
    ASSERT_EQ(narrow.action, ParsedArguments::Action::kRun) << narrow.error;
    ASSERT_EQ(narrow.arguments.onnx_options.input_type, type);
    const SafetensorsFile from_f32 = run_on(file(0.0f), narrow.arguments.onnx_options);
    EXPECT_EQ(from_f32.dtype("Y"), type);
    EXPECT_EQ(from_f32.values<float>("Y"), reference.values<float>("Y"));
    EXPECT_EQ(from_f32.values<float>("present_key"), reference.values<float>("present_key"));
    std::vector<std::string> wide_argv = argv;
    wide_argv.insert(wide_argv.end(), {"--output-dtype", "f32"});
    const ParsedArguments wide = attn_run::parse_arguments(wide_argv);
    ASSERT_EQ(wide.action, ParsedArguments::Action::kRun) << wide.error;
    const SafetensorsFile widened_y = run_on(narrow_in, wide.arguments.onnx_options);
    EXPECT_EQ(widened_y.dtype("Y"), attn::io::DType::kF32);
    EXPECT_EQ(widened_y.values<float>("Y"), reference.values<float>("Y"));
  }
  const SafetensorsFile bf16_in = file(attn::bfloat16());
  // --dtype f32 on BF16 inputs: the float run, F32 outputs.
  attn_run::OnnxOptions f32;
  f32.input_type = attn::io::DType::kF32;
  EXPECT_EQ(run_on(bf16_in, f32).values<float>("Y"),
            run_on(widened(bf16_in), {}).values<float>("Y"));
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

#include "support/bodies_end.hpp"
