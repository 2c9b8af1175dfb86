// SPDX-License-Identifier: MIT
// bench/tensor_view_bench.cpp: what views cost. attn::copy of a head-split (strided) view
// into contiguous (B, H, T, hd) storage, and element access through TensorView::operator(),
// each against the raw-pointer loop in the same binary.
// Glossary: B = batch, T = tokens, D = embedding width, H = heads, hd = D / H.
//
// Args: B, T, D, H. Counter Bytes = bytes read + written per second (copy) or read per
// second (access).
// Run: build/bench/bench/tensor_view_bench --benchmark_repetitions=5
// --benchmark_report_aggregates_only=true

#include <benchmark/benchmark.h>

#include "attn/attn.hpp"
#include "bench_support.hpp"

namespace {

using attn::Index;

void set_bytes(benchmark::State& state, double bytes) {
  state.counters["Bytes"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::kIs1024);
}

// attn::copy(split_heads(x), out): (B, T, D) -> contiguous (B, H, T, hd).
template <class Scalar>
void BM_SplitHeadsCopy(benchmark::State& state) {
  const Index b = state.range(0), t = state.range(1), d = state.range(2), h = state.range(3);
  const auto x = attn::bench::random_tensor<Scalar, 3>({b, t, d}, /*seed=*/5);
  attn::Tensor<Scalar, 4> out({b, h, t, d / h});
  for (auto _ : state) {
    attn::copy(attn::split_heads(x.view(), h), out.view());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  set_bytes(state, 2.0 * static_cast<double>(x.size() * sizeof(Scalar)));
}

// The same permutation as four raw loops.
template <class Scalar>
void BM_NaiveSplitHeadsCopy(benchmark::State& state) {
  const Index b = state.range(0), t = state.range(1), d = state.range(2), h = state.range(3);
  const Index hd = d / h;
  const auto x = attn::bench::random_tensor<Scalar, 3>({b, t, d}, /*seed=*/5);
  attn::Tensor<Scalar, 4> out({b, h, t, hd});
  for (auto _ : state) {
    const Scalar* in = x.data();
    Scalar* o = out.data();
    for (Index bi = 0; bi < b; ++bi) {
      for (Index hi = 0; hi < h; ++hi) {
        for (Index ti = 0; ti < t; ++ti) {
          const Scalar* src = in + (bi * t + ti) * d + hi * hd;
          Scalar* dst = o + ((bi * h + hi) * t + ti) * hd;
          for (Index e = 0; e < hd; ++e) dst[e] = src[e];
        }
      }
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  set_bytes(state, 2.0 * static_cast<double>(x.size() * sizeof(Scalar)));
}

// Sum of a head-split view through view(b, h, t, e): the unchecked accessor's cost.
template <class Scalar>
void BM_ViewElementAccess(benchmark::State& state) {
  const Index b = state.range(0), t = state.range(1), d = state.range(2), h = state.range(3);
  const auto x = attn::bench::random_tensor<Scalar, 3>({b, t, d}, /*seed=*/5);
  const auto v = attn::split_heads(x.view(), h);
  const Index hd = d / h;
  for (auto _ : state) {
    Scalar sum = 0;
    for (Index bi = 0; bi < b; ++bi) {
      for (Index hi = 0; hi < h; ++hi) {
        for (Index ti = 0; ti < t; ++ti) {
          for (Index e = 0; e < hd; ++e) sum += v(bi, hi, ti, e);
        }
      }
    }
    benchmark::DoNotOptimize(sum);
  }
  set_bytes(state, static_cast<double>(x.size() * sizeof(Scalar)));
}

// The same sum with pointer arithmetic.
template <class Scalar>
void BM_RawElementAccess(benchmark::State& state) {
  const Index b = state.range(0), t = state.range(1), d = state.range(2), h = state.range(3);
  const auto x = attn::bench::random_tensor<Scalar, 3>({b, t, d}, /*seed=*/5);
  const Index hd = d / h;
  for (auto _ : state) {
    Scalar sum = 0;
    const Scalar* in = x.data();
    for (Index bi = 0; bi < b; ++bi) {
      for (Index hi = 0; hi < h; ++hi) {
        for (Index ti = 0; ti < t; ++ti) {
          const Scalar* row = in + (bi * t + ti) * d + hi * hd;
          for (Index e = 0; e < hd; ++e) sum += row[e];
        }
      }
    }
    benchmark::DoNotOptimize(sum);
  }
  set_bytes(state, static_cast<double>(x.size() * sizeof(Scalar)));
}

void ViewShapes(benchmark::internal::Benchmark* bm) {
  bm->ArgNames({"B", "T", "D", "H"});
  bm->Args({1, 128, 512, 8});
  bm->Args({8, 512, 512, 8});
  bm->Args({1, 2048, 768, 12});
}

BENCHMARK_TEMPLATE(BM_SplitHeadsCopy, float)->Apply(ViewShapes)->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_NaiveSplitHeadsCopy, float)->Apply(ViewShapes)->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_ViewElementAccess, float)->Apply(ViewShapes)->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_RawElementAccess, float)->Apply(ViewShapes)->Unit(benchmark::kMicrosecond);

}  // namespace

#include "gbench_main.hpp"  // main(): prints the kernel set in use
