// SPDX-License-Identifier: MIT
// bench/bf16_attention_bench.cpp: attn::scaled_dot_product_attention (streaming path) on
// bfloat16 q, k, v and out, on each path attn::Bf16Path names (0 widening, 1 vdpbf16ps, 2 AMX;
// skipped where the CPU or the operating system lacks it), against the float call on the same
// values, in one binary. FLOPS counts 4 B H T_q T_k d (Q K^T and P V), halved for causal.
// Glossary: B = batch, H = heads, T = tokens (T_q = T_k), d = head dim.
//
// Times and FLOPS are CPU time (one thread; the machine may be shared); the peaks to divide
// by come from fma_peak --threads 1. Run:
//   OMP_NUM_THREADS=1 build/bench/bench/bf16_attention_bench --benchmark_repetitions=3
//   --benchmark_report_aggregates_only=true

#include <benchmark/benchmark.h>

#include <cstdint>
#include <optional>

#include "attn/attn.hpp"

namespace {

using attn::Index;

struct Inputs {
  attn::Tensor<float, 4> q, k, v, out;
  attn::Tensor<attn::bfloat16, 4> qb, kb, vb, outb;
  attn::AttentionMask<float> mask;
  explicit Inputs(const benchmark::State& state)
      : q(random({state.range(0), state.range(1), state.range(2), state.range(3)}, 1)),
        k(random(q.shape(), 2)),
        v(random(q.shape(), 3)),
        out(q.shape()),
        qb(attn::convert<attn::bfloat16>(q)),
        kb(attn::convert<attn::bfloat16>(k)),
        vb(attn::convert<attn::bfloat16>(v)),
        outb(q.shape()) {
    if (state.range(4) != 0) mask.causal();
    // The float call reads the same values as the bfloat16 ones.
    q = attn::convert<float>(qb), k = attn::convert<float>(kb), v = attn::convert<float>(vb);
  }
  static attn::Tensor<float, 4> random(const attn::Shape<4>& shape, std::uint64_t seed) {
    attn::Tensor<float, 4> t(shape);
    std::uint64_t x = seed * 0x9E3779B97F4A7C15ull;
    for (Index i = 0; i < t.size(); ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      t.data()[i] = static_cast<float>(x >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
    }
    return t;
  }
};

void set_counters(benchmark::State& state) {
  const double t = static_cast<double>(state.range(2));
  const double flops = 4.0 * static_cast<double>(state.range(0) * state.range(1)) * t * t *
                       static_cast<double>(state.range(3)) * (state.range(4) != 0 ? 0.5 : 1.0);
  state.counters["FLOPS"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = attn::num_threads();
}

void BM_SdpaFloat(benchmark::State& state) {
  Inputs in(state);
  attn::Workspace ws;
  for (auto _ : state) {
    attn::scaled_dot_product_attention<float>(in.q.view(), in.k.view(), in.v.view(), in.out.view(),
                                              ws, in.mask);
    benchmark::DoNotOptimize(in.out.data());
    benchmark::ClobberMemory();
  }
  set_counters(state);
}

void BM_SdpaBf16(benchmark::State& state) {
  const auto path = static_cast<attn::Bf16Path>(state.range(5));
  if (attn::set_bf16_path(path) != path) {
    state.SkipWithError("this path does not run here");
    attn::set_bf16_path(std::nullopt);
    return;
  }
  Inputs in(state);
  attn::Workspace ws;
  for (auto _ : state) {
    attn::scaled_dot_product_attention<attn::bfloat16>(in.qb.view(), in.kb.view(), in.vb.view(),
                                                       in.outb.view(), ws, in.mask);
    benchmark::DoNotOptimize(in.outb.data());
    benchmark::ClobberMemory();
  }
  set_counters(state);
  attn::set_bf16_path(std::nullopt);
}

// (B, H, T, d, causal): T 512 .. 4096, d 64 and 128, B 1-8, H 8-16; sized so that one run of
// every row stays within a few minutes on one core.
void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"B", "H", "T", "d", "causal"});
  for (const int causal : {0, 1}) {
    b->Args({8, 8, 512, 64, causal});
    b->Args({1, 16, 1024, 128, causal});
    b->Args({1, 8, 2048, 64, causal});
    b->Args({1, 8, 4096, 128, causal});
  }
}

void PathShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"B", "H", "T", "d", "causal", "path"});
  for (const int causal : {0, 1}) {
    for (const int path : {0, 1, 2}) {
      b->Args({8, 8, 512, 64, causal, path});
      b->Args({1, 16, 1024, 128, causal, path});
      b->Args({1, 8, 2048, 64, causal, path});
      b->Args({1, 8, 4096, 128, causal, path});
    }
  }
}

}  // namespace

BENCHMARK(BM_SdpaFloat)->Apply(Shapes)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SdpaBf16)->Apply(PathShapes)->Unit(benchmark::kMillisecond);

#include "gbench_main.hpp"  // main(): prints the kernel set in use
