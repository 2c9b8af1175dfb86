// SPDX-License-Identifier: MIT
// bench/fma_peak.cpp: measures this machine's float32 FMA peak (GFLOP/s) with AVX-512 (zmm)
// and AVX2 (ymm) intrinsics, on one thread and on N threads. The denominator of "% of peak"
// in scripts/bench_vs_pytorch.sh. Also, on CPUs with AVX512-BF16, the peak of its dot product
// vdpbf16ps (zmm), the denominator for the bfloat16 GEMM's dot-product path; it is reported
// on its own lines and never taken as peak_isa. Likewise, where the CPU has AMX-BF16 and the
// operating system grants this process the tile state, the peak of tdpbf16ps (amx_bf16), the
// denominator for the GEMM's AMX path.
//
// Each thread runs independent chains acc = acc * m + c (one FMA = 2 FLOPs per lane), with
// more chains than FMA latency x FMA pipes on any current x86 core (8 on Zen 4/5 and
// Skylake-X), so the loop is throughput-bound. The vdpbf16ps chains are acc += a0 b0 + a1 b1
// (4 FLOPs per lane: two products, two additions), the pair's products equal and opposite so
// acc stays put. The AVX-512 and AVX2 kernels are compiled with target attributes and chosen
// at run time (__builtin_cpu_supports; AVX512-BF16 and AMX as attn/isa.hpp detects them), so the
// binary works on machines without AVX-512. The AMX loop multiplies two constant 16 x 32 bfloat16
// tiles into 6 independent 16 x 16 float tiles (more than tdpbf16ps's latency over its issue
// interval), 16384 FLOPs per instruction (16 x 16 x 32 products and additions), the same (0.5, 0.5)
// and (0.25, -0.25) pairs so the sums stay put. Best of several timed runs after a warm-up.
//
// Usage: fma_peak [--threads 1,2] [--seconds S] [--quick]
//   --threads  comma-separated thread counts (default: 1 and the number of CPUs)
//   --seconds  target duration of one timed run (default 0.2; --quick: 0.05)
// Output: key=value lines, e.g.
//   avx512_supported=1
//   avx512_t1_gflops=224.8
//   avx2_t1_gflops=112.5
//   avx512bf16_supported=1
//   avx512bf16_t1_gflops=415.0  <- vdpbf16ps (4 FLOPs per lane and instruction)
//   amx_bf16_supported=1
//   amx_bf16_t1_gflops=1500.0   <- tdpbf16ps
//   peak_isa=avx512
//   peak_t1_gflops=224.8      <- best ISA, 1 thread (what the comparison script reads)
//   peak_t2_gflops=449.1

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "amx_peak.hpp"
#include "attn/isa.hpp"  // the CPU's AVX512-BF16 and AMX (with the tile permission), as attn reads them
#include "fma_loop.hpp"

namespace {

// Chains per thread for AVX2: 12 ymm (of 16), leaving room for the multiplier and addend
// (the AVX-512 loop's constants are in fma_loop.hpp).
constexpr int kChains256 = 12;

__attribute__((target("avx2,fma"))) float fma_loop_avx2(long outer) {
  __m256 acc[kChains256];
  for (int j = 0; j < kChains256; ++j)
    acc[j] = _mm256_set1_ps(1.0f + 0.001f * static_cast<float>(j));
  const __m256 m = _mm256_set1_ps(kFmaMul), c = _mm256_set1_ps(kFmaAdd);
  for (long i = 0; i < outer; ++i) {
    for (long r = 0; r < kFmaInner; ++r) {
#pragma GCC unroll 16
      for (int j = 0; j < kChains256; ++j) acc[j] = _mm256_fmadd_ps(acc[j], m, c);
    }
  }
  __m256 sum = acc[0];
  for (int j = 1; j < kChains256; ++j) sum = _mm256_add_ps(sum, acc[j]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = 0;
  for (const float x : lanes) total += x;
  return total;
}

// vdpbf16ps chains: a = (0.5, 0.5) and b = (0.25, -0.25) in each lane's bfloat16 pair.
__attribute__((target("avx512f,avx512bf16"))) float dpbf16_loop_avx512(long outer) {
  __m512 acc[kFmaChains512];
  for (int j = 0; j < kFmaChains512; ++j)
    acc[j] = _mm512_set1_ps(1.0f + 0.001f * static_cast<float>(j));
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3F003F00);                     // 0.5, 0.5
  const __m512bh b = (__m512bh)_mm512_set1_epi32(static_cast<int>(0xBE803E80u));  // 0.25, -0.25
  for (long i = 0; i < outer; ++i) {
    for (long r = 0; r < kFmaInner; ++r) {
#pragma GCC unroll 32
      for (int j = 0; j < kFmaChains512; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
    }
  }
  return sum_chains512(acc);
}

// tdpbf16ps's loop (amx_peak.hpp), kFmaInner rounds per outer iteration as the others.
float tdpbf16_loop(long outer) { return amx_peak_rounds(outer * kFmaInner); }

struct Isa {
  const char* name;
  bool supported;
  float (*loop)(long);
  double flops_per_outer;  // chains * inner rounds * lanes * 2
};

std::atomic<float> g_sink{0};  // keeps every result alive

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Runs `outer` iterations on each of `threads` threads at once; returns the wall time.
double timed_run(const Isa& isa, int threads, long outer) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) {
    pool.emplace_back([&] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      g_sink.store(isa.loop(outer));
    });
  }
  while (ready.load() != threads - 1) {
  }
  const auto start = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  g_sink.store(isa.loop(outer));
  for (auto& th : pool) th.join();
  return seconds_since(start);
}

