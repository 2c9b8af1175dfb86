// SPDX-License-Identifier: MIT
// bench/fma_loop.hpp: the float32 FMA peak loop on zmm registers, shared by bench/fma_peak (its
// avx512 lines) and bench/gemm_bench (BM_FmaPeak, timed between the float GEMMs' repetitions).
#pragma once

// attn/config.hpp first: with GCC 12 it includes <immintrin.h> with the false
// uninitialised-value warnings of its AVX-512 intrinsics silenced.
#include "attn/config.hpp"
// clang-format off
#include <immintrin.h>
// clang-format on

/// Independent chains per loop: 24 zmm (of 32 registers), leaving room for the multiplier and
/// addend; more than FMA latency x FMA pipes on any current x86 core (8 on Zen 4/5 and
/// Skylake-X), so the loop is throughput-bound.
inline constexpr int kFmaChains512 = 24;
/// FMA rounds per outer iteration.
inline constexpr long kFmaInner = 64;
/// FLOPs of one outer iteration of fma_loop_avx512(): every chain, kFmaInner times, 16 lanes,
/// 2 FLOPs per FMA.
inline constexpr double kFmaOuterFlops512 = kFmaChains512 * static_cast<double>(kFmaInner) * 32;

/// m slightly below 1 and c small: the chains converge to c / (1 - m) and never overflow or
/// go denormal, so every FMA takes its normal latency.
inline constexpr float kFmaMul = 0.999999f;
inline constexpr float kFmaAdd = 1e-6f;

/// The sum of every lane of the kFmaChains512 chains (keeps them alive). Stored and added: GCC
/// 12's _mm512_reduce_add_ps trips -Wuninitialized.
__attribute__((target("avx512f"))) inline float sum_chains512(const __m512* acc) {
  __m512 sum = acc[0];
  for (int j = 1; j < kFmaChains512; ++j) sum = _mm512_add_ps(sum, acc[j]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  float total = 0;
  for (const float x : lanes) total += x;
  return total;
}

/// `outer` iterations of the chains acc = acc * m + c (kFmaOuterFlops512 FLOPs each); returns
/// their sum, so that the loop is kept. Call only where the CPU has AVX-512F.
__attribute__((target("avx512f"))) inline float fma_loop_avx512(long outer) {
  __m512 acc[kFmaChains512];
  for (int j = 0; j < kFmaChains512; ++j)
    acc[j] = _mm512_set1_ps(1.0f + 0.001f * static_cast<float>(j));
  const __m512 m = _mm512_set1_ps(kFmaMul), c = _mm512_set1_ps(kFmaAdd);
  for (long i = 0; i < outer; ++i) {
    for (long r = 0; r < kFmaInner; ++r) {
#pragma GCC unroll 32
      for (int j = 0; j < kFmaChains512; ++j) acc[j] = _mm512_fmadd_ps(acc[j], m, c);
    }
  }
  return sum_chains512(acc);
}
