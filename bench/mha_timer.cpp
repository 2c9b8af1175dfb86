// SPDX-License-Identifier: MIT
// bench/mha_timer.cpp: times attn::MultiHeadAttention on one shape and prints one
// machine-readable line (median ms, GFLOP/s, peak RSS). The attn side of
// scripts/bench_vs_pytorch.sh; scripts/bench/pytorch_mha.py is the PyTorch side and
// prints the same fields. Run each measurement in a fresh process so RSS is per shape.
// Glossary: B = batch, T_q / T_k = query / key tokens, D = embedding width, H = heads.
//
// Usage: mha_timer B Tq Tk D H causal cross threads reps [--max-seconds S] [--warmup N]
//                  [--no-freeze] [--dtype f32|bf16]
//   causal, cross: 0 or 1. Self-attention (cross=0) needs Tk == Tq. Causal: query i sees
//   keys j <= i (PyTorch's triu(diagonal=1) attn_mask).
//   reps: timed calls (at most); stops early once --max-seconds (default 10) of timed
//   calls have run and at least 3 calls were timed. --warmup (default 1) untimed calls
//   first, so the Workspace is warm and no timed call allocates. The module is frozen
//   (weights packed for the GEMM once, MultiHeadAttention::freeze(), as an inference
//   deployment runs it) unless --no-freeze is given (then every call repacks them).
//   --dtype bf16: MultiHeadAttention<bfloat16> made from the same float module by the
//   converting constructor (every weight rounded once, as PyTorch's module.to(torch.bfloat16)),
//   frozen the same way, on the float input rounded to bfloat16, writing bfloat16; the line
//   then says impl=attn_bf16, dtype=bf16 and bf16_path= (widen, dot or amx: how its GEMMs
//   and attention multiply here, attn::bf16_path()); the float module's says impl=attn and
//   dtype=f32.
// Output, one line:
//   impl=attn B=8 Tq=512 Tk=512 D=512 H=8 causal=0 cross=0 threads=1 reps=20
//   median_ms=12.345 min_ms=12.001 gflops=178.2 max_rss_mib=42.1 base_rss_mib=3.9 frozen=1
//   isa=avx512 dtype=f32   (--dtype bf16: ... dtype=bf16 bf16_path=amx)
// max_rss_mib is getrusage's ru_maxrss (peak resident set of the process); base_rss_mib
// the same taken before the module and inputs are built.

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "bench_support.hpp"
#include "timer_support.hpp"

namespace {

/// What one timed module gives back: the sorted call times and a checksum of its output.
struct Timed {
  std::vector<double> sorted_ms;
  double checksum = 0;
};

/// Times `mha` on q attending to keys (= values), as an inference deployment calls it.
template <class Scalar>
Timed time_module(const attn::MultiHeadAttention<Scalar>& mha, attn::TensorView<const Scalar, 3> q,
                  attn::TensorView<const Scalar, 3> keys, bool causal,
                  const attn::bench::TimerArgs& args) {
  attn::Tensor<Scalar, 3> out(q.shape());
  const auto mask = attn::bench::make_mask<attn::compute_type_t<Scalar>>(causal);
  attn::Workspace ws;
  Timed t;
  t.sorted_ms = attn::bench::time_calls([&] { mha.forward(q, keys, keys, out.view(), ws, mask); },
                                        args.warmup, args.positional[8], args.max_seconds);
  // Keep the result observable so nothing is optimised away.
  for (attn::Index i = 0; i < out.size(); i += 97) t.checksum += static_cast<float>(out.data()[i]);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  using attn::bench::max_rss_mib;
  // --dtype takes a value, which TimerArgs would read as a positional argument: taken out first.
  std::string dtype = "f32";
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::strcmp(argv[i], "--dtype") == 0 && i + 1 < argc) {
      dtype = argv[++i];
    } else {
      rest.push_back(argv[i]);
    }
  }
  const attn::bench::TimerArgs args(
      static_cast<int>(rest.size()), rest.data(), 9,
      "B Tq Tk D H causal cross threads reps [--max-seconds S] [--warmup N] "
      "[--no-freeze] [--dtype f32|bf16]");
  if (dtype != "f32" && dtype != "bf16") args.fail("bad --dtype '" + dtype + "'");
  const bool bf16 = dtype == "bf16";
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
  // The bfloat16 module is the float one converted (its draws rounded), then frozen alike.
  const auto mha = attn::bench::make_mha<float>(d, h, /*seed=*/1234, frozen && !bf16);
  const auto xq = attn::bench::random_tensor<float, 3>({b, tq, d}, /*seed=*/42);
  const auto xkv = cross ? attn::bench::random_tensor<float, 3>({b, tk, d}, /*seed=*/43)
                         : attn::Tensor<float, 3>();
  const auto kv = cross ? xkv.view() : xq.view();
  Timed timed;
  if (bf16) {  // the float input rounded (the float tensors stay: base RSS alike)
    auto narrow = attn::convert<attn::bfloat16>(mha);
    if (frozen) narrow.freeze();
    const auto q = attn::convert<attn::bfloat16>(xq.view());
    const auto k = cross ? attn::convert<attn::bfloat16>(kv) : attn::Tensor<attn::bfloat16, 3>();
    timed =
        time_module<attn::bfloat16>(narrow, q.view(), cross ? k.view() : q.view(), causal, args);
  } else {
    timed = time_module<float>(mha, xq.view(), kv, causal, args);
  }

  const std::vector<double>& sorted = timed.sorted_ms;
  const std::size_t n = sorted.size();
  const double median = attn::bench::median(sorted);
  const double flops = attn::bench::mha_flops(b, tq, tk, d, h, causal, cross);
  std::printf(
      "impl=%s B=%ld Tq=%ld Tk=%ld D=%ld H=%ld causal=%d cross=%d threads=%d reps=%zu "
      "median_ms=%.4f min_ms=%.4f gflops=%.2f max_rss_mib=%.1f base_rss_mib=%.1f "
      "checksum=%.6g frozen=%d isa=%s dtype=%s%s\n",
      bf16 ? "attn_bf16" : "attn", static_cast<long>(b), static_cast<long>(tq),
      static_cast<long>(tk), static_cast<long>(d), static_cast<long>(h), causal ? 1 : 0,
      cross ? 1 : 0, threads, n, median, sorted.front(), flops / (median * 1e-3) * 1e-9,
      max_rss_mib(), base_rss, timed.checksum, frozen ? 1 : 0, attn::isa_name(attn::active_isa()),
      dtype.c_str(),
      bf16 ? (std::string(" bf16_path=") + attn::bf16_path_name(attn::bf16_path())).c_str() : "");
  return 0;
}
