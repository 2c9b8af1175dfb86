// SPDX-License-Identifier: MIT
// bench/kernel_bench.cpp: the attention kernel alone, attn::scaled_dot_product_attention on
// (B, H, T, hd) views, streaming vs materialised, causal and not, against the naive loop.
// Glossary: B = batch, T = tokens (T_q queries, T_k keys), D = H * hd, H = heads.
//
// The inputs are laid out as MultiHeadAttention lays them out: its projection GEMM writes
// Q, K and V head-major, (B, H, T, hd) with each head's rows contiguous, and the output is
// written into (B, T_q, H, hd), which is the (B, T_q, D) input of out_proj. The naive loop
// reads the same values from a token-major (B, T, 3, H, hd) buffer (cross: Q (B, T_q, H, hd),
// K/V (B, T_k, 2, H, hd)), the layout it was written for. FLOPS counts
// 4 * B * H * pairs * hd (bench_support.hpp).
//
// Run:
//   OMP_NUM_THREADS=1 build/bench/bench/kernel_bench --benchmark_filter=Streaming
//   build/bench/bench/kernel_bench --benchmark_repetitions=5
//   --benchmark_report_aggregates_only=true

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "bench_support.hpp"
#include "reference/naive_attention.hpp"  // llm.c-style attention_forward, same binary

