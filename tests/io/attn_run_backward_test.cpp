// SPDX-License-Identifier: MIT
// tests/io/attn_run_backward_test.cpp: `attn_run --backward` (attn_run's core with
// RunOptions::backward) reproduces PyTorch 1.13 autograd on the committed fixtures
// (tests/fixtures/io/backward/, written by scripts/parity_vs_pytorch.py): the output and every
// gradient (grad_query, grad_key, grad_value, grad.<parameter>) to 1e-5 relative in float and
// 1e-10 in double, without Python.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/io/io.hpp"
#include "attn_run/run.hpp"
#include "io/fixture_support.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace attn_run_backward_test {

namespace {

using attn::io::SafetensorsFile;

const std::string kDir = std::string(ATTN_IO_FIXTURES_DIR) + "/backward";

// max |a - x| over max |x| (x the reference; at least 1e-30 below).
double largest_relative_error(const std::vector<double>& a, const std::vector<double>& x) {
  double scale = 0, err = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    scale = std::max(scale, std::abs(x[i]));
    err = std::max(err, std::abs(a[i] - x[i]));
  }
  return err / std::max(scale, 1e-30);
}

TEST(AttnRunBackwardFixtures, EveryGradientMatchesPyTorchAutograd) {
  const std::vector<std::string> cases = attn::test::fixture_cases(kDir);
  ASSERT_GE(cases.size(), 8u) << "fixtures missing in " << kDir;
  for (const std::string& name : cases) {
    SCOPED_TRACE(name);
    const auto [weights, input, expected] = attn::test::Fixture(kDir, name);
    const auto [options, use_double] = attn::test::fixture_run(expected.metadata());
    ASSERT_TRUE(options.backward);
    const auto bytes =
        use_double ? attn_run::run_multi_head_attention<double>(weights, input, options).to_bytes()
                   : attn_run::run_multi_head_attention<float>(weights, input, options).to_bytes();
    const auto got = SafetensorsFile::from_bytes(bytes, "attn_run");
    const double tol = use_double ? 1e-10 : 1e-5;
    for (const std::string& tensor : expected.names()) {
      SCOPED_TRACE(tensor);
      ASSERT_TRUE(got.contains(tensor));
      const auto a = got.values<double>(tensor), e = expected.values<double>(tensor);
      ASSERT_EQ(a.size(), e.size());
      for (const double v : a) ASSERT_TRUE(std::isfinite(v));
      EXPECT_LE(largest_relative_error(a, e), tol) << expected.metadata().at("case");
    }
  }
}

// `attn_run --dtype bf16 --backward` against PyTorch 1.13's bfloat16 nn.MultiheadAttention
// (tests/fixtures/io/bf16_backward/, scripts/bf16_training_reference.py: self and cross with
// kdim/vdim, key padding, a boolean and a causal mask; train mode, PyTorch's regular path) and
// against `reference.<name>`, float64 autograd on the same BF16 weights, inputs and
// grad_output. Errors are max |a - b| / max |reference| per tensor.
//
// PyTorch rounds every operation's result to bfloat16 (the projections, the scores, the
// probabilities, P V, every gradient of the chain: dY W_o, dP, dS, dQ, dK, dV...); attn keeps
// the attention's forward and backward and dC in float and rounds what the bfloat16 backward
// names in docs/precision.md. Measured on every kernel set (the bfloat16 paths change a few
// bits, not these maxima): PyTorch against the float64 value <= 6.8e-3 (the script prints it),
// attn <= 5.2e-3, attn against PyTorch <= 6.8e-3 (the two errors partly add). The bounds:
// attn - reference <= 1.2e-2 (6u, u = 2^-9: 2.3 times the measured worst), attn - torch <=
// 2e-2 (1.7 times the two measured errors summed). A lost bias gradient is off by the whole
// tensor (1).
TEST(AttnRunBackwardFixtures, Bf16GradientsMatchPyTorchsBf16Module) {
  const std::string dir = std::string(ATTN_IO_FIXTURES_DIR) + "/bf16_backward";
  const std::vector<std::string> cases = attn::test::fixture_cases(dir);
  ASSERT_EQ(cases.size(), 4u) << "fixtures missing in " << dir;
  double worst_torch = 0, worst_reference = 0;
  for (const std::string& name : cases) {
    const auto [weights, input, expected] = attn::test::Fixture(dir, name);
    SCOPED_TRACE(name + ": " + expected.metadata().at("case"));
    const auto [options, use_double] = attn::test::fixture_run(expected.metadata());
    ASSERT_TRUE(options.backward);
    const auto got = SafetensorsFile::from_bytes(
        attn_run::run_multi_head_attention<attn::bfloat16>(weights, input, options).to_bytes(),
        "attn_run");
    for (const std::string& tensor : expected.names()) {
      if (tensor.rfind("reference.", 0) == 0) continue;
      SCOPED_TRACE(tensor);
      ASSERT_TRUE(got.contains(tensor));
      ASSERT_EQ(got.dtype(tensor), attn::io::DType::kBF16);
      const auto a = got.values<double>(tensor), torch = expected.values<double>(tensor),
                 reference = expected.values<double>("reference." + tensor);
      ASSERT_EQ(a.size(), torch.size());
      ASSERT_EQ(a.size(), reference.size());
      double scale = 0, to_torch = 0, to_reference = 0;
      for (std::size_t i = 0; i < a.size(); ++i) {
        scale = std::max(scale, std::abs(reference[i]));
        to_torch = std::max(to_torch, std::abs(a[i] - torch[i]));
        to_reference = std::max(to_reference, std::abs(a[i] - reference[i]));
      }
      EXPECT_LE(to_torch / scale, 2e-2);
      EXPECT_LE(to_reference / scale, 1.2e-2);
      worst_torch = std::max(worst_torch, to_torch / scale);
      worst_reference = std::max(worst_reference, to_reference / scale);
    }
  }
  std::cout << "[ bf16 backward ] attn - torch " << worst_torch << ", attn - reference "
            << worst_reference << " (relative to max |reference| per tensor)\n";
}

