// SPDX-License-Identifier: MIT
// fuzz/main.cpp: libFuzzer's entry points for attn_fuzz, the program holding every fuzz
// target. It runs the target named by the file it is started as (argv[0]'s last component,
// a symlink beside it such as safetensors_fuzz), so each target keeps its own command,
// corpus and crash files.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "targets.hpp"

namespace {

using Entry = int (*)(const std::uint8_t*, std::size_t);

struct Target {
  std::string_view name;
  Entry entry;
};

constexpr Target kTargets[] = {
    {"attn_run_fuzz", attn_run_fuzz::test_one_input},
    {"safetensors_fuzz", safetensors_fuzz::test_one_input},
    {"training_fuzz", training_fuzz::test_one_input},
    {"mask_api_fuzz", mask_api_fuzz::test_one_input},
    {"kv_cache_fuzz", kv_cache_fuzz::test_one_input},
};

Entry chosen = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  std::string_view self = *argc > 0 ? (*argv)[0] : "";
  if (const auto slash = self.rfind('/'); slash != std::string_view::npos) {
    self.remove_prefix(slash + 1);
  }
  for (const Target& target : kTargets) {
    if (self == target.name) {
      chosen = target.entry;
      return 0;
    }
  }
  std::fprintf(stderr,
               "attn_fuzz: started as '%.*s'; run it through one of the symlinks beside it:",
               static_cast<int>(self.size()), self.data());
  for (const Target& target : kTargets) {
    std::fprintf(stderr, " %.*s", static_cast<int>(target.name.size()), target.name.data());
  }
  std::fprintf(stderr, "\n");
  std::exit(2);
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return chosen(data, size);
}
