// SPDX-License-Identifier: MIT
// attn/isa.hpp: which instruction set attn's kernels use, chosen at run time.
//
// Every hot routine (the GEMM micro-kernel and packing, both attention kernels' inner loops,
// softmax rows, exp) is compiled once per instruction set in its own namespace
// (attn/kernels/), whatever flags the program was built with. The first call to a kernel
// picks the widest set this CPU and its operating system support (or the one ATTN_ISA names),
// caches the choice and every later call uses it. Results are bit-identical for a given set,
// whatever the compile flags and the thread count; different sets round differently (FMA or
// not, vector width), within the documented tolerances.
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "attn/config.hpp"
#include "attn/error.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

/// 1 on x86-64 with GCC or clang: the SSE2, AVX2 and AVX-512 kernel sets are compiled
/// (with per-function target attributes) and chosen at run time. 0 elsewhere: the portable
/// kernels only.
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define ATTN_KERNELS_X86 1
#else
#define ATTN_KERNELS_X86 0
#endif

namespace attn {

/// The kernel sets, narrowest first. Not inside the ABI namespace: every translation unit
/// of a program shares the one choice, whatever flags each was built with.
enum class Isa : int {
  kScalar = 0,  ///< portable C++, no intrinsics (the only set on non-x86 targets)
  kSse2 = 1,    ///< SSE2, which every x86-64 CPU has: 4 floats per register, no FMA
  kAvx2 = 2,    ///< AVX2 + FMA + F16C (Haswell, Zen and later): 8 floats, fused multiply-add
  kAvx512 = 3,  ///< AVX-512 F/BW/DQ/VL (Skylake-X, Zen 4 and later): 16 floats
};

namespace dispatch_v1 {
/// The chosen set as an int, -1 until the first kernel call (or set_isa()) chooses. An
/// inline variable, not a function: all translation units share it, and it holds no code
/// that could depend on their flags.
inline std::atomic<int> selected_isa{-1};
/// Whether bfloat16 GEMMs use AVX512-BF16's dot product where the CPU has it
/// (set_bf16_dot()): -1 the CPU's faster path (the default), 0 never, 1 always. Shared the
/// same way.
inline std::atomic<int> bf16_dot_choice{-1};
}  // namespace dispatch_v1

}  // namespace attn

ATTN_NAMESPACE_BEGIN

/// "scalar", "sse2", "avx2" or "avx512": the names ATTN_ISA accepts.
inline const char* isa_name(Isa isa) noexcept {
  switch (isa) {
    case Isa::kSse2:
      return "sse2";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kScalar:
      break;
  }
  return "scalar";
}

/// The set a name denotes (as isa_name() spells it); false if the name is none of them.
inline bool parse_isa(const char* name, Isa& isa) noexcept {
  for (const Isa candidate : {Isa::kScalar, Isa::kSse2, Isa::kAvx2, Isa::kAvx512}) {
    if (name != nullptr && std::strcmp(name, isa_name(candidate)) == 0) {
      isa = candidate;
      return true;
    }
  }
  return false;
}

namespace detail {

/// Whether the CPU has F16C (the float <-> float16 conversions the avx2 set uses; every CPU
/// with AVX2 has it, but a virtual machine may hide it). CPUID leaf 1, ECX bit 29: clang 14's
/// __builtin_cpu_supports does not know "f16c".
inline bool cpu_has_f16c() noexcept {
#if ATTN_KERNELS_X86
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
#else
  return false;
#endif
}

/// Whether the CPU has AVX512-BF16 (vdpbf16ps): CPUID leaf 7 subleaf 1, EAX bit 5. Read once
/// and cached. Only consulted when the avx512 set runs, whose choice has already checked that
/// the operating system saves the AVX-512 state.
inline bool cpu_has_avx512_bf16() noexcept {
#if ATTN_KERNELS_X86
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0 && (eax & (1u << 5)) != 0;
  }();
  return has;
#else
  return false;
#endif
}

