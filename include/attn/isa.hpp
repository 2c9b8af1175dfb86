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

#include <algorithm>
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
#if defined(__linux__) && (defined(__x86_64__) || defined(__i386__))
#include <sys/syscall.h>
#include <unistd.h>
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

/// How GEMMs on bfloat16 operands (float accumulation) multiply, on the avx512 set: each path
/// rounds differently (docs/precision.md).
enum class Bf16Path : int {
  kWiden = 0,  ///< widen the operands to float and run the float kernels (every set)
  kDot = 1,    ///< AVX512-BF16's vdpbf16ps: two products per float lane and instruction
  kAmx = 2,    ///< AMX-BF16's tdpbf16ps on 16 x 16 float tiles (Sapphire Rapids and later)
};

namespace dispatch_v1 {
/// The chosen set as an int, -1 until the first kernel call (or set_isa()) chooses. An
/// inline variable, not a function: all translation units share it, and it holds no code
/// that could depend on their flags.
inline std::atomic<int> selected_isa{-1};
/// The path set_bf16_path() forced for bfloat16 GEMMs, as an int (Bf16Path), or -1: the
/// CPU's fastest (the default). Shared the same way.
inline std::atomic<int> bf16_path_choice{-1};
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

/// Whether the CPU has AVX512-VNNI (vpdpbusd on zmm): CPUID leaf 7 subleaf 0, ECX bit 11. Read
/// once and cached; consulted only when the avx512 set runs.
inline bool cpu_has_avx512_vnni() noexcept {
#if ATTN_KERNELS_X86
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 11)) != 0;
  }();
  return has;
#else
  return false;
#endif
}

/// Whether the CPU has AVX-VNNI (vpdpbusd on ymm, VEX-encoded): CPUID leaf 7 subleaf 1, EAX
/// bit 4. Read once and cached; consulted only when the avx2 set runs, whose choice has already
/// checked that the operating system saves the AVX state.
inline bool cpu_has_avx_vnni() noexcept {
#if ATTN_KERNELS_X86
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0 && (eax & (1u << 4)) != 0;
  }();
  return has;
#else
  return false;
#endif
}

/// Whether AMX-BF16 can run in this process, and if not, why. Read once and cached (a static
/// local: thread-safe); the permission it asks for is process-wide.
struct AmxSupport {
  bool usable = false;
  const char* reason = "";  ///< empty when usable
};

/// The AMX tile and bfloat16 instructions: the CPU has them (CPUID leaf 7 subleaf 0, EDX bits
/// 24 AMX-TILE and 22 AMX-BF16), the operating system saves their state (XCR0 bits 17 and 18,
/// read with xgetbv once CPUID leaf 1 reports OSXSAVE) and, on Linux, grants this process the
/// tile data state: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), asked once (without
/// it the first tile instruction raises SIGILL). Any "no" leaves AMX unused.
inline const AmxSupport& amx_support() noexcept {
  static const AmxSupport support = []() noexcept {
    AmxSupport s;
#if ATTN_KERNELS_X86
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0 || (edx & (1u << 24)) == 0 ||
        (edx & (1u << 22)) == 0) {
      s.reason = "the CPU has no AMX-BF16";
      return s;
    }
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & (1u << 27)) == 0) {
      s.reason = "the operating system does not enable XSAVE";
      return s;
    }
    unsigned xcr0_low = 0, xcr0_high = 0;
    __asm__ volatile("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
    if ((xcr0_low & (3u << 17)) != (3u << 17)) {
      s.reason = "the operating system does not save the AMX tile state (XCR0 bits 17-18)";
      return s;
    }
#if defined(__linux__)
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
      s.reason = "Linux refused the AMX tile data state (arch_prctl ARCH_REQ_XCOMP_PERM)";
      return s;
    }
#endif
    s.usable = true;
#else
    s.reason = "not an x86 build with GCC or clang";
#endif
    return s;
  }();
  return support;
}

