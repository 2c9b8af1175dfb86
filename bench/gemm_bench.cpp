// SPDX-License-Identifier: MIT
// bench/gemm_bench.cpp: attn's packed GEMM (detail::gemm_nt, behind Linear and the Q/K/V and
// output projections) against Eigen's product on the same row-major operands, in one binary.
// This is where the GEMM's blocking (gemm_blocking(), attn/kernels/gemm_args.hpp) was tuned.
// Also the GEMM on bfloat16 operands (float results) on both of its paths, AVX512-BF16's
// dot product (dot=1) and widening to float (dot=0), beside the float GEMM on the same values,
// each with W packed per call and packed once (pack_gemm_b, as a frozen layer holds it).
//
// Args: M (rows = B*T), N (output features), K (input features). y (M, N) = x (M, K) W^T.
// Counter: FLOPS = 2*M*N*K per second. bench/fma_peak gives the peaks to divide by: the float
// FMA's for the float GEMM and the widening path, vdpbf16ps's for the dot product. BM_FmaPeak
// and BM_AmxPeak time the float and AMX peaks in the same run, BM_AmxTileLoop the AMX GEMM's
// tile loop on cached operands (its ceiling).
//
// Run:
//   OMP_NUM_THREADS=1 build/bench/bench/gemm_bench --benchmark_repetitions=5
//   --benchmark_report_aggregates_only=true
// On a shared machine, add --benchmark_enable_random_interleaving=true and divide by
// BM_FmaPeak's rate (float) or BM_AmxPeak's (AMX) from the same run, CPU times.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>

#include "amx_peak.hpp"
#include "attn/attn.hpp"
#include "bench_support.hpp"
#include "fma_loop.hpp"