/// Whether AVX512-BF16's dot product beats widening bfloat16 to float on this CPU, as
/// measured on one core: on AMD (Zen 5: vdpbf16ps 383-393 GFLOP/s against 246-256 for fp32
/// FMAs; Zen 4 about 2x per instruction) it does; on Intel Xeons (Emerald Rapids: 87 against
/// 174, bench/results/2026-11-28-bf16-gemm.txt) it runs at half the FMA rate, so widening
/// wins there. Read once and cached.
inline bool cpu_prefers_bf16_dot() noexcept {
#if ATTN_KERNELS_X86
  static const bool amd = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) == 0) return false;
    return ebx == 0x68747541u && edx == 0x69746e65u && ecx == 0x444d4163u;  // "AuthenticAMD"
  }();
  return amd;
#else
  return false;
#endif
}

}  // namespace detail

/// The widest set this CPU supports and its operating system enables (the AVX and
/// AVX-512 register state must be saved on context switches: __builtin_cpu_supports
/// checks XCR0 as well as CPUID).
inline Isa best_isa() noexcept {
#if ATTN_KERNELS_X86
  __builtin_cpu_init();
  const bool avx2 =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && detail::cpu_has_f16c();
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    return Isa::kAvx512;
  }
  if (avx2) return Isa::kAvx2;
  return Isa::kSse2;
#else
  return Isa::kScalar;
#endif
}

/// Forces the kernels to `isa`, clamped to best_isa() (a wider set than the CPU has is
/// never used), and returns the set now in use. Affects every thread and every
/// translation unit; call it while no attn computation is running.
inline Isa set_isa(Isa isa) noexcept {
  const Isa best = best_isa();
  const Isa chosen = static_cast<int>(isa) < static_cast<int>(best) ? isa : best;
  dispatch_v1::selected_isa.store(static_cast<int>(chosen), std::memory_order_relaxed);
  return chosen;
}

/// The kernel set in use. The first call chooses it: the set the environment variable
/// ATTN_ISA names (scalar, sse2, avx2 or avx512), clamped to best_isa(), or best_isa() when
/// ATTN_ISA is unset or empty.
/// @throws ConfigError if ATTN_ISA is set to anything else (on that first call).
inline Isa active_isa() {
  const int selected = dispatch_v1::selected_isa.load(std::memory_order_relaxed);
  if (selected >= 0) return static_cast<Isa>(selected);
  Isa isa = best_isa();
  const char* env = std::getenv("ATTN_ISA");
  if (env != nullptr && *env != '\0') {
    detail::require_config(parse_isa(env, isa), "ATTN_ISA", [&] {
      return "ATTN_ISA='" + std::string(env) + "' is not one of scalar, sse2, avx2, avx512";
    });
  }
  return set_isa(isa);
}

/// Whether GEMMs on bfloat16 operands run on AVX512-BF16's dot product (vdpbf16ps, two
/// products per lane and instruction) now: the avx512 set is active, the CPU has AVX512-BF16,
/// and set_bf16_dot() asked for it or, by default, the dot product is this CPU's faster path
/// (AMD: yes; Intel: no, see detail::cpu_prefers_bf16_dot()). Otherwise they widen the
/// operands to float and run the float kernels. The two paths round differently
/// (docs/precision.md).
/// @throws ConfigError as active_isa() does.
inline bool bf16_dot_active() {
  if (active_isa() != Isa::kAvx512 || !detail::cpu_has_avx512_bf16()) return false;
  const int choice = dispatch_v1::bf16_dot_choice.load(std::memory_order_relaxed);
  return choice < 0 ? detail::cpu_prefers_bf16_dot() : choice != 0;
}

/// Uses (true) or avoids (false) the bfloat16 dot product where the CPU has it, e.g. to test
/// both paths on one CPU; std::nullopt restores the default, the CPU's faster path. Returns
/// bf16_dot_active(). Affects every thread and every translation unit; call it while no attn
/// computation is running.
inline bool set_bf16_dot(std::optional<bool> use) {
  dispatch_v1::bf16_dot_choice.store(use.has_value() ? (*use ? 1 : 0) : -1,
                                     std::memory_order_relaxed);
  return bf16_dot_active();
}

ATTN_NAMESPACE_END
