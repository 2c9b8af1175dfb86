// SPDX-License-Identifier: MIT
// tests/io/fixture_support.hpp: the committed safetensors fixture cases of a directory
// (tests/fixtures/io/ and its llama/, written by scripts/parity_vs_pytorch.py).
#pragma once

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

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

}  // namespace attn::test
