// SPDX-License-Identifier: MIT
// bench/train_timer.cpp: times one training step of attn::MultiHeadAttention (self-attention)
// on one shape, forward plus backward, and prints one machine-readable line (median ms,
// GFLOP/s, peak RSS). The attn side of scripts/bench/train.sh; scripts/bench/pytorch_train.py
// is the PyTorch side (autograd's loss.backward()) and prints the same fields. Run each
// measurement in a fresh process so RSS is per shape.
// Glossary: B = batch, T = tokens, D = embedding width, H = heads.
//
// Usage: train_timer B T D H causal threads reps [--bf16|--fp16] [--max-seconds S] [--warmup N]
//   causal: 0 or 1 (query i sees keys j <= i). reps: timed steps (at most); stops early once
//   --max-seconds (default 10) of timed steps have run and at least 3 were timed. --warmup
//   (default 1) untimed steps first, so the Workspace, the SavedForward and the Gradients
//   are warm and no timed step allocates. --bf16: the module, its input, grad_out and
//   gradients in bfloat16 (MultiHeadAttention<bfloat16>: the float module's weights rounded;
//   its backward runs bfloat16 GEMMs with float sums), impl=attn_bf16. --fp16: the same in
//   float16 (its products widened to float), impl=attn_fp16; grad_out as given (a training
//   loop would scale it: the same work).
// One step: the training forward (forward(x, out, saved, ws, mask)), zeroing the gradients,
// the backward (backward(grad_out, saved, grad_x, grads, ws)), as a training loop runs it
// (the optimizer's step is not timed; PyTorch's side times the same).
// FLOPs: the forward's (bench_support.hpp's mha_flops) plus the backward's, counted as 2.5x
// the forward's attention plus 2x its projections: 3.5 F_att + 3 F_proj.
// Times: wall clock per step (median_ms, min_ms) and the process's CPU time per step
// (cpu_ms, the median; all threads' time summed), which a shared machine disturbs less.
// Output, one line:
//   impl=attn B=8 T=512 D=512 H=8 causal=0 threads=1 reps=20 median_ms=.. min_ms=..
//   cpu_ms=.. gflops=.. max_rss_mib=.. base_rss_mib=.. isa=avx512

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "bench_support.hpp"
#include "timer_support.hpp"

namespace {

/// The process's CPU time (every thread's), in milliseconds.
double cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

struct StepTimes {
  std::vector<double> wall_ms, cpu_ms;  // sorted
  double checksum = 0;                  // keeps the results observable
};

/// Times the training step of `mha` (float, bfloat16 or float16) on x and grad_out of that type.
template <class Scalar>
StepTimes time_steps(const attn::MultiHeadAttention<Scalar>& mha, const attn::Tensor<Scalar, 3>& x,
                     const attn::Tensor<Scalar, 3>& grad_out, bool causal,
                     const attn::bench::TimerArgs& args) {
  attn::Tensor<Scalar, 3> out(x.shape()), grad_x(x.shape());
  const auto mask = attn::bench::make_mask<float>(causal);
  attn::Workspace ws;
  attn::SavedForward<Scalar> saved;
  attn::Gradients<Scalar> grads(mha.named_parameters());
  StepTimes times;
  const auto step = [&] {
    const double start = cpu_ms();
    mha.forward(x.view(), out.view(), saved, ws, mask);
    grads.zero();
    grad_x.fill(Scalar(0));
    mha.backward(grad_out.view(), saved, grad_x.view(), grads, ws);
    times.cpu_ms.push_back(cpu_ms() - start);
  };
  times.wall_ms = attn::bench::time_calls(step, args.warmup, args.positional[6], args.max_seconds);
  times.cpu_ms.erase(times.cpu_ms.begin(), times.cpu_ms.begin() + args.warmup);  // untimed
  std::sort(times.cpu_ms.begin(), times.cpu_ms.end());
  for (attn::Index i = 0; i < grad_x.size(); i += 97) {
    times.checksum += static_cast<double>(grad_x.data()[i]);
  }
  return times;
}

}  // namespace

int main(int argc, char** argv) {
  using attn::bench::max_rss_mib;
  const attn::bench::TimerArgs args(
      argc, argv, 7, "B T D H causal threads reps [--bf16|--fp16] [--max-seconds S] [--warmup N]");
  std::string impl = "attn";
  for (const std::string& flag : args.flags) {
    if (flag != "--bf16" && flag != "--fp16") args.fail("unknown option " + flag);
    if (impl != "attn") args.fail("--bf16 and --fp16 exclude each other");
    impl = flag == "--bf16" ? "attn_bf16" : "attn_fp16";
  }
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
  // The float module's weights, input and grad_out rounded to the 16-bit type.
  const auto narrow = [&](auto type) {
    using T = decltype(type);
    return time_steps(attn::convert<T>(mha), attn::convert<T>(x.view()),
                      attn::convert<T>(grad_out.view()), causal, args);
  };
  const StepTimes times = impl == "attn_bf16"   ? narrow(attn::bfloat16())
                          : impl == "attn_fp16" ? narrow(attn::float16())
                                                : time_steps(mha, x, grad_out, causal, args);

  const std::vector<double>& sorted = times.wall_ms;
  const double median = attn::bench::median(sorted);
  const double attention = attn::bench::attention_flops(b, h, t, t, d / h, causal);
  const double projections = attn::bench::mha_flops(b, t, d, h, causal) - attention;
  const double flops = 3.5 * attention + 3.0 * projections;
  std::printf(
      "impl=%s B=%ld T=%ld D=%ld H=%ld causal=%d threads=%d reps=%zu median_ms=%.4f "
      "min_ms=%.4f cpu_ms=%.4f gflops=%.2f max_rss_mib=%.1f base_rss_mib=%.1f checksum=%.6g "
      "isa=%s\n",
      impl.c_str(), static_cast<long>(b), static_cast<long>(t), static_cast<long>(d),
      static_cast<long>(h), causal ? 1 : 0, threads, sorted.size(), median, sorted.front(),
      attn::bench::median(times.cpu_ms), flops / (median * 1e-3) * 1e-9, max_rss_mib(), base_rss,
      times.checksum, attn::isa_name(attn::active_isa()));
  return 0;
}