// The same fixtures' tensors with every floating one but the masks rounded to F16:
// `attn_run --dtype fp16 --backward` (its gradients written as F16) against attn_run in double
// on the same F16 values, whose backward matches PyTorch autograd to 1e-10 above. PyTorch 1.13
// has no float16 matmul on the CPU to compare with. float16 (u = 2^-11) rounds what bfloat16
// rounds but keeps the attention's P and dS in float; the module tests measure it within 2.6 u'
// (u' = 2^-12, tests/attention/bf16_attention_test.cpp). Measured here: at most 7.8e-4; the bound,
// 2e-3, is the module tests' 8u'. A lost bias gradient is off by the whole tensor (1).
TEST(AttnRunBackwardFixtures, Fp16GradientsMatchTheDoubleRun) {
  const std::string dir = std::string(ATTN_IO_FIXTURES_DIR) + "/bf16_backward";
  const std::vector<std::string> cases = attn::test::fixture_cases(dir);
  ASSERT_EQ(cases.size(), 4u) << "fixtures missing in " << dir;
  // A copy of `file` with its floating tensors but masks rounded to F16 (to nearest even, once).
  const auto to_f16 = [](const SafetensorsFile& file) {
    attn::io::SafetensorsWriter w;
    for (const std::string& name : file.names()) {
      const attn::io::DType dtype = file.dtype(name);
      std::vector<unsigned char> bytes;
      if (dtype == attn::io::DType::kBool || name.find("mask") != std::string::npos) {
        const attn::io::TensorInfo& info = file.info(name);
        bytes.assign(file.raw_data(name), file.raw_data(name) + (info.end - info.begin));
        w.add_raw(name, dtype, file.shape(name), bytes);
        continue;
      }
      const std::vector<attn::float16> v = file.values<attn::float16>(name);
      bytes.resize(v.size() * 2);
      for (std::size_t i = 0; i < v.size(); ++i) {
        bytes[2 * i] = static_cast<unsigned char>(v[i].bits() & 0xFF);
        bytes[2 * i + 1] = static_cast<unsigned char>(v[i].bits() >> 8);
      }
      w.add_raw(name, attn::io::DType::kF16, file.shape(name), bytes);
    }
    return SafetensorsFile::from_bytes(w.to_bytes(), "f16 copy");
  };
  double worst = 0;
  for (const std::string& name : cases) {
    const auto [bf16_weights, bf16_input, expected] = attn::test::Fixture(dir, name);
    SCOPED_TRACE(name + ": " + expected.metadata().at("case"));
    const SafetensorsFile weights = to_f16(bf16_weights), input = to_f16(bf16_input);
    const auto [options, use_double] = attn::test::fixture_run(expected.metadata());
    ASSERT_TRUE(options.backward);
    const auto got = SafetensorsFile::from_bytes(
        attn_run::run_multi_head_attention<attn::float16>(weights, input, options).to_bytes(),
        "attn_run fp16");
    const auto want = SafetensorsFile::from_bytes(
        attn_run::run_multi_head_attention<double>(weights, input, options).to_bytes(),
        "attn_run f64");
    ASSERT_EQ(got.names(), want.names());
    for (const std::string& tensor : want.names()) {
      SCOPED_TRACE(tensor);
      ASSERT_EQ(got.dtype(tensor), attn::io::DType::kF16);
      const auto a = got.values<double>(tensor), x = want.values<double>(tensor);
      ASSERT_EQ(a.size(), x.size());
      const double error = largest_relative_error(a, x);
      EXPECT_LE(error, 2e-3);
      worst = std::max(worst, error);
    }
  }
  std::cout << "[ fp16 backward ] attn fp16 - attn f64 " << worst
            << " (relative to max |f64| per tensor)\n";
}

}  // namespace

}  // namespace attn_run_backward_test

#include "support/bodies_end.hpp"
