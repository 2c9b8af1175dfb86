// SPDX-License-Identifier: MIT
// bench/decode_timer.cpp: times one generation step of a Llama-3-8B-shaped attention layer
// (D 4096, H 32, H_kv 8, hd 128, RoPE, causal, frozen float32 weights, no biases) with a KV
// cache holding L tokens: a decode step (T_new = 1) or a chunk of a chunked prefill (T_new =
// 128), through MultiHeadAttention's incremental forward. The attn side of the decode
// benchmarks (scripts/bench/decode.sh); scripts/bench/pytorch_decode.py is the
// PyTorch side and prints the same fields. One fresh process per measurement.
// Glossary: B = batch, L = cached tokens, T_new = new tokens, D = model width, H / H_kv =
// query / key-value heads, hd = head dim.
//
// Usage: decode_timer OP B L threads reps [--max-seconds S] [--warmup N] [--chunk C]
//                     [--dim D] [--heads H] [--kv-heads H_kv] [--head-dim hd]
//                     [--kv-dtype f32|bf16|fp16|fp8e4m3|fp8e5m2|int8|int4] [--paged S]
//                     [--dtype f32|bf16] [--bf16-path widen|dot|amx]
//                     [--paired] [--fill C] [--scatter] [--compact]
//   OP: decode (T_new = 1), prefill (T_new = --chunk, default 128), gemm: the Q/K/V
//   projection alone (the frozen ((H + 2 H_kv) hd, D) weight) on B rows, to see whether the
//   GEMM with a pre-packed weight reads it at memory speed for B = 1..8 rows; or attend: the
//   attention of a decode step alone (cached_attention(), one query per head and item over
//   the L cached tokens), what the cache's element type changes.
//   --kv-dtype: what the cache stores (KVElement; int4 with one scale per 32 elements).
//   --paged S: a PagedKVCache of blocks of S tokens instead of a KVCache (one sequence per
//   item, a pool of just the blocks they take, filled item by item in chunks of --fill C
//   tokens, 1024 by default, as sequences decoded side by side take them: the pool places each
//   item's next block right after its last when that one is free, so an item's blocks still
//   lie in runs); decode, prefill and attend read it through the block tables.
//   --scatter (with --paged S): the pool twice as large, every other block held by a sequence
//   of one block, so that no two blocks of an item are neighbours (a pool fragmented by other
//   sequences): the worst layout for the rows' reads.
//   --compact (with --paged S): PagedKVCache::compact() once the cache is filled (with
//   --scatter: the fragmented pool's blocks moved back into one run per item).
//   --paired (with --paged S, op decode or attend): a KVCache and the PagedKVCache holding the
//   same tokens in one process, timed alternately: each of `reps` rounds times one step of
//   each back to back (their order swapped every other round), in CPU time, so that a swing
//   of the machine's load hits both alike; prints their median CPU times, the median over
//   rounds of contiguous / paged (1: paged as fast; below 1: slower) and whether the two
//   steps' outputs have the same bits.
//   --dtype bf16 (decode and prefill): the module in bfloat16 (MultiHeadAttention<bfloat16>,
//   the float module converted: each weight rounded once, then frozen) on the input rounded,
//   through a contiguous KVCache<bfloat16> holding the same keys and values rounded; the line
//   says impl=attn_bf16 (bytes count 2 per weight).
//   --bf16-path widen|dot|amx (with --dtype bf16): set_bf16_path() forced before the module is
//   frozen, so its GEMMs and attention take that path (dot: vdpbf16ps, the default of AVX512-BF16
//   CPUs without AMX; an unavailable path falls back to widening); the line says bf16_path=..
//   The cache is filled with random keys and values for L tokens (no prefill is run); after
//   every timed step it is truncated back to L, so each step sees the same cache.
// Output, one line:
//   impl=attn op=decode B=1 L=512 T_new=1 D=4096 H=32 H_kv=8 hd=128 threads=1 reps=20
//   median_ms=.. min_ms=.. bytes=.. gbps=.. cache_bytes=.. kv_bytes=.. workspace_bytes=..
//   max_rss_mib=.. base_rss_mib=.. isa=.. kv_dtype=.. token_bytes=.. paged=S (0: contiguous)
//   median_cpu_ms=..
// bytes: what the step must read, 4 ((H + 2 H_kv) hd D + D H hd) for the weights plus
// B (L + T_new) token_bytes for the cache (token_bytes = KVCache::bytes_per_token(), 4 * 2
// H_kv hd for f32: pytorch_decode.py's formula); gbps = bytes / median. For op=gemm, bytes
// are the weight's alone; for op=attend, the cache's alone. cache_bytes / kv_bytes: the cache's
// allocation and the keys and values it holds (capacity L + T_new); workspace_bytes: the
// Workspace after the steps. median_cpu_ms: the median CPU time of the process per timed call
// (all its threads; on a shared machine the wall time also counts waits for a core, the CPU
// time does not, so ratios of CPU times are the steadier ones).
// With --paired, instead:
//   impl=attn op=attend B=1 L=4096 ... kv_dtype=int8 paged=16 rounds=31
//   contiguous_cpu_ms=.. paged_cpu_ms=.. paged_speed=.. (median of contiguous / paged)
//   paged_speed_q1=.. paged_speed_q3=.. (its quartiles) same_bits=1 scatter=0|1
//   mean_run=.. (blocks per run of neighbouring blocks in the items' tables) compact_ms=..
//   (the wall time of compact(); 0 without --compact)

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "timer_support.hpp"

