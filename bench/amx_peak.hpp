// SPDX-License-Identifier: MIT
// bench/amx_peak.hpp: the tdpbf16ps peak loop, shared by bench/fma_peak (its amx_bf16 lines)
// and bench/gemm_bench (BM_AmxPeak, timed between the GEMMs' repetitions).
#pragma once

// attn/config.hpp first: with GCC 12 it includes <immintrin.h> with the false
// uninitialised-value warnings of its AVX-512 intrinsics silenced.
#include "attn/config.hpp"
// clang-format off
#include <immintrin.h>
// clang-format on

/// FLOPs of one round of amx_peak_rounds(): 6 tdpbf16ps, each 16 x 16 x 32 products and as
/// many additions.
inline constexpr double kAmxRoundFlops = 6.0 * 16 * 16 * 32 * 2;

/// Configures the calling thread's tiles tmm0-7 as 16 rows of 64 bytes each (palette 1), the
/// shape of every tile loop in the benchmarks; _tile_release() gives them back.
__attribute__((target("amx-tile"))) inline void amx_configure_whole_tiles() {
  struct alignas(64) Config {
    unsigned char palette = 1, start_row = 0, reserved[14] = {};
    unsigned short colsb[16] = {};
    unsigned char rows[16] = {};
  } config;
  for (int t = 0; t < 8; ++t) config.colsb[t] = 64, config.rows[t] = 16;
  // GCC 12's _tile_loadconfig declares an 8-byte read: keep the stores above.
  __asm__ volatile("" : : "r"(&config) : "memory");
  _tile_loadconfig(&config);
}

/// `rounds` rounds of tdpbf16ps into 6 independent accumulator tiles (tmm0-5: more than the
/// instruction's latency over its issue interval), A in tmm6 and B in tmm7, two constant
/// 16 x 32 bfloat16 tiles of (0.5, 0.5) and (0.25, -0.25) pairs, so the sums stay put.
/// Configures the calling thread's tiles and releases them after; returns one element of C,
/// so that the loop is kept. Call only where attn::detail::amx_support().usable.
__attribute__((target("amx-tile,amx-bf16"))) inline float amx_peak_rounds(long rounds) {
  amx_configure_whole_tiles();
  alignas(64) unsigned a[16 * 16], b[16 * 16];
  for (int i = 0; i < 256; ++i) a[i] = 0x3F003F00u, b[i] = 0xBE803E80u;
  _tile_loadd(6, a, 64);
  _tile_loadd(7, b, 64);
  for (long i = 0; i < rounds; ++i) {
    _tile_dpbf16ps(0, 6, 7);
    _tile_dpbf16ps(1, 6, 7);
    _tile_dpbf16ps(2, 6, 7);
    _tile_dpbf16ps(3, 6, 7);
    _tile_dpbf16ps(4, 6, 7);
    _tile_dpbf16ps(5, 6, 7);
  }
  alignas(64) float c[16 * 16];
  _tile_stored(0, c, 64);
  _tile_release();
  return c[0];
}
