// SPDX-License-Identifier: MIT
// bench/bf16_module_bench.cpp: MultiHeadAttention<bfloat16>::forward (bfloat16 weights and
// activations) on each path attn::Bf16Path names (0 widening, 1 vdpbf16ps, 2 AMX; skipped where
// the CPU or the operating system lacks it) and MultiHeadAttention<float16>::forward (always
// widened: path 0) against MultiHeadAttention<float>::forward on the same values, in one binary:
// causal self-attention, both modules frozen, in eval mode, with a warm workspace. FLOPS counts the
// four projections (8 B T E^2) and the attention (4 B T^2 E, halved for causal). Glossary: B =
// batch, T = tokens, E = embed dim (H = E / 64 heads of 64).
//
// Times are CPU time of one thread (the machine may be shared). Run:
//   OMP_NUM_THREADS=1 build/bench/bench/bf16_module_bench --benchmark_repetitions=3
//   --benchmark_report_aggregates_only=true

#include <benchmark/benchmark.h>

#include <cstdint>
#include <optional>

#include "attn/attn.hpp"

namespace {

using attn::Index;

attn::MultiHeadAttentionOptions options(const benchmark::State& state) {
  auto o = attn::MultiHeadAttentionOptions::pytorch(state.range(2), state.range(2) / 64);
  o.causal = true;
  return o;
}

attn::Tensor<float, 3> random(const attn::Shape<3>& shape) {
  attn::Tensor<float, 3> t(shape);
  std::uint64_t x = 0x9E3779B97F4A7C15ull;
  for (Index i = 0; i < t.size(); ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t.data()[i] = static_cast<float>(x >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
  }
  return t;
}

void set_counters(benchmark::State& state) {
  const double b = static_cast<double>(state.range(0)), t = static_cast<double>(state.range(1)),
               e = static_cast<double>(state.range(2));
  state.counters["FLOPS"] = benchmark::Counter(8.0 * b * t * e * e + 2.0 * b * t * t * e,
                                               benchmark::Counter::kIsIterationInvariantRate);
}

template <class Scalar>
void BM_Module(benchmark::State& state) {
  const auto path = static_cast<attn::Bf16Path>(state.range(3));
  if (attn::set_bf16_path(path) != path) {
    state.SkipWithError("this path does not run here");
    attn::set_bf16_path(std::nullopt);
    return;
  }
  attn::TorchGenerator gen(7);
  const attn::MultiHeadAttention<float> wide(options(state), gen);
  attn::MultiHeadAttention<Scalar> m = attn::convert<Scalar>(attn::convert<attn::bfloat16>(wide));
  m.eval();
  m.freeze();
  const auto x = attn::convert<Scalar>(random({state.range(0), state.range(1), state.range(2)}));
  attn::Tensor<Scalar, 3> out(x.shape());
  attn::Workspace ws;
  for (auto _ : state) {
    m.forward(x.view(), out.view(), ws);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  set_counters(state);
  attn::set_bf16_path(std::nullopt);
}

// (B, T, E, path): B 1-8, T 512-2048, E 512-1024; sized so that one run of every row stays
// within a minute on one core. The float and float16 modules take path 0 only (they have no
// other).
void Shapes(benchmark::internal::Benchmark* b, bool paths) {
  b->ArgNames({"B", "T", "E", "path"});
  for (const int path : {0, 1, 2}) {
    if (path > 0 && !paths) break;
    b->Args({8, 512, 512, path});
    b->Args({4, 1024, 1024, path});
    b->Args({1, 2048, 1024, path});
  }
}

}  // namespace

BENCHMARK_TEMPLATE(BM_Module, float)
    ->Apply([](benchmark::internal::Benchmark* b) { Shapes(b, false); })
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_Module, attn::bfloat16)
    ->Apply([](benchmark::internal::Benchmark* b) { Shapes(b, true); })
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_Module, attn::float16)
    ->Apply([](benchmark::internal::Benchmark* b) { Shapes(b, false); })
    ->Unit(benchmark::kMillisecond);

#include "gbench_main.hpp"  // main(): prints the kernel set in use
