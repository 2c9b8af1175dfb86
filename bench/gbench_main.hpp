// SPDX-License-Identifier: MIT
// bench/gbench_main.hpp: main() of the Google Benchmark binaries. Like BENCHMARK_MAIN(), plus
// the kernel set attn runs on (attn::active_isa(): ATTN_ISA forces a narrower one) and the
// default path of its bfloat16 GEMMs (attn::bf16_path(), with the reason AMX is not used where
// the CPU has it) in the context header every run prints, next to the CPU and cache sizes.
#pragma once

#include <benchmark/benchmark.h>

#include "attn/attn.hpp"

int main(int argc, char** argv) {
  benchmark::AddCustomContext("attn_isa", attn::isa_name(attn::active_isa()));
  benchmark::AddCustomContext("attn_threads", std::to_string(attn::num_threads()));
  benchmark::AddCustomContext("attn_bf16_path", attn::bf16_path_name(attn::bf16_path()));
  if (!attn::detail::amx_support().usable) {
    benchmark::AddCustomContext("attn_amx", attn::detail::amx_support().reason);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
