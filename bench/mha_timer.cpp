// SPDX-License-Identifier: MIT
// bench/mha_timer.cpp: times attn::MultiHeadAttention on one shape and prints one
// machine-readable line (median ms, GFLOP/s, peak RSS). The attn side of
// scripts/bench_vs_pytorch.sh; scripts/bench/pytorch_mha.py is the PyTorch side and
// prints the same fields. Run each measurement in a fresh process so RSS is per shape.
// Glossary: B = batch, T_q / T_k = query / key tokens, D = embedding width, H = heads.
//
// Usage: mha_timer B Tq Tk D H causal cross threads reps [--max-seconds S] [--warmup N]
//                  [--no-freeze]
//   causal, cross: 0 or 1. Self-attention (cross=0) needs Tk == Tq. Causal: query i sees
//   keys j <= i (PyTorch's triu(diagonal=1) attn_mask).
//   reps: timed calls (at most); stops early once --max-seconds (default 10) of timed
//   calls have run and at least 3 calls were timed. --warmup (default 1) untimed calls
//   first, so the Workspace is warm and no timed call allocates. The module is frozen
//   (weights packed for the GEMM once, MultiHeadAttention::freeze(), as an inference
//   deployment runs it) unless --no-freeze is given (then every call repacks them).
// Output, one line:
//   impl=attn B=8 Tq=512 Tk=512 D=512 H=8 causal=0 cross=0 threads=1 reps=20
//   median_ms=12.345 min_ms=12.001 gflops=178.2 max_rss_mib=42.1 base_rss_mib=3.9 frozen=1
// max_rss_mib is getrusage's ru_maxrss (peak resident set of the process); base_rss_mib
// the same taken before the module and inputs are built.

#include <cstdio>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "bench_support.hpp"
#include "timer_support.hpp"

int main(int argc, char** argv) {
  using attn::bench::max_rss_mib;
  const attn::bench::TimerArgs args(
      argc, argv, 9,
      "B Tq Tk D H causal cross threads reps [--max-seconds S] [--warmup N] "
      "[--no-freeze]");
  bool frozen = true;
  for (const std::string& flag : args.flags) {
    if (flag != "--no-freeze") args.fail("unknown option " + flag);
    frozen = false;
  }
  const auto& v = args.positional;
  const attn::Index b = v[0], tq = v[1], tk = v[2], d = v[3], h = v[4];
  const bool causal = v[5] != 0, cross = v[6] != 0;
  const int threads = static_cast<int>(std::max(1L, v[7]));
  if (b < 1 || tq < 1 || tk < 1 || d < 1 || h < 1 || d % h != 0) {
    args.fail("need positive sizes and D divisible by H");
  }
  if (!cross && tk != tq) args.fail("self-attention (cross=0) needs Tk == Tq");
  if (threads > 1 && !ATTN_HAS_OPENMP) {
    std::fprintf(stderr, "%s: built without OpenMP, running on one thread\n", argv[0]);
  }

  const double base_rss = max_rss_mib();
  attn::set_num_threads(threads);
  const auto mha = attn::bench::make_mha<float>(d, h, /*seed=*/1234, frozen);
  const auto xq = attn::bench::random_tensor<float, 3>({b, tq, d}, /*seed=*/42);
  const auto xkv = cross ? attn::bench::random_tensor<float, 3>({b, tk, d}, /*seed=*/43)
                         : attn::Tensor<float, 3>();
  const auto kv = cross ? xkv.view() : xq.view();
  attn::Tensor<float, 3> out({b, tq, d});
  const auto mask = attn::bench::make_mask<float>(causal);
  attn::Workspace ws;

  const std::vector<double> sorted =
      attn::bench::time_calls([&] { mha.forward(xq.view(), kv, kv, out.view(), ws, mask); },
                              args.warmup, v[8], args.max_seconds);
  // Keep the result observable so nothing is optimised away.
  double checksum = 0;
  for (attn::Index i = 0; i < out.size(); i += 97) checksum += out.data()[i];

  const std::size_t n = sorted.size();
  const double median = attn::bench::median(sorted);
  const double flops = attn::bench::mha_flops(b, tq, tk, d, h, causal, cross);
  std::printf(
      "impl=attn B=%ld Tq=%ld Tk=%ld D=%ld H=%ld causal=%d cross=%d threads=%d reps=%zu "
      "median_ms=%.4f min_ms=%.4f gflops=%.2f max_rss_mib=%.1f base_rss_mib=%.1f "
      "checksum=%.6g frozen=%d isa=%s\n",
      static_cast<long>(b), static_cast<long>(tq), static_cast<long>(tk), static_cast<long>(d),
      static_cast<long>(h), causal ? 1 : 0, cross ? 1 : 0, threads, n, median, sorted.front(),
      flops / (median * 1e-3) * 1e-9, max_rss_mib(), base_rss, checksum, frozen ? 1 : 0,
      attn::isa_name(attn::active_isa()));
  return 0;
}
