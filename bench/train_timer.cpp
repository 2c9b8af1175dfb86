// SPDX-License-Identifier: MIT
// bench/train_timer.cpp: times one training step of attn::MultiHeadAttention (self-attention)
// on one shape, forward plus backward, and prints one machine-readable line (median ms,
// GFLOP/s, peak RSS). The attn side of scripts/bench/train.sh; scripts/bench/pytorch_train.py
// is the PyTorch side (autograd's loss.backward()) and prints the same fields. Run each
// measurement in a fresh process so RSS is per shape.
// Glossary: B = batch, T = tokens, D = embedding width, H = heads.
//
// Usage: train_timer B T D H causal threads reps [--max-seconds S] [--warmup N]
//   causal: 0 or 1 (query i sees keys j <= i). reps: timed steps (at most); stops early once
//   --max-seconds (default 10) of timed steps have run and at least 3 were timed. --warmup
//   (default 1) untimed steps first, so the Workspace, the SavedForward and the Gradients
//   are warm and no timed step allocates.
// One step: the training forward (forward(x, out, saved, ws, mask)), zeroing the gradients,
// the backward (backward(grad_out, saved, grad_x, grads, ws)), as a training loop runs it
// (the optimizer's step is not timed; PyTorch's side times the same).
// FLOPs: the forward's (bench_support.hpp's mha_flops) plus the backward's, counted as 2.5x
// the forward's attention plus 2x its projections: 3.5 F_att + 3 F_proj.
// Output, one line:
//   impl=attn B=8 T=512 D=512 H=8 causal=0 threads=1 reps=20 median_ms=.. min_ms=..
//   gflops=.. max_rss_mib=.. base_rss_mib=.. isa=avx512

#include <cstdio>
#include <vector>

#include "attn/attn.hpp"
#include "bench_support.hpp"
#include "timer_support.hpp"

int main(int argc, char** argv) {
  using attn::bench::max_rss_mib;
  const attn::bench::TimerArgs args(argc, argv, 7,
                                    "B T D H causal threads reps [--max-seconds S] [--warmup N]");
  if (!args.flags.empty()) args.fail("unknown option " + args.flags.front());
  const auto& v = args.positional;
  const attn::Index b = v[0], t = v[1], d = v[2], h = v[3];
  const bool causal = v[4] != 0;
  const int threads = static_cast<int>(std::max(1L, v[5]));
  if (b < 1 || t < 1 || d < 1 || h < 1 || d % h != 0) {
    args.fail("need positive sizes and D divisible by H");
  }

  const double base_rss = max_rss_mib();
  attn::set_num_threads(threads);
  auto mha = attn::bench::make_mha<float>(d, h, /*seed=*/1234, /*frozen=*/false);
  const auto x = attn::bench::random_tensor<float, 3>({b, t, d}, /*seed=*/42);
  const auto grad_out = attn::bench::random_tensor<float, 3>({b, t, d}, /*seed=*/43);
  attn::Tensor<float, 3> out({b, t, d}), grad_x({b, t, d});
  const auto mask = attn::bench::make_mask<float>(causal);
  attn::Workspace ws;
  attn::SavedForward<float> saved;
  attn::Gradients<float> grads(mha.named_parameters());
  const auto step = [&] {
    mha.forward(x.view(), out.view(), saved, ws, mask);
    grads.zero();
    grad_x.fill(0.0f);
    mha.backward(grad_out.view(), saved, grad_x.view(), grads, ws);
  };

  const std::vector<double> sorted =
      attn::bench::time_calls(step, args.warmup, v[6], args.max_seconds);
  double checksum = 0;  // keeps the results observable
  for (attn::Index i = 0; i < grad_x.size(); i += 97) checksum += grad_x.data()[i];

  const std::size_t n = sorted.size();
  const double median = attn::bench::median(sorted);
  const double attention = attn::bench::attention_flops(b, h, t, t, d / h, causal);
  const double projections = attn::bench::mha_flops(b, t, d, h, causal) - attention;
  const double flops = 3.5 * attention + 3.0 * projections;
  std::printf(
      "impl=attn B=%ld T=%ld D=%ld H=%ld causal=%d threads=%d reps=%zu median_ms=%.4f "
      "min_ms=%.4f gflops=%.2f max_rss_mib=%.1f base_rss_mib=%.1f checksum=%.6g isa=%s\n",
      static_cast<long>(b), static_cast<long>(t), static_cast<long>(d), static_cast<long>(h),
      causal ? 1 : 0, threads, n, median, sorted.front(), flops / (median * 1e-3) * 1e-9,
      max_rss_mib(), base_rss, checksum, attn::isa_name(attn::active_isa()));
  return 0;
}