namespace {

constexpr const char* kArguments =
    "decode|prefill|gemm B L threads reps [--max-seconds S] "
    "[--warmup N] [--chunk C] [--dim D] [--heads H] [--kv-heads H_kv] "
    "[--head-dim hd] [--kv-dtype f32|bf16|fp16|fp8e4m3|fp8e5m2|int8|int4] [--paged S] "
    "[--dtype f32|bf16] [--bf16-path widen|dot|amx] [--paired] [--fill C] [--scatter] "
    "[--compact]";

[[noreturn]] void usage(const char* argv0, const std::string& why) {
  attn::bench::usage_error(argv0, why, kArguments);
}

long parse_int(const char* argv0, const char* text, const char* what) {
  return attn::bench::parse_count(argv0, text, what, kArguments);
}

/// Values in [-scale, scale) from a 64-bit hash of (seed, i): fast enough for 40M weights.
template <class View>
void fill(View x, std::uint64_t seed, float scale) {
  float* data = x.data();
  for (attn::Index i = 0; i < x.size(); ++i) {
    std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(i);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    data[i] = scale * (static_cast<float>(z >> 40) / 8388608.0f - 1.0f);
  }
}

/// The process's CPU time (all threads) in milliseconds.
double cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

/// attn::bench::time_calls(), also recording each timed call's CPU time (sorted) in cpu.
template <class Fn>
std::vector<double> time_calls_cpu(Fn&& fn, long warmup, long reps, double max_seconds,
                                   std::vector<double>& cpu) {
  long calls = 0;
  std::vector<double> wall = attn::bench::time_calls(
      [&] {
        const double start = cpu_ms();
        fn();
        if (calls++ >= warmup) cpu.push_back(cpu_ms() - start);
      },
      warmup, reps, max_seconds);
  std::sort(cpu.begin(), cpu.end());
  return wall;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<const char*> positional;
  double max_seconds = 5.0;
  long warmup = 2, chunk = 128, dim = 4096, heads = 32, kv_heads = 8, head_dim = 128, paged = 0;
  long fill_chunk = 1024;
  std::string kv_dtype = "f32", dtype = "f32", bf16_path;
  bool paired = false, scatter = false, compact = false;
  for (int i = 1; i < argc; ++i) {
    const auto option = [&](const char* name, long& value) {
      if (std::strcmp(argv[i], name) != 0 || i + 1 >= argc) return false;
      value = parse_int(argv[0], argv[++i], name);
      return true;
    };
    if (std::strcmp(argv[i], "--max-seconds") == 0 && i + 1 < argc) {
      max_seconds = std::atof(argv[++i]);
    } else if (std::strcmp(argv[i], "--paired") == 0) {
      paired = true;
    } else if (std::strcmp(argv[i], "--scatter") == 0) {
      scatter = true;
    } else if (std::strcmp(argv[i], "--compact") == 0) {
      compact = true;
    } else if (std::strcmp(argv[i], "--kv-dtype") == 0 && i + 1 < argc) {
      kv_dtype = argv[++i];
    } else if (std::strcmp(argv[i], "--dtype") == 0 && i + 1 < argc) {
      dtype = argv[++i];
    } else if (std::strcmp(argv[i], "--bf16-path") == 0 && i + 1 < argc) {
      bf16_path = argv[++i];
    } else if (!option("--warmup", warmup) && !option("--chunk", chunk) && !option("--dim", dim) &&
               !option("--heads", heads) && !option("--kv-heads", kv_heads) &&
               !option("--head-dim", head_dim) && !option("--paged", paged) &&
               !option("--fill", fill_chunk)) {
      positional.push_back(argv[i]);
    }
  }
  if (positional.size() != 5) usage(argv[0], "expected 5 positional arguments");
  const std::string op = positional[0];
  if (op != "decode" && op != "prefill" && op != "gemm" && op != "attend") {
    usage(argv[0], "bad OP '" + op + "'");
  }
  if (paired && (paged == 0 || (op != "decode" && op != "attend"))) {
    usage(argv[0], "--paired needs --paged S and OP decode or attend");
  }
  attn::KVCacheOptions cache_options;
  const attn::KVElement kinds[] = {attn::KVElement::kScalar,     attn::KVElement::kBFloat16,
                                   attn::KVElement::kFloat16,    attn::KVElement::kFloat8E4M3,
                                   attn::KVElement::kFloat8E5M2, attn::KVElement::kInt8,
                                   attn::KVElement::kInt4};
  bool known = kv_dtype == "f32";
  for (const attn::KVElement kind : kinds) {
    if (kv_dtype == attn::kv_element_name(kind)) cache_options.element = kind, known = true;
  }
  if (!known) usage(argv[0], "bad --kv-dtype '" + kv_dtype + "'");
  const bool bf16 = dtype == "bf16";
  if (dtype != "f32" && !bf16) usage(argv[0], "bad --dtype '" + dtype + "'");
  if (bf16 && ((op != "decode" && op != "prefill") || paged > 0 ||
               (kv_dtype != "f32" && kv_dtype != "bf16"))) {
    usage(argv[0], "--dtype bf16 times decode or prefill through a contiguous bfloat16 cache");
  }
  if (bf16) kv_dtype = "bf16";
  if (!bf16_path.empty()) {
    if (!bf16) usage(argv[0], "--bf16-path needs --dtype bf16");
    const attn::Bf16Path paths[] = {attn::Bf16Path::kWiden, attn::Bf16Path::kDot,
                                    attn::Bf16Path::kAmx};
    const char* names[] = {"widen", "dot", "amx"};
    bool named = false;
    for (int i = 0; i < 3; ++i) {
      if (bf16_path == names[i]) attn::set_bf16_path(paths[i]), named = true;
    }
    if (!named) usage(argv[0], "bad --bf16-path '" + bf16_path + "'");
  }
  const attn::Index b = parse_int(argv[0], positional[1], "B");
  const attn::Index length = parse_int(argv[0], positional[2], "L");
  const int threads = static_cast<int>(std::max(1L, parse_int(argv[0], positional[3], "threads")));
  const long reps = std::max(1L, parse_int(argv[0], positional[4], "reps"));
  const attn::Index t_new = op == "prefill" ? chunk : 1;
  if (b < 1 || dim < 1 || heads < 1 || kv_heads < 1 || heads % kv_heads != 0 || head_dim < 2) {
    usage(argv[0], "need positive sizes, H_kv dividing H and an even head dim");
  }
  const double base_rss = attn::bench::max_rss_mib();
  attn::set_num_threads(threads);

  attn::MultiHeadAttentionOptions o;
  o.d_in = dim;
  o.num_heads = heads;
  o.num_kv_heads = kv_heads;
  o.head_dim = head_dim;
  o.causal = true;
  o.out_bias = false;
  o.init = attn::InitScheme::kNone;
  o.rope = attn::RotaryOptions{head_dim, 0, 500000.0, attn::RopeStyle::kHalfSplit, length + t_new};
  attn::MultiHeadAttention<float> mha(o);
  mha.eval();
  if (op != "attend") {  // (attend uses no weights: none filled or packed)
    const float bound = 1.0f / std::sqrt(static_cast<float>(dim));
    fill(mha.in_proj_weight(), 1, bound);
    fill(mha.out_proj().weight(), 2, bound);
    if (!bf16) mha.freeze();  // (the bfloat16 module is frozen instead)
  }
  const std::int64_t weight_bytes =
      4 * ((heads + 2 * kv_heads) * head_dim * dim + dim * heads * head_dim);
  attn::Workspace ws;
  std::vector<double> ms, cpu;
  std::int64_t bytes = 0, cache_bytes = 0, kv_bytes = 0, token_bytes = 0;

  if (op == "gemm") {
    // The Q/K/V projection alone: (B, D) x (frozen ((H + 2 H_kv) hd, D))^T.
    const auto& proj = mha.in_proj_weight();
    attn::Tensor<float, 2> x({b, dim}), y({b, proj.extent(0)});
    fill(x.view(), 3, 1.0f);
    attn::Linear<float> linear(dim, proj.extent(0), /*bias=*/false);
    attn::copy(proj, linear.weight());
    linear.freeze();
    ms = time_calls_cpu([&] { linear.forward(x.view(), y.view(), ws); }, warmup, reps, max_seconds,
                        cpu);
    bytes = 4 * proj.extent(0) * dim;
  } else if (bf16) {
    auto narrow = attn::convert<attn::bfloat16>(mha);
    narrow.freeze();
    cache_options.batch = b, cache_options.num_kv_heads = kv_heads;
    cache_options.head_dim = head_dim, cache_options.capacity = length + t_new;
    cache_options.element = attn::KVElement::kScalar;  // bfloat16 rows
    attn::KVCache<attn::bfloat16> cache(cache_options);
    // The float cache's keys and values (same chunks and seeds), rounded.
    for (attn::Index t0 = 0, c = 0; t0 < length; t0 += 1024, ++c) {
      const attn::Index n = std::min<attn::Index>(1024, length - t0);
      attn::Tensor<float, 4> k({b, kv_heads, n, head_dim}), v({b, kv_heads, n, head_dim});
      fill(k.view(), 4 + 2 * static_cast<std::uint64_t>(c), 1.0f);
      fill(v.view(), 5 + 2 * static_cast<std::uint64_t>(c), 1.0f);
      cache.append(attn::convert<attn::bfloat16>(k.view()).view(),
                   attn::convert<attn::bfloat16>(v.view()).view());
    }
    token_bytes = static_cast<std::int64_t>(cache.bytes_per_token());
    attn::Tensor<float, 3> wide({b, t_new, dim});
    fill(wide.view(), 6, 1.0f);
    const auto x = attn::convert<attn::bfloat16>(wide.view());
    attn::Tensor<attn::bfloat16, 3> y({b, t_new, dim});
    ms = time_calls_cpu(
        [&] {
          narrow.forward(x.view(), y.view(), ws, cache);
          for (attn::Index i = 0; i < b; ++i) cache.truncate(i, length);
        },
        warmup, reps, max_seconds, cpu);
    bytes = weight_bytes / 2 + b * (length + t_new) * token_bytes;
    cache_bytes = static_cast<std::int64_t>(cache.bytes());
    kv_bytes = static_cast<std::int64_t>(cache.payload_bytes());
  } else {
    cache_options.batch = b, cache_options.num_kv_heads = kv_heads;
    cache_options.head_dim = head_dim, cache_options.capacity = length + t_new;
    const bool contiguous = paged == 0 || paired;  // a KVCache is filled
    attn::KVCache<float> cache(contiguous ? cache_options : attn::KVCacheOptions{1, 1, 1, 1});
    attn::PagedKVCacheOptions pool;
    pool.block_size = paged > 0 ? paged : 1;
    pool.num_blocks = b * ((length + t_new + pool.block_size - 1) / pool.block_size);
    if (scatter) pool.num_blocks *= 2;
    pool.num_kv_heads = kv_heads, pool.head_dim = head_dim;
    pool.element = cache_options.element;
    attn::PagedKVCache<float> pages(paged > 0 ? pool : attn::PagedKVCacheOptions{1, 1, 1, 1});
    if (scatter &&
        paged > 0) {  // every block taken by a sequence of its own, then the even ones freed
      attn::Tensor<float, 3> zeros({kv_heads, pool.block_size, head_dim});
      std::vector<attn::Index> fillers;
      for (attn::Index n = 0; n < pool.num_blocks; ++n) {
        fillers.push_back(pages.add_sequence());
        pages.append(fillers.back(), zeros.view(), zeros.view());
      }
      for (const attn::Index f : fillers) {
        if (pages.block_table(f)[0] % 2 == 0) pages.free_sequence(f);
      }
    }
    std::vector<attn::Index> seqs;
    for (attn::Index i = 0; i < (paged > 0 ? b : 0); ++i) seqs.push_back(pages.add_sequence());
    // L random keys and values, appended (quantised) in chunks of up to C tokens (paged:
    // item by item, so the items' blocks interleave in the pool).
    const attn::Index fill_tokens = std::max(1L, fill_chunk);
    for (attn::Index t0 = 0, c = 0; t0 < length; t0 += fill_tokens, ++c) {
      const attn::Index n = std::min<attn::Index>(fill_tokens, length - t0);
      attn::Tensor<float, 4> k({b, kv_heads, n, head_dim}), v({b, kv_heads, n, head_dim});
      fill(k.view(), 4 + 2 * static_cast<std::uint64_t>(c), 1.0f);
      fill(v.view(), 5 + 2 * static_cast<std::uint64_t>(c), 1.0f);
      if (contiguous) cache.append(k.view(), v.view());
      for (attn::Index i = 0; i < static_cast<attn::Index>(seqs.size()); ++i) {
        pages.append(seqs[static_cast<std::size_t>(i)], attn::select(k.view(), 0, i),
                     attn::select(v.view(), 0, i));
      }
    }
    double compact_ms = 0;  // the wall time of compact()
    if (compact && paged > 0) {
      const auto start = std::chrono::steady_clock::now();
      pages.compact();
      compact_ms =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() * 1e3;
    }
    token_bytes =
        static_cast<std::int64_t>(paged > 0 ? pages.bytes_per_token() : cache.bytes_per_token());
    // One timed call: through the pages or the contiguous cache, into out (attend) or y.
    attn::Tensor<float, 4> q({b, heads, 1, head_dim}), out({b, heads, 1, head_dim});
    attn::Tensor<float, 3> x({b, t_new, dim}), y({b, t_new, dim});
    fill(q.view(), 6, 1.0f);
    fill(x.view(), 6, 1.0f);
    const auto step = [&](bool through_pages) {
      if (op == "attend") {
        if (through_pages) {
          attn::paged_attention(q.view(), pages, seqs, out.view(), ws);
        } else {
          attn::cached_attention(q.view(), cache, out.view(), ws);
        }
      } else if (through_pages) {
        mha.forward(x.view(), y.view(), ws, pages, seqs);
        for (const attn::Index s : seqs) pages.truncate(s, length);
      } else {
        mha.forward(x.view(), y.view(), ws, cache);
        for (attn::Index i = 0; i < b; ++i) cache.truncate(i, length);
      }
    };
    if (paired) {
      // Rounds of one step each way, alternated; the output of each way kept to compare bits.
      const float* result = op == "attend" ? out.data() : y.data();
      const auto size = static_cast<std::size_t>(op == "attend" ? out.size() : y.size());
      std::vector<float> outputs[2];
      for (int way = 0; way < 2; ++way) {
        for (long i = 0; i < warmup + 1; ++i) step(way == 1);
        outputs[way].assign(result, result + size);
      }
      std::vector<double> times[2], speed;
      for (long round = 0; round < reps; ++round) {
        double ms_of[2] = {0, 0};
        for (int k = 0; k < 2; ++k) {
          const int way = (k + static_cast<int>(round % 2)) % 2;  // 0: contiguous, 1: paged
          const double start = cpu_ms();
          step(way == 1);
          ms_of[way] = cpu_ms() - start;
          times[way].push_back(ms_of[way]);
        }
        speed.push_back(ms_of[0] / ms_of[1]);
      }
      for (auto* v : {&times[0], &times[1], &speed}) std::sort(v->begin(), v->end());
      const auto quartile = [&](std::size_t k) { return speed[(speed.size() - 1) * k / 4]; };
      const bool same =
          std::memcmp(outputs[0].data(), outputs[1].data(), size * sizeof(float)) == 0;
      // Blocks per run of neighbouring blocks in the items' tables (1: every block alone).
      double blocks = 0, runs = 0;
      for (const attn::Index s : seqs) {
        const std::vector<attn::Index>& table = pages.block_table(s);
        for (std::size_t i = 0; i < table.size(); ++i) {
          blocks += 1, runs += i == 0 || table[i] != table[i - 1] + 1 ? 1 : 0;
        }
      }
      std::printf(
          "impl=attn op=%s B=%ld L=%ld T_new=%ld D=%ld H=%ld H_kv=%ld hd=%ld threads=%d "
          "isa=%s kv_dtype=%s paged=%ld rounds=%ld contiguous_cpu_ms=%.4f paged_cpu_ms=%.4f "
          "paged_speed=%.4f paged_speed_q1=%.4f paged_speed_q3=%.4f same_bits=%d scatter=%d "
          "mean_run=%.1f compact_ms=%.1f\n",
          op.c_str(), static_cast<long>(b), static_cast<long>(length), static_cast<long>(t_new),
          dim, heads, kv_heads, head_dim, threads, attn::isa_name(attn::active_isa()),
          kv_dtype.c_str(), paged, reps, attn::bench::median(times[0]),
          attn::bench::median(times[1]), attn::bench::median(speed), quartile(1), quartile(3),
          same ? 1 : 0, scatter ? 1 : 0, blocks / runs, compact_ms);
      return 0;
    }
    ms = time_calls_cpu([&] { step(paged > 0); }, warmup, reps, max_seconds, cpu);
    bytes = op == "attend" ? b * length * token_bytes
                           : weight_bytes + b * (length + t_new) * token_bytes;
    cache_bytes = static_cast<std::int64_t>(paged > 0 ? pages.bytes() : cache.bytes());
    kv_bytes = paged > 0 ? b * (length + t_new) * token_bytes
                         : static_cast<std::int64_t>(cache.payload_bytes());
  }
  const std::size_t n = ms.size();
  const double median = attn::bench::median(ms);
  std::printf("impl=%s ", bf16 ? "attn_bf16" : "attn");  // (one line with the rest)
  if (bf16) std::printf("bf16_path=%s ", attn::bf16_path_name(attn::bf16_path()));
  std::printf(
      "op=%s B=%ld L=%ld T_new=%ld D=%ld H=%ld H_kv=%ld hd=%ld threads=%d reps=%zu "
      "median_ms=%.4f min_ms=%.4f bytes=%lld gbps=%.3f cache_bytes=%lld kv_bytes=%lld "
      "workspace_bytes=%zu max_rss_mib=%.1f base_rss_mib=%.1f isa=%s kv_dtype=%s "
      "token_bytes=%lld paged=%ld median_cpu_ms=%.4f\n",
      op.c_str(), static_cast<long>(b), static_cast<long>(length), static_cast<long>(t_new), dim,
      heads, kv_heads, head_dim, threads, n, median, ms.front(), static_cast<long long>(bytes),
      static_cast<double>(bytes) / (median * 1e-3) * 1e-9, static_cast<long long>(cache_bytes),
      static_cast<long long>(kv_bytes), ws.bytes(), attn::bench::max_rss_mib(), base_rss,
      attn::isa_name(attn::active_isa()), kv_dtype.c_str(), static_cast<long long>(token_bytes),
      paged, attn::bench::median(cpu));
  return 0;
}
