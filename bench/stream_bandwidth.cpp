// SPDX-License-Identifier: MIT
// bench/stream_bandwidth.cpp: the machine's memory bandwidth, what a decode step is bound by
// (a step's bytes read / time is reported as a fraction of this). Two kernels, each on
// 1 and 2 threads (OpenMP), median and best of several runs over arrays far larger than L3:
//   triad  a[i] = b[i] + s * c[i] (STREAM's triad; bytes counted as STREAM does: 3 arrays,
//          so the write-allocate read of a is not counted and the figure is STREAM's);
//   read   sum of one array with 8 independent 64-byte accumulators per thread, so many
//          cache lines are in flight: a decode step mostly reads (weights, K and V), and a
//          one-accumulator loop measures latency instead (4 GB/s on the Zen 5 machine, NOTES).
// Every array is touched by the threads that later stream it (static schedule) before any
// timing, so no run pays first-touch page faults.
//
// Usage: stream_bandwidth [--mib M] [--runs N] [--threads 1,2]
//   --mib      MiB per array (default 256: 8x a 32 MiB L3; the triad uses three)
//   --runs     timed runs per kernel and thread count (default 10), after one warm-up
// Output, one line per kernel and thread count:
//   stream kernel=read threads=1 array_mib=256 runs=10 median_gbps=23.1 max_gbps=24.0
//   median_cpu_gbps=23.5
// median_cpu_gbps: bytes / (the process's CPU time / threads), median: on a shared machine the
// wall time also counts waits for a core, the CPU time does not (decode_timer's median_cpu_ms
// is the same kind of figure, so their ratio is a bandwidth fraction measured in one run).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "attn/parallel.hpp"  // set_num_threads, num_threads, OpenMP's header when enabled

namespace {

// 16 floats = 64 bytes: one cache line, one zmm (two ymm with AVX2). GCC vector extension,
// so the loop is vectorised whatever the target without intrinsics.
typedef float Line __attribute__((vector_size(64)));
constexpr std::size_t kLine = 16;
constexpr int kAccumulators = 8;

// [begin, end) of this thread's share of n lines (what a static schedule gives it).
void share(std::size_t n, std::size_t& begin, std::size_t& end) {
  const auto t = static_cast<std::size_t>(attn::detail::thread_id());
#if ATTN_HAS_OPENMP
  const auto nt = static_cast<std::size_t>(omp_get_num_threads());
#else
  const std::size_t nt = 1;
#endif
  begin = n * t / nt;
  end = n * (t + 1) / nt;
}

float* allocate(std::size_t floats) {
  return static_cast<float*>(::operator new (floats * sizeof(float), std::align_val_t{64}));
}

// Writes every array with the partition the kernels use (first touch by the streaming thread).
void touch(float* const* arrays, int count, std::size_t lines) {
#pragma omp parallel
  {
    std::size_t begin = 0, end = 0;
    share(lines, begin, end);
    for (int a = 0; a < count; ++a) {
      for (std::size_t i = begin * kLine; i < end * kLine; ++i)
        arrays[a][i] = 1.0f + 1e-7f * static_cast<float>(a);
    }
  }
}

double read_kernel(const float* x, std::size_t lines) {
  double total = 0;
#pragma omp parallel reduction(+ : total)
  {
    std::size_t begin = 0, end = 0;
    share(lines, begin, end);
    const Line* p = reinterpret_cast<const Line*>(x);
    Line acc[kAccumulators] = {};
    std::size_t i = begin;
    for (; i + kAccumulators <= end; i += kAccumulators) {
#pragma GCC unroll 8
      for (int k = 0; k < kAccumulators; ++k) acc[k] += p[i + static_cast<std::size_t>(k)];
    }
    for (; i < end; ++i) acc[0] += p[i];
    for (int k = 1; k < kAccumulators; ++k) acc[0] += acc[k];
    for (std::size_t e = 0; e < kLine; ++e) total += static_cast<double>(acc[0][e]);
  }
  return total;
}

void triad_kernel(float* a, const float* b, const float* c, std::size_t lines, float s) {
#pragma omp parallel
  {
    std::size_t begin = 0, end = 0;
    share(lines, begin, end);
    Line* pa = reinterpret_cast<Line*>(a);
    const Line* pb = reinterpret_cast<const Line*>(b);
    const Line* pc = reinterpret_cast<const Line*>(c);
    for (std::size_t i = begin; i < end; ++i) pa[i] = pb[i] + s * pc[i];
  }
}

/// The process's CPU time (all threads) in seconds.
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const std::size_t n = x.size();
  return n % 2 == 1 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

std::vector<int> parse_list(const char* text) {
  std::vector<int> out;
  std::string s(text);
  std::size_t at = 0;
  while (at <= s.size()) {
    const std::size_t comma = s.find(',', at);
    const std::string item =
        s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (!item.empty()) out.push_back(std::max(1, std::atoi(item.c_str())));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t mib = 256;
  int runs = 10;
  std::vector<int> threads{1, 2};
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (std::strcmp(argv[i], "--mib") == 0 && has_value) {
      mib = static_cast<std::size_t>(std::max(1, std::atoi(argv[++i])));
    } else if (std::strcmp(argv[i], "--runs") == 0 && has_value) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--threads") == 0 && has_value) {
      threads = parse_list(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: stream_bandwidth [--mib M] [--runs N] [--threads 1,2]\n");
      return 2;
    }
  }
  const std::size_t floats = mib * 1024 * 1024 / sizeof(float), lines = floats / kLine;
  float* arrays[3] = {allocate(floats), allocate(floats), allocate(floats)};
  const int available = attn::num_threads();
  double sink = 0;
  for (const int t : threads) {
    attn::set_num_threads(t);
    touch(arrays, 3, lines);  // with this thread count's partition
    for (const char* kernel : {"read", "triad"}) {
      const bool read = std::strcmp(kernel, "read") == 0;
      const double bytes = static_cast<double>(lines * kLine * sizeof(float)) * (read ? 1 : 3);
      std::vector<double> gbps, cpu_gbps;
      for (int r = -1; r < runs; ++r) {  // r = -1: warm-up
        const double c0 = cpu_seconds();
        const auto t0 = std::chrono::steady_clock::now();
        if (read) {
          sink += read_kernel(arrays[0], lines);
        } else {
          triad_kernel(arrays[0], arrays[1], arrays[2], lines, 0.5f);
        }
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double c = cpu_seconds() - c0;
        if (r >= 0) gbps.push_back(bytes / s * 1e-9), cpu_gbps.push_back(bytes / c * 1e-9 * t);
      }
      std::printf(
          "stream kernel=%s threads=%d array_mib=%zu runs=%d median_gbps=%.2f max_gbps=%.2f "
          "median_cpu_gbps=%.2f%s\n",
          kernel, t, mib, runs, median(gbps), *std::max_element(gbps.begin(), gbps.end()),
          median(cpu_gbps), t > available ? " (more threads than OpenMP's default)" : "");
      std::fflush(stdout);
    }
  }
  for (float* a : arrays) ::operator delete (a, std::align_val_t{64});
  return sink == 42.0 ? 1 : 0;  // keeps the reads from being optimised away
}