// GFLOP/s of `threads` threads: calibrates the iteration count to `seconds`, then takes
// the best of `repeats` runs.
double measure(const Isa& isa, int threads, double seconds, int repeats) {
  long outer = 64;
  timed_run(isa, 1, outer);  // warm-up: wake the core, settle the clock
  for (;;) {
    const double t = timed_run(isa, 1, outer);
    if (t >= seconds / 4 || outer > (1L << 40)) break;
    outer *= 2;
  }
  const double t = timed_run(isa, 1, outer);
  outer = std::max(1L, static_cast<long>(static_cast<double>(outer) * seconds / t));
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const double elapsed = timed_run(isa, threads, outer);
    const double flops = isa.flops_per_outer * static_cast<double>(outer) * threads;
    best = std::max(best, flops / elapsed * 1e-9);
  }
  return best;
}

std::vector<int> parse_list(const char* text) {
  std::vector<int> values;
  std::string s(text);
  std::size_t pos = 0;
  while (pos <= s.size()) {
    const std::size_t comma = s.find(',', pos);
    const std::string item =
        s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (!item.empty()) values.push_back(std::max(1, std::atoi(item.c_str())));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return values;
}

[[noreturn]] void usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s [--threads 1,2] [--seconds S] [--quick]\n", argv0);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  const int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<int> thread_counts = {1};
  if (cpus > 1) thread_counts.push_back(cpus);
  double seconds = 0.2;
  int repeats = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      thread_counts = parse_list(argv[++i]);
    } else if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = std::max(0.001, std::atof(argv[++i]));
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      seconds = 0.05;
      repeats = 3;
    } else {
      usage(argv[0]);
    }
  }
  if (thread_counts.empty()) usage(argv[0]);

  __builtin_cpu_init();
  const Isa isas[] = {
      {"avx512", __builtin_cpu_supports("avx512f") != 0, fma_loop_avx512,
       kFmaChains512 * static_cast<double>(kFmaInner) * 16 * 2},
      {"avx2", __builtin_cpu_supports("avx2") != 0 && __builtin_cpu_supports("fma") != 0,
       fma_loop_avx2, kChains256 * static_cast<double>(kFmaInner) * 8 * 2},
  };

  std::printf("cpus=%d\n", cpus);
  const Isa* best_isa = nullptr;
  double best_t1 = 0;
  std::vector<double> best_by_threads(thread_counts.size(), 0.0);
  for (const Isa& isa : isas) {
    std::printf("%s_supported=%d\n", isa.name, isa.supported ? 1 : 0);
    if (!isa.supported) continue;
    std::vector<double> rates;
    for (const int threads : thread_counts) {
      const double gflops = measure(isa, threads, seconds, repeats);
      std::printf("%s_t%d_gflops=%.1f\n", isa.name, threads, gflops);
      std::fflush(stdout);
      rates.push_back(gflops);
    }
    // The best ISA is the one with the best single-thread rate (AVX-512 when present and
    // not slower); its rates are the peaks for every thread count.
    const double t1 = rates.front();
    if (best_isa == nullptr || t1 > best_t1) {
      best_isa = &isa;
      best_t1 = t1;
      best_by_threads = rates;
    }
  }
  if (best_isa == nullptr) {
    std::printf("peak_isa=none\n");
    return 1;
  }
  std::printf("peak_isa=%s\n", best_isa->name);
  for (std::size_t i = 0; i < thread_counts.size(); ++i) {
    std::printf("peak_t%d_gflops=%.1f\n", thread_counts[i], best_by_threads[i]);
  }
  // The dot product's rate, after the float peaks (which scripts read by name).
  const Isa dot = {"avx512bf16",
                   __builtin_cpu_supports("avx512f") != 0 && attn::detail::cpu_has_avx512_bf16(),
                   dpbf16_loop_avx512, kFmaChains512 * static_cast<double>(kFmaInner) * 16 * 4};
  std::printf("%s_supported=%d\n", dot.name, dot.supported ? 1 : 0);
  if (dot.supported) {
    for (const int threads : thread_counts) {
      std::printf("%s_t%d_gflops=%.1f\n", dot.name, threads,
                  measure(dot, threads, seconds, repeats));
      std::fflush(stdout);
    }
  }
  const Isa amx = {"amx_bf16", attn::detail::amx_support().usable, tdpbf16_loop,
                   kAmxRoundFlops * static_cast<double>(kFmaInner)};
  std::printf("%s_supported=%d\n", amx.name, amx.supported ? 1 : 0);
  if (amx.supported) {
    for (const int threads : thread_counts) {
      std::printf("%s_t%d_gflops=%.1f\n", amx.name, threads,
                  measure(amx, threads, seconds, repeats));
      std::fflush(stdout);
    }
  }
  return 0;
}