/// Whether the CPU is AMD's (CPUID vendor "AuthenticAMD"). Read once and cached.
inline bool cpu_is_amd() noexcept {
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

/// Whether AVX512-BF16's dot product beats widening bfloat16 to float on this CPU, as
/// measured on one core: on AMD (Zen 5: vdpbf16ps 383-393 GFLOP/s against 246-256 for fp32
/// FMAs; Zen 4 about 2x per instruction) it does; on Intel Xeons (Emerald Rapids: 87 against
/// 174, bench/results/2026-11-28-bf16-gemm.txt) it runs at half the FMA rate, so widening
/// wins there.
inline bool cpu_prefers_bf16_dot() noexcept { return cpu_is_amd(); }

/// The size in bytes of the level-2 cache one core uses (its data or unified cache), as the
/// CPU reports it: CPUID's deterministic cache parameters (leaf 4 on Intel, 0x8000001D on
/// AMD: ways x partitions x line size x sets), else sysconf(_SC_LEVEL2_CACHE_SIZE); 0 when
/// neither says. Read once and cached.
inline long cpu_l2_bytes() noexcept {
  static const long bytes = [] {
    long found = 0;
#if ATTN_KERNELS_X86
    const unsigned leaf = cpu_is_amd() ? 0x8000001Du : 4u;
    for (unsigned sub = 0; sub < 16 && found == 0; ++sub) {
      unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
      if (__get_cpuid_count(leaf, sub, &eax, &ebx, &ecx, &edx) == 0) break;
      const unsigned type = eax & 0x1fu, level = (eax >> 5) & 0x7u;
      if (type == 0) break;  // no more caches
      if (level == 2 && (type == 1 || type == 3)) {
        found = static_cast<long>((ebx >> 22) + 1) * static_cast<long>(((ebx >> 12) & 0x3ffu) + 1) *
                static_cast<long>((ebx & 0xfffu) + 1) * (static_cast<long>(ecx) + 1);
      }
    }
#endif
#if defined(__linux__) && defined(_SC_LEVEL2_CACHE_SIZE)
    if (found <= 0) found = std::max(0L, sysconf(_SC_LEVEL2_CACHE_SIZE));
#endif
    return found;
  }();
  return bytes;
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

/// "widen", "dot" or "amx".
inline const char* bf16_path_name(Bf16Path path) noexcept {
  switch (path) {
    case Bf16Path::kDot:
      return "dot";
    case Bf16Path::kAmx:
      return "amx";
    case Bf16Path::kWiden:
      break;
  }
  return "widen";
}

/// Whether `path` can run now: widening always; the dot product and AMX on the avx512 set
/// only, where the CPU has AVX512-BF16 (detail::cpu_has_avx512_bf16()), respectively AMX-BF16
/// enabled for this process (detail::amx_support()).
/// @throws ConfigError as active_isa() does.
inline bool bf16_path_available(Bf16Path path) {
  if (path == Bf16Path::kWiden) return true;
  if (active_isa() != Isa::kAvx512) return false;
  return path == Bf16Path::kDot ? detail::cpu_has_avx512_bf16() : detail::amx_support().usable;
}

/// The path GEMMs on bfloat16 operands take now: the one set_bf16_path() forced if it can run
/// (widening if not), else the default, the CPU's fastest: AMX where it can run (one core of
/// an Emerald Rapids Xeon: tdpbf16ps 6-10x the float FMA rate), else the dot product where it
/// beats widening (AMD; see detail::cpu_prefers_bf16_dot()), else widening. The paths round
/// differently (docs/precision.md).
/// @throws ConfigError as active_isa() does.
inline Bf16Path bf16_path() {
  const int choice = dispatch_v1::bf16_path_choice.load(std::memory_order_relaxed);
  if (choice >= 0) {
    const auto forced = static_cast<Bf16Path>(choice);
    return bf16_path_available(forced) ? forced : Bf16Path::kWiden;
  }
  if (bf16_path_available(Bf16Path::kAmx)) return Bf16Path::kAmx;
  if (bf16_path_available(Bf16Path::kDot) && detail::cpu_prefers_bf16_dot()) return Bf16Path::kDot;
  return Bf16Path::kWiden;
}

/// Forces bfloat16 GEMMs onto `path` where it can run (bf16_path_available(); widening where
/// not), e.g. to test every path on one CPU; std::nullopt restores the default, the CPU's
/// fastest. Returns bf16_path(). Affects every thread and every translation unit; call it while
/// no attn computation is running.
inline Bf16Path set_bf16_path(std::optional<Bf16Path> path) {
  dispatch_v1::bf16_path_choice.store(path.has_value() ? static_cast<int>(*path) : -1,
                                      std::memory_order_relaxed);
  return bf16_path();
}

ATTN_NAMESPACE_END
