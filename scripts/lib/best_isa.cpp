// SPDX-License-Identifier: MIT
// scripts/lib/best_isa.cpp: prints attn::best_isa(), the widest kernel set this CPU and OS
// run. scripts/run_tests.sh compiles it (one header, about a second) to configure its build
// trees before either is built; the release tree's dispatch_test --report must agree.
#include <cstdio>

#include "attn/isa.hpp"

int main() {
  std::puts(attn::isa_name(attn::best_isa()));
  return 0;
}
