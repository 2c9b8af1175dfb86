// SPDX-License-Identifier: MIT
// tests/io/fixture_support.hpp: the committed safetensors fixture cases of a directory
// (tests/fixtures/io/ and its llama/ and backward/, written by scripts/parity_vs_pytorch.py),
// the three files of one case, and how a case's attn_run flags become RunOptions.
#pragma once

#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "attn/io/io.hpp"
#include "attn_run/run.hpp"

namespace attn::test {

/// The stems of `dir`'s `<stem>.expected.safetensors` files, sorted (not recursive).
inline std::vector<std::string> fixture_cases(const std::string& dir) {
  std::vector<std::string> cases;
  const std::string suffix = ".expected.safetensors";
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      cases.push_back(name.substr(0, name.size() - suffix.size()));
    }
  }
  std::sort(cases.begin(), cases.end());
  return cases;
}

/// One case's files: <dir>/<name>.weights, .input and .expected.safetensors.
struct Fixture {
  io::SafetensorsFile weights, input, expected;
  Fixture(const std::string& dir, const std::string& name)
      : weights(io::SafetensorsFile::open(dir + "/" + name + ".weights.safetensors")),
        input(io::SafetensorsFile::open(dir + "/" + name + ".input.safetensors")),
        expected(io::SafetensorsFile::open(dir + "/" + name + ".expected.safetensors")) {}
};

/// The RunOptions of a case's `expected` metadata (`num_heads`, and the attn_run `flags`
/// --causal, --need-weights, --backward), and whether it runs in double (--double).
struct FixtureRun {
  attn_run::RunOptions options;
  bool use_double = false;
};
inline FixtureRun fixture_run(const std::map<std::string, std::string>& metadata) {
  FixtureRun run;
  run.options.num_heads = std::stol(metadata.at("num_heads"));
  std::istringstream flags(metadata.at("flags"));
  for (std::string flag; flags >> flag;) {
    if (flag == "--causal") run.options.causal = true;
    if (flag == "--need-weights") run.options.need_weights = true;
    if (flag == "--backward") run.options.backward = true;
    if (flag == "--double") run.use_double = true;
  }
  return run;
}

}  // namespace attn::test
