// SPDX-License-Identifier: MIT
// bench/softmax_bench.cpp: attn::softmax_ alone (rows of attention scores) against the
// llm.c-style loop, in one binary.
//
// Args: Rows (query rows, e.g. one 64-row query tile of a head), N (keys per row).
// Counters: Elems = elements normalised per second, Bytes = bytes read + written per
// second (one read and one write of every element; in place). Softmax is exp-bound, not
// FMA-bound, so it has no FLOPS counter.
//
// Run:
//   build/bench/bench/softmax_bench --benchmark_repetitions=5
//   --benchmark_report_aggregates_only=true

#include <benchmark/benchmark.h>

#include <cmath>
#include <limits>

#include "attn/attn.hpp"
#include "bench_support.hpp"

namespace {

using attn::Index;

void set_counters(benchmark::State& state, Index rows, Index n, std::size_t scalar_bytes) {
  const double elems = static_cast<double>(rows) * static_cast<double>(n);
  state.counters["Elems"] =
      benchmark::Counter(elems, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["Bytes"] = benchmark::Counter(2.0 * elems * static_cast<double>(scalar_bytes),
                                               benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::kIs1024);
}

// attn::softmax_ over the last (contiguous) axis, in place. The input is scores drawn in
// [-8, 8); later iterations normalise probabilities, which costs the same.
template <class Scalar>
void BM_Softmax(benchmark::State& state) {
  const Index rows = state.range(0), n = state.range(1);
  auto x = attn::bench::random_tensor<Scalar, 2>({rows, n}, /*seed=*/3);
  for (Index i = 0; i < x.size(); ++i) x.data()[i] *= Scalar(8);
  for (auto _ : state) {
    attn::softmax_(x.view());
    benchmark::DoNotOptimize(x.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, rows, n, sizeof(Scalar));
}

// attn::softmax_ over axis 0 of an (N, Rows) tensor: the same rows, strided by Rows.
template <class Scalar>
void BM_Softmax_Strided(benchmark::State& state) {
  const Index rows = state.range(0), n = state.range(1);
  auto x = attn::bench::random_tensor<Scalar, 2>({n, rows}, /*seed=*/3);
  for (Index i = 0; i < x.size(); ++i) x.data()[i] *= Scalar(8);
  for (auto _ : state) {
    attn::softmax_(x.view(), /*axis=*/0);
    benchmark::DoNotOptimize(x.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, rows, n, sizeof(Scalar));
}

// llm.c's softmax_forward loop: max, exp and sum, scale.
template <class Scalar>
void naive_softmax(Scalar* x, Index rows, Index n) {
  for (Index r = 0; r < rows; ++r) {
    Scalar* row = x + r * n;
    Scalar maxval = -std::numeric_limits<Scalar>::infinity();
    for (Index j = 0; j < n; ++j) maxval = row[j] > maxval ? row[j] : maxval;
    Scalar sum = 0;
    for (Index j = 0; j < n; ++j) {
      row[j] = std::exp(row[j] - maxval);
      sum += row[j];
    }
    const Scalar norm = Scalar(1) / sum;
    for (Index j = 0; j < n; ++j) row[j] *= norm;
  }
}

template <class Scalar>
void BM_NaiveSoftmax(benchmark::State& state) {
  const Index rows = state.range(0), n = state.range(1);
  auto x = attn::bench::random_tensor<Scalar, 2>({rows, n}, /*seed=*/3);
  for (Index i = 0; i < x.size(); ++i) x.data()[i] *= Scalar(8);
  for (auto _ : state) {
    naive_softmax(x.data(), rows, n);
    benchmark::DoNotOptimize(x.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, rows, n, sizeof(Scalar));
}

// One 64-row query tile against the benchmarks' key lengths, and a whole (H * T) score matrix
// of B1 T512 H8.
void SoftmaxShapes(benchmark::internal::Benchmark* bm) {
  bm->ArgNames({"Rows", "N"});
  for (const int n : {128, 512, 2048, 8192}) bm->Args({64, n});
  bm->Args({8 * 512, 512});
}

BENCHMARK_TEMPLATE(BM_Softmax, float)->Apply(SoftmaxShapes)->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_Softmax_Strided, float)->Apply(SoftmaxShapes)->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_NaiveSoftmax, float)->Apply(SoftmaxShapes)->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_Softmax, double)->Apply(SoftmaxShapes)->Unit(benchmark::kMicrosecond);

}  // namespace

#include "gbench_main.hpp"  // main(): prints the kernel set in use
