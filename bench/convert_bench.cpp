// SPDX-License-Identifier: MIT
// bench/convert_bench.cpp: attn::convert between float and the 16- and 8-bit storage types on
// contiguous rows, against memcpy of the same source bytes in the same binary.
//
// Args: N, elements (16Mi: a 64 MiB float array; 256Ki: in cache). Counter Bytes = bytes read
// + written per second (memcpy: 2 x its size). One thread: attn::convert does not start any.
// Run: build/bench/bench/convert_bench --benchmark_repetitions=5
// --benchmark_report_aggregates_only=true   (ATTN_ISA=avx2 etc. for a narrower set)

#include <benchmark/benchmark.h>

#include <cstring>

#include "attn/attn.hpp"
#include "bench_support.hpp"

namespace {

using attn::Index;

void set_bytes(benchmark::State& state, double bytes) {
  state.counters["Bytes"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::kIs1024);
}

template <class From, class To>
void BM_Convert(benchmark::State& state) {
  const Index n = state.range(0);
  const auto x = attn::bench::random_tensor<float, 1>({n}, /*seed=*/3);
  const auto src = attn::convert<From>(x);
  attn::Tensor<To, 1> dst({n});  // touched once here, not in the timed loop
  for (auto _ : state) {
    attn::convert(src.view(), dst.view());
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_bytes(state, static_cast<double>(n) * static_cast<double>(sizeof(From) + sizeof(To)));
}

/// memcpy of n elements of T: the copy a conversion is measured against.
template <class T>
void BM_Memcpy(benchmark::State& state) {
  const Index n = state.range(0);
  attn::Tensor<T, 1> src({n}), dst({n});
  for (auto _ : state) {
    std::memcpy(static_cast<void*>(dst.data()), src.data(),
                static_cast<std::size_t>(n) * sizeof(T));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_bytes(state, 2.0 * static_cast<double>(n) * static_cast<double>(sizeof(T)));
}

void Sizes(benchmark::internal::Benchmark* bm) {
  bm->ArgNames({"N"});
  bm->Arg(Index{1} << 24);  // 64 MiB of floats: memory bound
  bm->Arg(Index{1} << 18);  // 1 MiB of floats: in L2
  bm->Unit(benchmark::kMicrosecond);
}

BENCHMARK_TEMPLATE(BM_Memcpy, float)->Apply(Sizes);
BENCHMARK_TEMPLATE(BM_Convert, float, attn::bfloat16)->Apply(Sizes);
BENCHMARK_TEMPLATE(BM_Convert, attn::bfloat16, float)->Apply(Sizes);
BENCHMARK_TEMPLATE(BM_Convert, float, attn::float16)->Apply(Sizes);
BENCHMARK_TEMPLATE(BM_Convert, attn::float16, float)->Apply(Sizes);
BENCHMARK_TEMPLATE(BM_Convert, float, attn::float8_e4m3)->Apply(Sizes);
BENCHMARK_TEMPLATE(BM_Convert, attn::float8_e4m3, float)->Apply(Sizes);

}  // namespace

#include "gbench_main.hpp"
