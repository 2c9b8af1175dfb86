// SPDX-License-Identifier: MIT
// bench/attention_bench.cpp: attn::MultiHeadAttention (nn.MultiheadAttention configuration,
// eval, frozen weights, warm Workspace; also unfrozen) against the naive loop reference, in
// one binary.
// Glossary: B = batch, T = tokens (T_q queries, T_k keys), D = embedding width, H = heads.
//
// Run (one thread / all threads; FLOPS is "useful FLOP/s", see bench_support.hpp):
//   OMP_NUM_THREADS=1 build/bench/bench/attention_bench --benchmark_repetitions=5
//   --benchmark_report_aggregates_only=true OMP_WAIT_POLICY=ACTIVE
//   build/bench/bench/attention_bench --benchmark_filter=Causal
// The naive reference (BM_NaiveAttention*) runs only on bench_support.hpp's
// reference_shapes(); compare it with the BM_MultiHeadAttention* row of the same shape.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "bench_support.hpp"
#include "reference/naive_attention.hpp"  // loop baseline, same maths, same binary

namespace {

using attn::Index;
using attn::bench::MhaShape;

void set_counters(benchmark::State& state, const MhaShape& s) {
  state.counters["FLOPS"] =
      benchmark::Counter(attn::bench::mha_flops(s.b, s.tq, s.tk, s.d, s.h, s.causal, s.cross),
                         benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = attn::num_threads();
}

MhaShape shape_of(const benchmark::State& state, bool causal, bool cross) {
  MhaShape s{};
  s.b = state.range(0);
  if (cross) {
    s.tq = state.range(1);
    s.tk = state.range(2);
    s.d = state.range(3);
    s.h = state.range(4);
  } else {
    s.tq = s.tk = state.range(1);
    s.d = state.range(2);
    s.h = state.range(3);
  }
  s.causal = causal;
  s.cross = cross;
  return s;
}

// ---- attn ----

template <class Scalar>
void run_mha(benchmark::State& state, bool causal, bool cross, bool frozen = true) {
  const MhaShape s = shape_of(state, causal, cross);
  const auto mha = attn::bench::make_mha<Scalar>(s.d, s.h, /*seed=*/1234, frozen);
  const auto xq = attn::bench::random_tensor<Scalar, 3>({s.b, s.tq, s.d}, /*seed=*/42);
  const auto xkv = cross ? attn::bench::random_tensor<Scalar, 3>({s.b, s.tk, s.d}, /*seed=*/43)
                         : attn::Tensor<Scalar, 3>();
  const auto kv = cross ? xkv.view() : xq.view();
  attn::Tensor<Scalar, 3> out({s.b, s.tq, s.d});
  const auto mask = attn::bench::make_mask<Scalar>(causal);
  attn::Workspace ws;
  mha.forward(xq.view(), kv, kv, out.view(), ws, mask);  // warm the workspace

  for (auto _ : state) {
    mha.forward(xq.view(), kv, kv, out.view(), ws, mask);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, s);
}

// Args: B, T, D, H.
template <class Scalar>
void BM_MultiHeadAttention(benchmark::State& state) {
  run_mha<Scalar>(state, /*causal=*/false, /*cross=*/false);
}
// Not frozen: the projection weights are repacked on every call.
template <class Scalar>
void BM_MultiHeadAttention_Unfrozen(benchmark::State& state) {
  run_mha<Scalar>(state, /*causal=*/false, /*cross=*/false, /*frozen=*/false);
}
template <class Scalar>
void BM_MultiHeadAttention_Causal(benchmark::State& state) {
  run_mha<Scalar>(state, /*causal=*/true, /*cross=*/false);
}
// Args: B, Tq, Tk, D, H.
template <class Scalar>
void BM_MultiHeadAttention_Cross(benchmark::State& state) {
  run_mha<Scalar>(state, /*causal=*/false, /*cross=*/true);
}

// ---- naive reference ----

template <class Scalar>
void run_naive(benchmark::State& state, bool causal, bool cross) {
  const MhaShape s = shape_of(state, causal, cross);
  const auto mha = attn::bench::make_mha<Scalar>(s.d, s.h);
  attn::bench::reference::NaiveMultiHeadAttention<Scalar> naive(mha);
  const auto xq = attn::bench::random_tensor<Scalar, 3>({s.b, s.tq, s.d}, /*seed=*/42);
  const auto xkv = cross ? attn::bench::random_tensor<Scalar, 3>({s.b, s.tk, s.d}, /*seed=*/43)
                         : attn::Tensor<Scalar, 3>();
  attn::Tensor<Scalar, 3> out({s.b, s.tq, s.d});
  const auto call = [&] {
    if (cross) {
      naive.forward(xq.data(), xkv.data(), out.data(), s.b, s.tq, s.tk, causal);
    } else {
      naive.forward(xq.data(), out.data(), s.b, s.tq, causal);
    }
  };

  // The reference must agree with attn before its time means anything.
  call();
  attn::Tensor<Scalar, 3> expected({s.b, s.tq, s.d});
  attn::Workspace ws;
  const auto kv = cross ? xkv.view() : xq.view();
  mha.forward(xq.view(), kv, kv, expected.view(), ws, attn::bench::make_mask<Scalar>(causal));
  double max_err = 0;
  for (Index i = 0; i < out.size(); ++i) {
    max_err = std::max(max_err, std::abs(static_cast<double>(out.data()[i] - expected.data()[i])));
  }
  if (!(max_err < 1e-3)) {
    state.SkipWithError(("naive reference and attn differ by " + std::to_string(max_err)).c_str());
    return;
  }

  for (auto _ : state) {
    call();
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, s);
  state.counters["max_err"] = max_err;
}

template <class Scalar>
void BM_NaiveAttention(benchmark::State& state) {
  run_naive<Scalar>(state, /*causal=*/false, /*cross=*/false);
}
template <class Scalar>
void BM_NaiveAttention_Causal(benchmark::State& state) {
  run_naive<Scalar>(state, /*causal=*/true, /*cross=*/false);
}
template <class Scalar>
void BM_NaiveAttention_Cross(benchmark::State& state) {
  run_naive<Scalar>(state, /*causal=*/false, /*cross=*/true);
}

// ---- shape lists: the benchmark shapes plus the reference shapes (attn runs both) ----

void add_shapes(benchmark::internal::Benchmark* bm, bool causal, bool cross, bool benchmark,
                bool reference) {
  if (cross) {
    bm->ArgNames({"B", "Tq", "Tk", "D", "H"});
  } else {
    bm->ArgNames({"B", "T", "D", "H"});
  }
  std::vector<std::vector<std::int64_t>> added;
  const auto add = [&](const std::vector<MhaShape>& shapes) {
    for (const MhaShape& s : shapes) {
      if (s.causal != causal || s.cross != cross) continue;
      std::vector<std::int64_t> args = cross ? std::vector<std::int64_t>{s.b, s.tq, s.tk, s.d, s.h}
                                             : std::vector<std::int64_t>{s.b, s.tq, s.d, s.h};
      if (std::find(added.begin(), added.end(), args) != added.end()) continue;
      added.push_back(args);
      bm->Args(args);
    }
  };
  if (reference) add(attn::bench::reference_shapes());
  if (benchmark) add(attn::bench::benchmark_shapes());
}

void SelfShapes(benchmark::internal::Benchmark* bm) { add_shapes(bm, false, false, true, true); }
void CausalShapes(benchmark::internal::Benchmark* bm) { add_shapes(bm, true, false, true, true); }
void CrossShapes(benchmark::internal::Benchmark* bm) { add_shapes(bm, false, true, true, true); }
void NaiveSelfShapes(benchmark::internal::Benchmark* bm) {
  add_shapes(bm, false, false, false, true);
}
void NaiveCausalShapes(benchmark::internal::Benchmark* bm) {
  add_shapes(bm, true, false, false, true);
}
void NaiveCrossShapes(benchmark::internal::Benchmark* bm) {
  add_shapes(bm, false, true, false, true);
}

// Real (wall) time: attn's OpenMP threads do the work, so the main thread's CPU time
// would overstate the rate.
BENCHMARK_TEMPLATE(BM_MultiHeadAttention, float)
    ->Apply(SelfShapes)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_MultiHeadAttention_Unfrozen, float)
    ->Apply(SelfShapes)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_MultiHeadAttention_Causal, float)
    ->Apply(CausalShapes)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_MultiHeadAttention_Cross, float)
    ->Apply(CrossShapes)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_NaiveAttention, float)
    ->Apply(NaiveSelfShapes)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_NaiveAttention_Causal, float)
    ->Apply(NaiveCausalShapes)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_NaiveAttention_Cross, float)
    ->Apply(NaiveCrossShapes)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

#include "gbench_main.hpp"  // main(): prints the kernel set in use
