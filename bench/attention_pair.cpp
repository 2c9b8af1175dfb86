// SPDX-License-Identifier: MIT
// bench/attention_pair.cpp: a paired, alternated comparison of two versions of attn's bfloat16
// streaming attention (scaled_dot_product_attention<bfloat16> on the AMX path, else the CPU's
// default path) in one process, against the float call on the same values. On a machine
// shared with other jobs one binary per version measures the load more than the change
// (bench/bf16_attention_bench.cpp's float rows moved up to 1.9x between two runs); here each
// round times version 0, version 1 (their order swapped every other round) and the float call
// back to back on one thread, in CPU time (CLOCK_THREAD_CPUTIME_ID), and the report is the
// median over rounds of each time and of each round's ratios, so that a swing of the load
// hits the three alike. It also says whether the two versions' outputs have the same bits.
//
// The file is compiled three times: once per version (ATTN_PAIR_RUN names the entry point;
// the two units see different headers, and differ in an instruction-set flag so that attn's
// inline namespaces, and with them every symbol, differ), and once for main():
//   git archive <before> include | tar -x -C /tmp/before
//   g++ -std=c++17 -O3 -fopenmp -msse3 -DATTN_PAIR_RUN=pair_run_0 -I/usr/include/eigen3
//       -I/tmp/before/include -c bench/attention_pair.cpp -o run0.o
//   g++ -std=c++17 -O3 -fopenmp -DATTN_PAIR_RUN=pair_run_1 -I/usr/include/eigen3 -Iinclude
//       -c bench/attention_pair.cpp -o run1.o
//   g++ -std=c++17 -O3 -fopenmp bench/attention_pair.cpp run0.o run1.o -o attention_pair
//   OMP_NUM_THREADS=1 ./attention_pair [rounds (5)] [B H T d causal ...]
// (no shape arguments: the default list below). FLOPS counts 4 B H T^2 d, halved for causal.

#include <cstdint>

/// Times `calls` calls of one version's attention on a (B, H, T, d) shape (causal or not;
/// bfloat16 if `bf16`, else float): returns their CPU time in seconds, and (hash not null) the
/// FNV-1a hash of the output's bytes in *hash.
#define ATTN_PAIR_SIGNATURE(name)                                                               \
  double name(long batch, long heads, long tokens, long dim, bool causal, bool bf16, int calls, \
              std::uint64_t* hash)

#ifdef ATTN_PAIR_RUN

#include <time.h>

#include <memory>
#include <optional>

#include "attn/attn.hpp"

namespace {

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

attn::Tensor<float, 4> random(const attn::Shape<4>& shape, std::uint64_t seed) {
  attn::Tensor<float, 4> t(shape);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull;
  for (attn::Index i = 0; i < t.size(); ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t.data()[i] = static_cast<float>(x >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
  }
  return t;
}

// The inputs of the last shape asked for (bf16_attention_bench.cpp's values).
struct Inputs {
  long b, h, t, d;
  bool causal;
  attn::Tensor<attn::bfloat16, 4> qb, kb, vb, outb;
  attn::Tensor<float, 4> q, k, v, out;
  attn::AttentionMask<float> mask;
  attn::Workspace ws;
  Inputs(long b_, long h_, long t_, long d_, bool causal_)
      : b(b_),
        h(h_),
        t(t_),
        d(d_),
        causal(causal_),
        qb(attn::convert<attn::bfloat16>(random({b, h, t, d}, 1))),
        kb(attn::convert<attn::bfloat16>(random({b, h, t, d}, 2))),
        vb(attn::convert<attn::bfloat16>(random({b, h, t, d}, 3))),
        outb(qb.shape()),
        q(attn::convert<float>(qb)),
        k(attn::convert<float>(kb)),
        v(attn::convert<float>(vb)),
        out(qb.shape()) {
    if (causal) mask.causal();
  }
};

std::uint64_t fnv(const void* data, std::size_t bytes) {
  std::uint64_t x = 0xcbf29ce484222325ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) x = (x ^ p[i]) * 0x100000001b3ull;
  return x;
}

}  // namespace

