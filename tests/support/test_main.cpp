// SPDX-License-Identifier: MIT
// tests/support/test_main.cpp: main() of the test executables. Each runs many tests in one
// process (one per folder of tests/, see tests/CMakeLists.txt), so every test starts from
// the state a fresh process has: the kernel set chosen at start-up (ATTN_ISA or the widest)
// and its default bfloat16 path,
// the thread count, the global generator's default seed, and the floating-point environment
// (rounding mode, flush-to-zero). A test that forces a kernel set or a thread count and
// restores something else cannot change what the tests after it run on (in particular the
// narrower sets that the test command selects with ATTN_ISA).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cfenv>

#include "attn/attn.hpp"

namespace {

class FreshProcessState : public ::testing::EmptyTestEventListener {
 public:
  FreshProcessState() : isa_(attn::active_isa()), threads_(attn::num_threads()) {
    std::fegetenv(&fenv_);
  }

  void OnTestStart(const ::testing::TestInfo&) override { restore(); }
  void OnTestEnd(const ::testing::TestInfo&) override { restore(); }

 private:
  void restore() const {
    std::fesetenv(&fenv_);
    attn::set_isa(isa_);
    attn::set_bf16_path(std::nullopt);
    attn::set_num_threads(threads_);
    attn::with_global_generator([](attn::TorchGenerator& gen) { gen = attn::TorchGenerator(); });
  }

  attn::Isa isa_;
  int threads_;
  std::fenv_t fenv_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleMock(&argc, argv);
  // Read before any test runs: a bad ATTN_ISA is reported here, once, as a ConfigError.
  ::testing::UnitTest::GetInstance()->listeners().Append(new FreshProcessState);
  return RUN_ALL_TESTS();
}
