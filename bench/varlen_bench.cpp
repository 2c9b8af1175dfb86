// SPDX-License-Identifier: MIT
// bench/varlen_bench.cpp: a packed batch of variable-length sequences (attn/attention/
// varlen.hpp) against the same batch padded to its longest sequence with a key padding mask,
// in one binary: the attention alone (scaled_dot_product_attention_varlen vs
// scaled_dot_product_attention) and the whole MultiHeadAttention forward (packed rows vs a
// padded (B, T, D) batch). Causal self-attention, float32, warm workspaces.
// Glossary: N = sequences, T = the longest, H = heads, hd = head dim, D = H * hd.
//
// The batch: N = 8 sequences of 64, 128, 256, 512, 768, 1024, 1536 and 2048 tokens (6336
// rows), padded to 8 x 2048 = 16384 rows. Each padded row is a real row of the attention's
// work (a padded query still runs over its item's keys; the mask hides the padded keys
// element by element). BM_*_KeyLengths pads the same way but bounds each item's keys with
// AttentionMask::key_lengths (a loop bound), the best a padded batch can do.
//
// Run (the ratio packed / padded is the figure; medians of 5):
//   build/bench/bench/varlen_bench --benchmark_repetitions=5
//   --benchmark_report_aggregates_only=true

#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "attn/attn.hpp"
#include "bench_support.hpp"

namespace {

using attn::Index;

const std::vector<Index> kLengths = {64, 128, 256, 512, 768, 1024, 1536, 2048};
constexpr Index kLongest = 2048, kHeads = 8, kHeadDim = 64, kModel = kHeads * kHeadDim;

Index total_rows() {
  Index total = 0;
  for (const Index l : kLengths) total += l;
  return total;
}
Index items() { return static_cast<Index>(kLengths.size()); }

/// The padded batch's key padding mask (B, T): true past each item's length.
attn::Tensor<bool, 2> key_padding() {
  attn::Tensor<bool, 2> pad({items(), kLongest});
  for (Index b = 0; b < items(); ++b) {
    for (Index j = 0; j < kLongest; ++j) pad(b, j) = j >= kLengths[static_cast<std::size_t>(b)];
  }
  return pad;
}

/// Packed q, k, v (total, H, hd): stored so (FlashAttention's layout, `head_major` false),
/// or stored (H, total, hd) and passed as a permuted view (each head's rows back to back, as
/// MultiHeadAttention's projections write them).
void sdpa_packed(benchmark::State& state, bool head_major) {
  const Index total = total_rows();
  const auto make = [&](std::uint64_t seed) {
    return head_major ? attn::bench::random_tensor<float, 3>({kHeads, total, kHeadDim}, seed)
                      : attn::bench::random_tensor<float, 3>({total, kHeads, kHeadDim}, seed);
  };
  const auto packed = [&](const attn::Tensor<float, 3>& x) {
    return head_major ? attn::permute(x.view(), {1, 0, 2}) : x.view();
  };
  const auto q = make(1), k = make(2), v = make(3);
  attn::Tensor<float, 3> out({total, kHeads, kHeadDim});
  const attn::SequenceOffsets cu = attn::SequenceOffsets::from_lengths(kLengths);
  const auto mask = attn::AttentionMask<float>().causal();
  attn::Workspace ws;
  for (auto _ : state) {
    attn::scaled_dot_product_attention_varlen<float>(packed(q), packed(k), packed(v), cu, cu,
                                                     out.view(), ws, mask);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["rows"] = static_cast<double>(total);
}
void BM_Sdpa_Packed(benchmark::State& state) { sdpa_packed(state, false); }
void BM_Sdpa_Packed_HeadMajor(benchmark::State& state) { sdpa_packed(state, true); }

/// The padded batch's causal mask: the items' key lengths, or the padding mask `pad`.
attn::AttentionMask<float> padded_mask(const attn::Tensor<bool, 2>& pad, bool lengths) {
  auto mask = attn::AttentionMask<float>().causal();
  if (lengths) return mask.key_lengths(kLengths);
  return mask.key_padding(pad);
}

void sdpa_padded(benchmark::State& state, bool lengths) {
  const attn::Shape<4> shape{items(), kHeads, kLongest, kHeadDim};
  const auto q = attn::bench::random_tensor<float, 4>(shape, 1);
  const auto k = attn::bench::random_tensor<float, 4>(shape, 2);
  const auto v = attn::bench::random_tensor<float, 4>(shape, 3);
  attn::Tensor<float, 4> out(shape);
  const attn::Tensor<bool, 2> pad = key_padding();
  const auto mask = padded_mask(pad, lengths);
  attn::Workspace ws;
  for (auto _ : state) {
    attn::scaled_dot_product_attention<float>(q.view(), k.view(), v.view(), out.view(), ws, mask);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["rows"] = static_cast<double>(items() * kLongest);
}
void BM_Sdpa_Padded(benchmark::State& state) { sdpa_padded(state, false); }
void BM_Sdpa_Padded_KeyLengths(benchmark::State& state) { sdpa_padded(state, true); }

void BM_Mha_Packed(benchmark::State& state) {
  const Index total = total_rows();
  const auto mha = attn::bench::make_mha<float>(kModel, kHeads);
  const auto x = attn::bench::random_tensor<float, 2>({total, kModel}, 4);
  attn::Tensor<float, 2> out({total, kModel});
  const attn::SequenceOffsets cu = attn::SequenceOffsets::from_lengths(kLengths);
  const auto mask = attn::AttentionMask<float>().causal();
  attn::Workspace ws;
  for (auto _ : state) {
    mha.forward(x.view(), x.view(), x.view(), cu, out.view(), ws, mask);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["rows"] = static_cast<double>(total);
}

void mha_padded(benchmark::State& state, bool lengths) {
  const auto mha = attn::bench::make_mha<float>(kModel, kHeads);
  const auto x = attn::bench::random_tensor<float, 3>({items(), kLongest, kModel}, 4);
  attn::Tensor<float, 3> out({items(), kLongest, kModel});
  const attn::Tensor<bool, 2> pad = key_padding();
  const auto mask = padded_mask(pad, lengths);
  attn::Workspace ws;
  for (auto _ : state) {
    mha.forward(x.view(), x.view(), x.view(), out.view(), ws, mask);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["rows"] = static_cast<double>(items() * kLongest);
}
void BM_Mha_Padded(benchmark::State& state) { mha_padded(state, false); }
void BM_Mha_Padded_KeyLengths(benchmark::State& state) { mha_padded(state, true); }

BENCHMARK(BM_Sdpa_Packed)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Sdpa_Packed_HeadMajor)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Sdpa_Padded)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Sdpa_Padded_KeyLengths)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Mha_Packed)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Mha_Padded)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Mha_Padded_KeyLengths)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

#include "gbench_main.hpp"  // main(): prints the kernel set in use