namespace {

using attn::Index;

void GemmShapes(benchmark::internal::Benchmark* bm) {
  bm->ArgNames({"M", "N", "K"});
  bm->Args({4096, 1536, 512});  // B8 T512 D512: fused Q/K/V projection
  bm->Args({4096, 512, 512});   // B8 T512 D512: out_proj
  bm->Args({128, 1536, 512});   // B1 T128 D512: fused Q/K/V projection
  bm->Args({2048, 2304, 768});  // B1 T2048 D768: fused Q/K/V projection
  bm->Args({8192, 1536, 512});  // B1 T8192 D512: fused Q/K/V projection
}

template <class Scalar>
void set_flops(benchmark::State& state) {
  const double flops = 2.0 * static_cast<double>(state.range(0)) *
                       static_cast<double>(state.range(1)) * static_cast<double>(state.range(2));
  state.counters["FLOPS"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = attn::num_threads();
}

// y (M, N) = x (M, K) w^T, w (N, K) in nn.Linear's layout; the same inputs for both GEMMs.
template <class Scalar>
struct Operands {
  explicit Operands(const benchmark::State& state)
      : m(state.range(0)),
        n(state.range(1)),
        k(state.range(2)),
        x(attn::bench::random_tensor<Scalar, 2>({m, k}, /*seed=*/1)),
        w(attn::bench::random_tensor<Scalar, 2>({n, k}, /*seed=*/2)),
        y({m, n}) {}
  Index m, n, k;
  attn::Tensor<Scalar, 2> x, w, y;
};

template <class Scalar>
void BM_Gemm(benchmark::State& state) {
  Operands<Scalar> o(state);
  for (auto _ : state) {
    attn::detail::gemm_nt(o.m, o.n, o.k, o.x.data(), o.k, o.w.data(), o.k, o.y.data(), o.n,
                          static_cast<const Scalar*>(nullptr));
    benchmark::DoNotOptimize(o.y.data());
    benchmark::ClobberMemory();
  }
  set_flops<Scalar>(state);
}

// Eigen's GEMM on the same row-major maps (the reference; Eigen threads itself with OpenMP).
template <class Scalar>
void BM_EigenGemm(benchmark::State& state) {
  Operands<Scalar> o(state);
  auto ym = attn::as_matrix(o.y);
  const auto xm = attn::as_matrix(o.x);
  const auto wm = attn::as_matrix(o.w);
  for (auto _ : state) {
    ym.noalias() = xm * wm.transpose();
    benchmark::DoNotOptimize(o.y.data());
    benchmark::ClobberMemory();
  }
  set_flops<Scalar>(state);
}

// The bfloat16 GEMM, y (float) = x W^T with x and W bfloat16 (the float operands rounded), on
// the path `path` (attn::Bf16Path: 0 widening, 1 vdpbf16ps, 2 AMX; skipped where the CPU or
// the operating system lacks it), W packed per call or once (`packed`). The float rows below with
// packed=1 are the float GEMM on a pre-packed W, for the same comparison.
void BM_GemmBf16(benchmark::State& state) {
  Operands<float> o(state);
  const auto path = static_cast<attn::Bf16Path>(state.range(3));
  const bool packed = state.range(4) != 0;
  if (attn::set_bf16_path(path) != path) {
    state.SkipWithError(path == attn::Bf16Path::kAmx
                            ? attn::detail::amx_support().usable
                                  ? "the avx512 set is not in use"
                                  : attn::detail::amx_support().reason
                            : "this CPU has no AVX512-BF16 (or the avx512 set is not in use)");
    attn::set_bf16_path(std::nullopt);
    return;
  }
  const auto x = attn::convert<attn::bfloat16>(o.x);
  const auto w = attn::convert<attn::bfloat16>(o.w);
  const attn::detail::PackedGemmB<attn::bfloat16> pack =
      packed ? attn::detail::pack_gemm_b(o.n, o.k, w.data(), o.k, 0)
             : attn::detail::PackedGemmB<attn::bfloat16>();
  attn::Workspace ws;
  for (auto _ : state) {
    attn::detail::gemm_nt(o.m, o.n, o.k, x.data(), o.k, w.data(), o.k, o.y.data(), o.n,
                          static_cast<const float*>(nullptr), {&pack, 0}, &ws);
    benchmark::DoNotOptimize(o.y.data());
    benchmark::ClobberMemory();
  }
  set_flops<float>(state);
  attn::set_bf16_path(std::nullopt);
}

// The bfloat16 GEMM as a bfloat16 module runs its projections (gemm_nt_rounded): x and W
// bfloat16, W packed once, the float sums plus a bias rounded once into a bfloat16 y, on the
// path `path` as above.
void BM_GemmBf16Rounded(benchmark::State& state) {
  Operands<float> o(state);
  const auto path = static_cast<attn::Bf16Path>(state.range(3));
  if (attn::set_bf16_path(path) != path) {
    state.SkipWithError("this path does not run here");
    attn::set_bf16_path(std::nullopt);
    return;
  }
  const auto x = attn::convert<attn::bfloat16>(o.x);
  const auto w = attn::convert<attn::bfloat16>(o.w);
  const auto bias = attn::convert<attn::bfloat16>(attn::bench::random_tensor<float, 1>({o.n}, 3));
  attn::Tensor<attn::bfloat16, 2> y({o.m, o.n});
  const auto pack = attn::detail::pack_gemm_b(o.n, o.k, w.data(), o.k, 0);
  attn::Workspace ws;
  const Index n = o.n;
  for (auto _ : state) {
    attn::detail::gemm_nt_rounded(
        o.m, o.n, o.k, x.data(), o.k, w.data(), o.k, y.data(),
        [&](float* wide) { return attn::detail::GemmOutput<float>::row_major(wide, n); },
        bias.data(), {&pack, 0}, ws);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  set_flops<float>(state);
  attn::set_bf16_path(std::nullopt);
}

void BM_GemmPacked(benchmark::State& state) {
  Operands<float> o(state);
  const auto pack = attn::detail::pack_gemm_b(o.n, o.k, o.w.data(), o.k, 0);
  attn::Workspace ws;
  for (auto _ : state) {
    attn::detail::gemm_nt(o.m, o.n, o.k, o.x.data(), o.k, o.w.data(), o.k, o.y.data(), o.n,
                          static_cast<const float*>(nullptr), {&pack, 0}, &ws);
    benchmark::DoNotOptimize(o.y.data());
    benchmark::ClobberMemory();
  }
  set_flops<float>(state);
}

void RoundedShapes(benchmark::internal::Benchmark* bm) {
  bm->ArgNames({"M", "N", "K", "path"});
  for (const int path : {2, 1, 0}) {
    bm->Args({4096, 1536, 512, path});
    bm->Args({2048, 2304, 768, path});
    bm->Args({8192, 1536, 512, path});
  }
}

// tdpbf16ps's peak, as bench/fma_peak measures it (6 independent accumulator tiles, 16384
// products per instruction), in this binary: with --benchmark_enable_random_interleaving its
// repetitions run between the GEMMs' ones, so a loaded machine (another process's AMX or
// memory traffic on the same core) shows in both and their ratio stays meaningful.
void BM_AmxPeak(benchmark::State& state) {
  if (!attn::detail::amx_support().usable) {
    state.SkipWithError(attn::detail::amx_support().reason);
    return;
  }
  constexpr long kRounds = 20000;  // 120000 tdpbf16ps: about 2 ms
  for (auto _ : state) benchmark::DoNotOptimize(amx_peak_rounds(kRounds));
  state.counters["FLOPS"] =
      benchmark::Counter(kAmxRoundFlops * kRounds, benchmark::Counter::kIsIterationInvariantRate);
}

// The GEMM's tile loop (avx512/amx_bf16.inl's amx_panel()) on operands that stay in the
// caches: a 32 x 32 block of C in 2 x 2 tiles, each 32-deep step loading two A tiles (row
// stride 1 KiB, as A read in place with K = 512) and two contiguous B tiles, 16 steps (K = 512)
// per block; with `stores` the four C tiles are stored after the 16 steps and zeroed, as
// amx_panel() stores them. Against BM_AmxPeak in the same run, it is the ceiling of that loop
// shape with no memory traffic beyond L2 and no C written to memory.
__attribute__((target("amx-tile,amx-bf16"))) float amx_tile_loop(long blocks, bool stores) {
  amx_configure_whole_tiles();
  // A: 2^-7 (the sums stay small); B: pairs of 2^-7; both 64-byte aligned (tile rows on
  // whole lines, as the GEMM's).
  alignas(64) static std::uint16_t a[32 * 512];
  alignas(64) static std::uint32_t b[2 * 256 * 16];
  std::fill(a, a + 32 * 512, std::uint16_t{0x3C00});
  std::fill(b, b + 2 * 256 * 16, 0x3C003C00u);
  alignas(64) float c[32 * 32];
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (long block = 0; block < blocks; ++block) {
    for (int s = 0; s < 16; ++s) {
      _tile_loadd(4, a + s * 32, 1024);
      _tile_loadd(6, b + s * 256, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(7, b + 4096 + s * 256, 64);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(5, a + 16 * 512 + s * 32, 1024);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    if (stores) {
      _tile_stored(0, c, 128);
      _tile_stored(1, c + 16, 128);
      _tile_stored(2, c + 512, 128);
      _tile_stored(3, c + 528, 128);
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
    }
  }
  _tile_stored(0, c, 128);
  _tile_release();
  return c[0];
}

void BM_AmxTileLoop(benchmark::State& state) {
  if (!attn::detail::amx_support().usable) {
    state.SkipWithError(attn::detail::amx_support().reason);
    return;
  }
  constexpr long kBlocks = 2000;  // 128000 tdpbf16ps, as many as BM_AmxPeak's 120000
  const bool stores = state.range(0) != 0;
  for (auto _ : state) benchmark::DoNotOptimize(amx_tile_loop(kBlocks, stores));
  state.counters["FLOPS"] = benchmark::Counter(64.0 * 16 * 16 * 32 * 2 * kBlocks,
                                               benchmark::Counter::kIsIterationInvariantRate);
}

// The float FMA's peak, as bench/fma_peak measures it (24 independent zmm chains), in this
// binary: the denominator of the float GEMM's fraction of peak, timed between its repetitions
// with --benchmark_enable_random_interleaving (as BM_AmxPeak for AMX).
void BM_FmaPeak(benchmark::State& state) {
  if (!__builtin_cpu_supports("avx512f")) {
    state.SkipWithError("this CPU has no AVX-512");
    return;
  }
  constexpr long kOuter = 2000;  // 49 MFLOP: about 0.3 ms
  for (auto _ : state) {
    long outer = kOuter;
    benchmark::DoNotOptimize(outer);  // a new count every time: the loop is not hoisted
    benchmark::DoNotOptimize(fma_loop_avx512(outer));
  }
  state.counters["FLOPS"] =
      benchmark::Counter(kFmaOuterFlops512 * kOuter, benchmark::Counter::kIsIterationInvariantRate);
}

void Bf16Shapes(benchmark::internal::Benchmark* bm) {
  bm->ArgNames({"M", "N", "K", "path", "packed"});
  for (const int packed : {0, 1}) {
    for (const int path : {2, 1, 0}) {
      bm->Args({4096, 1536, 512, path, packed});
      bm->Args({4096, 512, 512, path, packed});
      bm->Args({128, 1536, 512, path, packed});
      bm->Args({2048, 2304, 768, path, packed});
      bm->Args({8192, 1536, 512, path, packed});
    }
  }
}

BENCHMARK_TEMPLATE(BM_Gemm, float)->Apply(GemmShapes)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_GemmPacked)->Apply(GemmShapes)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_FmaPeak)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GemmBf16)->Apply(Bf16Shapes)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AmxPeak)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AmxTileLoop)->ArgName("stores")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GemmBf16Rounded)->Apply(RoundedShapes)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_TEMPLATE(BM_EigenGemm, float)
    ->Apply(GemmShapes)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

#include "gbench_main.hpp"  // main(): prints the kernel set in use
