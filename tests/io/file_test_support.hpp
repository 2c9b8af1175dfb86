// SPDX-License-Identifier: MIT
// tests/io/file_test_support.hpp: a temporary directory, file contents, and running a test
// body in a forked child (for process limits, dropped privileges and calls that may hang).
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

namespace attn::test {

// A fresh directory, removed with its contents at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = ::testing::TempDir() + "attn_io_file_XXXXXX";
    path_ = ::mkdtemp(pattern.data());
    EXPECT_FALSE(path_.empty());
  }
  ~TempDir() {
    ::chmod(path_.c_str(), 0700);
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }
  // Every name in the directory other than `keep` (a temporary file left behind shows here).
  std::vector<std::string> others(const std::string& keep) const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path_)) {
      if (e.path().filename() != keep) out.push_back(e.path().filename().string());
    }
    return out;
  }

 private:
  std::string path_;
};

inline std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Runs `body` in a forked child killed after `seconds` (so a hang fails instead of blocking
// the suite); returns its exit status, or 128 + the signal that ended it.
inline int run_in_child(const std::function<int()>& body, unsigned seconds = 20) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(seconds);
    int code = 99;
    try {
      code = body();
    } catch (...) {
      code = 98;
    }
    std::_Exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace attn::test
