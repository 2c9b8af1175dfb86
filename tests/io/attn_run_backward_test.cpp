// SPDX-License-Identifier: MIT
// tests/io/attn_run_backward_test.cpp: `attn_run --backward` (attn_run's core with
// RunOptions::backward) reproduces PyTorch 1.13 autograd on the committed fixtures
// (tests/fixtures/io/backward/, written by scripts/parity_vs_pytorch.py): the output and every
// gradient (grad_query, grad_key, grad_value, grad.<parameter>) to 1e-5 relative in float and
// 1e-10 in double, without Python.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/io/io.hpp"
#include "attn_run/run.hpp"
#include "io/fixture_support.hpp"

namespace attn_run_backward_test {

namespace {

using attn::io::SafetensorsFile;

const std::string kDir = std::string(ATTN_IO_FIXTURES_DIR) + "/backward";

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
      double scale = 0, err = 0;
      for (std::size_t i = 0; i < e.size(); ++i) {
        scale = std::max(scale, std::abs(e[i]));
        err = std::max(err, std::abs(a[i] - e[i]));
        ASSERT_TRUE(std::isfinite(a[i]));
      }
      EXPECT_LE(err / std::max(scale, 1e-30), tol) << expected.metadata().at("case");
    }
  }
}

}  // namespace

}  // namespace attn_run_backward_test