ATTN_PAIR_SIGNATURE(ATTN_PAIR_RUN) {
  static std::unique_ptr<Inputs> in;
  if (!in || in->b != batch || in->h != heads || in->t != tokens || in->d != dim ||
      in->causal != causal) {
    in.reset();
    in = std::make_unique<Inputs>(batch, heads, tokens, dim, causal);
  }
  if (bf16) attn::set_bf16_path(attn::Bf16Path::kAmx);  // widening or the dot path where no AMX
  const double start = cpu_seconds();
  for (int c = 0; c < calls; ++c) {
    if (bf16) {
      attn::scaled_dot_product_attention<attn::bfloat16>(
          in->qb.view(), in->kb.view(), in->vb.view(), in->outb.view(), in->ws, in->mask);
    } else {
      attn::scaled_dot_product_attention<float>(in->q.view(), in->k.view(), in->v.view(),
                                                in->out.view(), in->ws, in->mask);
    }
  }
  const double seconds = cpu_seconds() - start;
  if (bf16) attn::set_bf16_path(std::nullopt);
  if (hash == nullptr) return seconds;
  *hash = bf16 ? fnv(in->outb.data(), static_cast<std::size_t>(in->outb.size()) * 2)
               : fnv(in->out.data(), static_cast<std::size_t>(in->out.size()) * 4);
  return seconds;
}

#else  // main()

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

ATTN_PAIR_SIGNATURE(pair_run_0);
ATTN_PAIR_SIGNATURE(pair_run_1);

namespace {

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const std::size_t n = x.size();
  return n % 2 == 1 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

struct Shape {
  long b, h, t, d;
  bool causal;
};

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 5;
  std::vector<Shape> shapes;
  for (int i = 2; i + 4 < argc; i += 5) {
    shapes.push_back({std::atol(argv[i]), std::atol(argv[i + 1]), std::atol(argv[i + 2]),
                      std::atol(argv[i + 3]), std::atoi(argv[i + 4]) != 0});
  }
  if (shapes.empty()) {
    shapes = {{8, 8, 512, 64, false},   {8, 8, 512, 64, true},  {1, 16, 1024, 128, false},
              {1, 16, 1024, 128, true}, {1, 8, 2048, 64, true}, {1, 8, 8192, 64, true}};
  }
  std::printf(
      "# rounds %d; times are medians (ms, CPU time, one call); v1/v0 and fl/v1 the\n"
      "# medians of each round's ratios; bits: the two versions' bfloat16 outputs\n",
      rounds);
  for (const Shape& s : shapes) {
    // Calls per sample: about 50 ms of the bfloat16 call or more.
    const double flops = 4.0 * static_cast<double>(s.b * s.h) * static_cast<double>(s.t) *
                         static_cast<double>(s.t) * static_cast<double>(s.d) *
                         (s.causal ? 0.5 : 1.0);
    const int calls = std::max(1, static_cast<int>(2.5e9 / flops));
    std::uint64_t h0 = 0, h1 = 0, hf = 0;
    // Warm-up (inputs, workspaces, pages) and the outputs' hashes.
    pair_run_0(s.b, s.h, s.t, s.d, s.causal, true, 1, &h0);
    pair_run_1(s.b, s.h, s.t, s.d, s.causal, true, 1, &h1);
    pair_run_1(s.b, s.h, s.t, s.d, s.causal, false, 1, &hf);
    std::vector<double> t0, t1, tf, r10, rf0, rf1;
    for (int r = 0; r < rounds; ++r) {
      double a = 0, b = 0;
      if (r % 2 == 0) {
        a = pair_run_0(s.b, s.h, s.t, s.d, s.causal, true, calls, nullptr);
        b = pair_run_1(s.b, s.h, s.t, s.d, s.causal, true, calls, nullptr);
      } else {
        b = pair_run_1(s.b, s.h, s.t, s.d, s.causal, true, calls, nullptr);
        a = pair_run_0(s.b, s.h, s.t, s.d, s.causal, true, calls, nullptr);
      }
      const double f = pair_run_1(s.b, s.h, s.t, s.d, s.causal, false, calls, nullptr);
      t0.push_back(a / calls), t1.push_back(b / calls), tf.push_back(f / calls);
      r10.push_back(b / a), rf0.push_back(f / a), rf1.push_back(f / b);
    }
    const double g = flops * 1e-9;
    std::printf(
        "B%ld H%ld T%ld d%ld causal %d: float %.1f ms %.0f GF/s | v0 %.1f ms %.0f GF/s | "
        "v1 %.1f ms %.0f GF/s | v1/v0 %.3f | fl/v0 %.2f fl/v1 %.2f | bits %s\n",
        s.b, s.h, s.t, s.d, s.causal ? 1 : 0, median(tf) * 1e3, g / median(tf), median(t0) * 1e3,
        g / median(t0), median(t1) * 1e3, g / median(t1), median(r10), median(rf0), median(rf1),
        h0 == h1 ? "same" : "DIFFER");
    std::fflush(stdout);
  }
  return 0;
}

#endif
