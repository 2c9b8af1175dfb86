// SPDX-License-Identifier: MIT
// attn/kernels/target.hpp: the target regions each kernel set is compiled in.
//
// ATTN_TARGET_<SET>_BEGIN ... ATTN_TARGET_END wraps one kernel set's namespace. Every
// function defined between them (templates and lambdas included) is compiled for that
// instruction set whatever flags the translation unit has: `#pragma GCC target` on GCC,
// `#pragma clang attribute push(target)` on clang. The region also turns off the
// compiler's own fusing of a * b + c into an FMA (GCC's -ffp-contract=fast default, clang's
// "on"): the kernels fuse exactly where they call Vec::fmadd, so a set computes the same bits
// in a translation unit built with -march=native (where FMA is available everywhere) as in
// one built for baseline x86-64. Only headers that include everything they need *before*
// the region may open one: a standard header first read inside a region would compile its
// inline functions for that set, and the linker could hand them to baseline code.
#pragma once

#include "attn/config.hpp"
#include "attn/isa.hpp"

#if ATTN_KERNELS_X86 && defined(__clang__)
#define ATTN_TARGET_BEGIN_(features)                                           \
  _Pragma(ATTN_PP_STR_(clang attribute push(__attribute__((target(features))), \
                                            apply_to = function))) _Pragma("STDC FP_CONTRACT OFF")
#define ATTN_TARGET_END _Pragma("STDC FP_CONTRACT DEFAULT") _Pragma("clang attribute pop")
#define ATTN_TARGET_PLAIN_BEGIN _Pragma("STDC FP_CONTRACT OFF")
#define ATTN_TARGET_PLAIN_END _Pragma("STDC FP_CONTRACT DEFAULT")
#elif ATTN_KERNELS_X86
#define ATTN_TARGET_BEGIN_(features)                                      \
  _Pragma("GCC push_options") _Pragma(ATTN_PP_STR_(GCC target(features))) \
      _Pragma("GCC optimize(\"fp-contract=off\")")
#define ATTN_TARGET_END _Pragma("GCC pop_options")
#define ATTN_TARGET_PLAIN_BEGIN \
  _Pragma("GCC push_options") _Pragma("GCC optimize(\"fp-contract=off\")")
#define ATTN_TARGET_PLAIN_END _Pragma("GCC pop_options")
#endif
#define ATTN_PP_STR_(...) #__VA_ARGS__

#if ATTN_KERNELS_X86
/// The portable set, without intrinsics, and without contraction (see above).
#define ATTN_TARGET_SCALAR_BEGIN ATTN_TARGET_PLAIN_BEGIN
#define ATTN_TARGET_SCALAR_END ATTN_TARGET_PLAIN_END
#define ATTN_TARGET_SSE2_BEGIN ATTN_TARGET_BEGIN_("sse2")
#define ATTN_TARGET_AVX2_BEGIN ATTN_TARGET_BEGIN_("avx2,fma,f16c")
/// The avx2 set's int8 dot products on AVX-VNNI (attn/kernels/avx2/int8_vnni.inl), run only
/// where the CPU has it (detail::cpu_has_avx_vnni()).
#define ATTN_TARGET_AVX2VNNI_BEGIN ATTN_TARGET_BEGIN_("avx2,fma,f16c,avxvnni")
#define ATTN_TARGET_AVX512_BEGIN \
  ATTN_TARGET_BEGIN_("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")
/// The avx512 set's bfloat16 dot-product kernel (attn/kernels/avx512/bf16_dot.inl): AVX-512 plus
/// AVX512-BF16, run only where the CPU has it (detail::cpu_has_avx512_bf16()).
#define ATTN_TARGET_AVX512BF16_BEGIN \
  ATTN_TARGET_BEGIN_("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,f16c")
/// The avx512 set's int8 dot products (attn/kernels/avx512/int8_dot.inl): AVX-512 plus
/// AVX512-VNNI, run only where the CPU has it (detail::cpu_has_avx512_vnni()).
#define ATTN_TARGET_AVX512VNNI_BEGIN \
  ATTN_TARGET_BEGIN_("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")
/// The avx512 set's bfloat16 AMX kernel (attn/kernels/avx512/amx_bf16.inl): AVX-512 plus AMX-TILE
/// and AMX-BF16, run only where the operating system granted the tile state
/// (detail::amx_support()), and AVX512-BF16 (every CPU with AMX-BF16 has it), for the
/// attention's passes that the dot-product path (CPUs with AVX512-BF16) shares.
#define ATTN_TARGET_AVX512AMX_BEGIN \
  ATTN_TARGET_BEGIN_(               \
      "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,amx-tile,amx-bf16,avx2,fma,f16c")
#else
// Other targets: the portable set only, compiled with the program's own flags.
#define ATTN_TARGET_SCALAR_BEGIN
#define ATTN_TARGET_SCALAR_END
#endif