namespace {

using attn::Index;
using attn::bench::MhaShape;

// Packed inputs and the output of one kernel call, as MultiHeadAttention builds them.
template <class Scalar>
struct KernelInputs {
  attn::Tensor<Scalar, 3> q_buf, kv_buf, out_buf;     // token-major: the naive loop's layout
  attn::Tensor<Scalar, 4> q_heads, k_heads, v_heads;  // head-major copies: attn's inputs
  attn::TensorView<const Scalar, 4> q, k, v;
  attn::TensorView<Scalar, 4> out;
  Index q_ld = 0, kv_ld = 0;  // row strides of the packed buffers, for the naive loop
  const Scalar* k_ptr = nullptr;
  const Scalar* v_ptr = nullptr;
};

template <class Scalar>
KernelInputs<Scalar> make_inputs(Index b, Index tq, Index tk, Index d, Index h, bool cross) {
  KernelInputs<Scalar> in;
  const Index hd = d / h;
  if (!cross) {
    in.q_buf = attn::bench::random_tensor<Scalar, 3>({b, tq, 3 * d}, /*seed=*/7);
    const Scalar* qkv = in.q_buf.data();
    const attn::Shape<4> shape{b, h, tq, hd}, strides{tq * 3 * d, hd, 3 * d, 1};
    in.q = {qkv, shape, strides};
    in.k = {qkv + d, shape, strides};
    in.v = {qkv + 2 * d, shape, strides};
    in.q_ld = in.kv_ld = 3 * d;
    in.k_ptr = qkv + d;
    in.v_ptr = qkv + 2 * d;
  } else {
    in.q_buf = attn::bench::random_tensor<Scalar, 3>({b, tq, d}, /*seed=*/7);
    in.kv_buf = attn::bench::random_tensor<Scalar, 3>({b, tk, 2 * d}, /*seed=*/8);
    const Scalar* kv = in.kv_buf.data();
    in.q = {in.q_buf.data(), {b, h, tq, hd}, {tq * d, hd, d, 1}};
    const attn::Shape<4> shape{b, h, tk, hd}, strides{tk * 2 * d, hd, 2 * d, 1};
    in.k = {kv, shape, strides};
    in.v = {kv + d, shape, strides};
    in.q_ld = d;
    in.kv_ld = 2 * d;
    in.k_ptr = kv;
    in.v_ptr = kv + d;
  }
  // Head-major copies, as MultiHeadAttention's projection writes them.
  in.q_heads = attn::contiguous(in.q);
  in.k_heads = attn::contiguous(in.k);
  in.v_heads = attn::contiguous(in.v);
  in.q = in.q_heads.view();
  in.k = in.k_heads.view();
  in.v = in.v_heads.view();
  in.out_buf = attn::Tensor<Scalar, 3>({b, tq, d});
  in.out = {in.out_buf.data(), {b, h, tq, hd}, {tq * d, hd, d, 1}};
  return in;
}

MhaShape shape_of(const benchmark::State& state, bool causal, bool cross) {
  MhaShape s{};
  s.b = state.range(0);
  s.tq = state.range(1);
  s.tk = cross ? state.range(2) : s.tq;
  s.d = state.range(cross ? 3 : 2);
  s.h = state.range(cross ? 4 : 3);
  s.causal = causal;
  s.cross = cross;
  return s;
}

void set_counters(benchmark::State& state, const MhaShape& s) {
  state.counters["FLOPS"] =
      benchmark::Counter(attn::bench::attention_flops(s.b, s.h, s.tq, s.tk, s.d / s.h, s.causal),
                         benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = attn::num_threads();
}

template <class Scalar>
void run_sdpa(benchmark::State& state, attn::AttentionPath path, bool causal, bool cross) {
  const MhaShape s = shape_of(state, causal, cross);
  auto in = make_inputs<Scalar>(s.b, s.tq, s.tk, s.d, s.h, cross);
  const auto mask = attn::bench::make_mask<Scalar>(causal);
  attn::AttentionOptions options;
  options.path = path;
  attn::Workspace ws;
  attn::scaled_dot_product_attention<Scalar>(in.q, in.k, in.v, in.out, ws, mask, options);

  for (auto _ : state) {
    attn::scaled_dot_product_attention<Scalar>(in.q, in.k, in.v, in.out, ws, mask, options);
    benchmark::DoNotOptimize(in.out.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, s);
}

template <class Scalar>
void run_naive(benchmark::State& state, bool causal, bool cross) {
  const MhaShape s = shape_of(state, causal, cross);
  auto in = make_inputs<Scalar>(s.b, s.tq, s.tk, s.d, s.h, cross);
  std::vector<Scalar> scratch(
      static_cast<std::size_t>(attn::bench::reference::max_threads() * s.tk));
  const auto call = [&] {
    attn::bench::reference::attention_forward(in.out_buf.data(), in.q_buf.data(), in.q_ld, in.k_ptr,
                                              in.v_ptr, in.kv_ld, s.b, s.tq, s.tk, s.d, s.h, causal,
                                              scratch.data());
  };

  // The reference must agree with attn's kernel before its time means anything.
  call();
  const attn::Tensor<Scalar, 3> naive_out(in.out_buf);
  attn::scaled_dot_product_attention<Scalar>(in.q, in.k, in.v, in.out,
                                             attn::bench::make_mask<Scalar>(causal));
  double max_err = 0;
  for (Index i = 0; i < naive_out.size(); ++i) {
    max_err = std::max(max_err,
                       std::abs(static_cast<double>(naive_out.data()[i] - in.out_buf.data()[i])));
  }
  if (!(max_err < 1e-4)) {
    state.SkipWithError(("naive kernel and attn differ by " + std::to_string(max_err)).c_str());
    return;
  }

  for (auto _ : state) {
    call();
    benchmark::DoNotOptimize(in.out_buf.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, s);
  state.counters["max_err"] = max_err;
}

constexpr auto kStreaming = attn::AttentionPath::kStreaming;
constexpr auto kMaterialized = attn::AttentionPath::kMaterialized;

// Args: B, T, D, H.
template <class Scalar>
void BM_ScaledDotProduct_Streaming(benchmark::State& state) {
  run_sdpa<Scalar>(state, kStreaming, /*causal=*/false, /*cross=*/false);
}
template <class Scalar>
void BM_ScaledDotProduct_StreamingCausal(benchmark::State& state) {
  run_sdpa<Scalar>(state, kStreaming, /*causal=*/true, /*cross=*/false);
}
template <class Scalar>
void BM_ScaledDotProduct_Materialized(benchmark::State& state) {
  run_sdpa<Scalar>(state, kMaterialized, /*causal=*/false, /*cross=*/false);
}
template <class Scalar>
void BM_ScaledDotProduct_MaterializedCausal(benchmark::State& state) {
  run_sdpa<Scalar>(state, kMaterialized, /*causal=*/true, /*cross=*/false);
}
template <class Scalar>
void BM_NaiveScaledDotProduct(benchmark::State& state) {
  run_naive<Scalar>(state, /*causal=*/false, /*cross=*/false);
}
template <class Scalar>
void BM_NaiveScaledDotProduct_Causal(benchmark::State& state) {
  run_naive<Scalar>(state, /*causal=*/true, /*cross=*/false);
}
// Args: B, Tq, Tk, D, H.
template <class Scalar>
void BM_ScaledDotProduct_StreamingCross(benchmark::State& state) {
  run_sdpa<Scalar>(state, kStreaming, /*causal=*/false, /*cross=*/true);
}
template <class Scalar>
void BM_ScaledDotProduct_MaterializedCross(benchmark::State& state) {
  run_sdpa<Scalar>(state, kMaterialized, /*causal=*/false, /*cross=*/true);
}
template <class Scalar>
void BM_NaiveScaledDotProduct_Cross(benchmark::State& state) {
  run_naive<Scalar>(state, /*causal=*/false, /*cross=*/true);
}

// Grouped-query attention (compare it per FLOP with multi-head attention): head-major
// q (B, H, T, hd) and k, v (B, H_kv, T, hd), causal self-attention, as a Llama layer's
// prefill runs it. Args: B, T, H, H_kv, hd; compare the FLOPS counter across H_kv at one
// (B, T, H, hd) (H_kv = H is multi-head attention).
void BM_ScaledDotProduct_GroupedQueryCausal(benchmark::State& state) {
  const Index b = state.range(0), t = state.range(1), h = state.range(2), hkv = state.range(3),
              hd = state.range(4);
  const auto q = attn::bench::random_tensor<float, 4>({b, h, t, hd}, 1);
  const auto k = attn::bench::random_tensor<float, 4>({b, hkv, t, hd}, 2);
  const auto v = attn::bench::random_tensor<float, 4>({b, hkv, t, hd}, 3);
  attn::Tensor<float, 4> out({b, h, t, hd});
  attn::AttentionMask<float> mask;
  mask.causal();
  attn::Workspace ws;
  for (auto _ : state) {
    attn::scaled_dot_product_attention<float>(q.view(), k.view(), v.view(), out.view(), ws, mask);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.counters["FLOPS"] = benchmark::Counter(attn::bench::attention_flops(b, h, t, t, hd, true),
                                               benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = attn::num_threads();
}
BENCHMARK(BM_ScaledDotProduct_GroupedQueryCausal)
    ->ArgNames({"B", "T", "H", "H_kv", "hd"})
    ->Args({1, 1024, 32, 32, 128})
    ->Args({1, 1024, 32, 8, 128})
    ->Args({1, 1024, 32, 1, 128})
    ->Args({1, 2048, 8, 8, 64})
    ->Args({1, 2048, 8, 2, 64})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// The cost of each attention variant over the plain kernel (streaming path, float): every
// iteration times one plain call and one call with the variant, in alternating order (so
// neither always runs on the other's warm caches), and the `ratio` counter is the median of
// the per-iteration ratios variant / plain (with --benchmark_repetitions, the median of those
// medians). `plain` is the control: plain against plain, the noise floor of the ratio.
// Args: B, T, D, H, causal (0/1), variant (0 plain, 1 softcap 30 (Grok-1's), 2 sinks, 3 ALiBi
// max_bias 8 (BLOOM's)). The shapes: docs/benchmarks.md#attention-variants.
void BM_ScaledDotProduct_Variant(benchmark::State& state) {
  const Index b = state.range(0), t = state.range(1), d = state.range(2), h = state.range(3);
  const bool causal = state.range(4) != 0;
  const auto variant = state.range(5);
  auto in = make_inputs<float>(b, t, t, d, h, /*cross=*/false);
  const auto mask = attn::bench::make_mask<float>(causal);
  attn::Tensor<float, 1> sinks(attn::Shape<1>{h});
  for (Index i = 0; i < h; ++i) sinks(i) = 0.25f * static_cast<float>(i % 4) - 0.5f;
  attn::AttentionOptions plain, varied;
  plain.path = varied.path = attn::AttentionPath::kStreaming;
  if (variant == 1) varied.softcap = 30.0;
  if (variant == 2) varied.sinks = sinks;
  if (variant == 3) varied.alibi_max_bias = 8.0;
  attn::Workspace ws;
  const auto timed = [&](const attn::AttentionOptions& options) {
    const auto start = std::chrono::steady_clock::now();
    attn::scaled_dot_product_attention<float>(in.q, in.k, in.v, in.out, ws, mask, options);
    benchmark::DoNotOptimize(in.out.data());
    benchmark::ClobberMemory();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  timed(plain);  // warm: workspace, pages, caches
  timed(varied);
  std::vector<double> ratios, plain_s, varied_s;
  for (auto _ : state) {
    const bool plain_first = ratios.size() % 2 == 0;
    const double first = timed(plain_first ? plain : varied);
    const double second = timed(plain_first ? varied : plain);
    const double p = plain_first ? first : second, v = plain_first ? second : first;
    plain_s.push_back(p);
    varied_s.push_back(v);
    ratios.push_back(v / p);
    state.SetIterationTime(v);
  }
  const auto median = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    const std::size_t n = x.size();
    return n == 0 ? 0.0 : n % 2 == 1 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
  };
  state.counters["ratio"] = median(ratios);
  state.counters["plain_ms"] = 1e3 * median(plain_s);
  state.counters["variant_ms"] = 1e3 * median(varied_s);
  state.counters["threads"] = attn::num_threads();
  constexpr const char* kNames[] = {"plain", "softcap", "sinks", "alibi"};
  state.SetLabel(std::string(kNames[variant]) + (causal ? " causal" : ""));
}
void VariantShapes(benchmark::internal::Benchmark* bm) {
  bm->ArgNames({"B", "T", "D", "H", "causal", "variant"});
  for (std::int64_t variant = 0; variant < 4; ++variant) {
    bm->Args({8, 512, 512, 8, 0, variant});
    bm->Args({8, 512, 512, 8, 1, variant});
    bm->Args({1, 8192, 512, 8, 1, variant});
  }
}
BENCHMARK(BM_ScaledDotProduct_Variant)
    ->Apply(VariantShapes)
    ->UseManualTime()
    ->MinTime(1.5)
    ->Unit(benchmark::kMillisecond);

// Every self-attention benchmark shape and reference shape, each run causal and not.
void add_shapes(benchmark::internal::Benchmark* bm, bool cross, bool benchmark, bool reference) {
  if (cross) {
    bm->ArgNames({"B", "Tq", "Tk", "D", "H"});
  } else {
    bm->ArgNames({"B", "T", "D", "H"});
  }
  std::vector<std::vector<std::int64_t>> added;
  const auto add = [&](const std::vector<MhaShape>& shapes) {
    for (const MhaShape& s : shapes) {
      if (s.cross != cross) continue;
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
void SelfShapes(benchmark::internal::Benchmark* bm) { add_shapes(bm, false, true, true); }
void CrossShapes(benchmark::internal::Benchmark* bm) { add_shapes(bm, true, true, true); }
void NaiveSelfShapes(benchmark::internal::Benchmark* bm) { add_shapes(bm, false, false, true); }
void NaiveCrossShapes(benchmark::internal::Benchmark* bm) { add_shapes(bm, true, false, true); }

#define ATTN_KERNEL_BENCH(name, shapes) \
  BENCHMARK_TEMPLATE(name, float)->Apply(shapes)->UseRealTime()->Unit(benchmark::kMillisecond)

ATTN_KERNEL_BENCH(BM_ScaledDotProduct_Streaming, SelfShapes);
ATTN_KERNEL_BENCH(BM_ScaledDotProduct_Materialized, SelfShapes);
ATTN_KERNEL_BENCH(BM_NaiveScaledDotProduct, NaiveSelfShapes);
ATTN_KERNEL_BENCH(BM_ScaledDotProduct_StreamingCausal, SelfShapes);
ATTN_KERNEL_BENCH(BM_ScaledDotProduct_MaterializedCausal, SelfShapes);
ATTN_KERNEL_BENCH(BM_NaiveScaledDotProduct_Causal, NaiveSelfShapes);
ATTN_KERNEL_BENCH(BM_ScaledDotProduct_StreamingCross, CrossShapes);
ATTN_KERNEL_BENCH(BM_ScaledDotProduct_MaterializedCross, CrossShapes);
ATTN_KERNEL_BENCH(BM_NaiveScaledDotProduct_Cross, NaiveCrossShapes);

}  // namespace

#include "gbench_main.hpp"  // main(): prints the kernel set in use
