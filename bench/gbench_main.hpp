// SPDX-License-Identifier: MIT
// bench/gbench_main.hpp: main() of the Google Benchmark binaries. Like BENCHMARK_MAIN(), plus
// the kernel set attn runs on (attn::active_isa(): ATTN_ISA forces a narrower one) in the
// context header every run prints, next to the CPU and cache sizes.
#pragma once

#include <benchmark/benchmark.h>

#include "attn/attn.hpp"

int main(int argc, char** argv) {
  benchmark::AddCustomContext("attn_isa", attn::isa_name(attn::active_isa()));
  benchmark::AddCustomContext("attn_threads", std::to_string(attn::num_threads()));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
