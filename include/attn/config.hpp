// SPDX-License-Identifier: MIT
// attn/config.hpp: index type, the overridable ATTN_ASSERT hook and feature switches.
#pragma once

#include <cassert>
#include <cstddef>

// GCC 12's AVX-512 intrinsics declare their "undefined" pass-through operand as
// `__m512 __Y = __Y;`, which sets off -Wuninitialized / -Wmaybe-uninitialized wherever an
// intrinsic is inlined (in Eigen's AVX-512 kernels as in attn's; fixed in GCC 13). The
// warnings are reported at the intrinsic headers' own lines, so including <immintrin.h>
// here, first, with those warnings off for the headers' text, silences exactly these false
// positives and nothing else. attn's headers include this one before Eigen; a program that includes
// Eigen before attn gets Eigen's warnings as it would without attn.
#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

// ---- the ABI tag: everything attn defines lives in attn::ATTN_ABI_TAG (an inline namespace)
//
// attn is header-only, so each translation unit compiles its own copy of every function
// with its own flags. Two translation units built with different instruction-set flags
// (say one with -march=native and one without) would otherwise define the same inline
// functions with different machine code, and the linker would keep one of them for both:
// the baseline one would then run AVX-512 code on a CPU without it. The tag names the
// flags, one digit per x86 extension the compiler was told it may use (SSE3, SSSE3, SSE4.1,
// SSE4.2, POPCNT, AVX, AVX2, FMA, F16C, BMI, BMI2, LZCNT, MOVBE, AVX512F/CD/BW/DQ/VL) and
// whether OpenMP is on, so such translation units never share a symbol. Users never write
// the tag: attn::X finds attn::<tag>::X. The kernels a program runs do not depend on the tag
// (see attn/isa.hpp): each kernel set is compiled for its own instruction set.
#define ATTN_PP_CAT_(a, b) a##b
#define ATTN_PP_CAT(a, b) ATTN_PP_CAT_(a, b)
#if defined(__x86_64__) || defined(__i386__)
#define ATTN_ABI_X86_(name) ATTN_PP_CAT(ATTN_PP_CAT(name, ATTN_ABI_D1_), ATTN_ABI_D2_)
#if defined(__SSE3__)
#define ATTN_ABI_SSE3_ 1
#else
#define ATTN_ABI_SSE3_ 0
#endif
#if defined(__SSSE3__)
#define ATTN_ABI_SSSE3_ 1
#else
#define ATTN_ABI_SSSE3_ 0
#endif
#if defined(__SSE4_1__)
#define ATTN_ABI_SSE41_ 1
#else
#define ATTN_ABI_SSE41_ 0
#endif
#if defined(__SSE4_2__)
#define ATTN_ABI_SSE42_ 1
#else
#define ATTN_ABI_SSE42_ 0
#endif
#if defined(__POPCNT__)
#define ATTN_ABI_POPCNT_ 1
#else
#define ATTN_ABI_POPCNT_ 0
#endif
#if defined(__AVX__)
#define ATTN_ABI_AVX_ 1
#else
#define ATTN_ABI_AVX_ 0
#endif
#if defined(__AVX2__)
#define ATTN_ABI_AVX2_ 1
#else
#define ATTN_ABI_AVX2_ 0
#endif
#if defined(__FMA__)
#define ATTN_ABI_FMA_ 1
#else
#define ATTN_ABI_FMA_ 0
#endif
#if defined(__F16C__)
#define ATTN_ABI_F16C_ 1
#else
#define ATTN_ABI_F16C_ 0
#endif
#if defined(__BMI__)
#define ATTN_ABI_BMI_ 1
#else
#define ATTN_ABI_BMI_ 0
#endif
#if defined(__BMI2__)
#define ATTN_ABI_BMI2_ 1
#else
#define ATTN_ABI_BMI2_ 0
#endif
#if defined(__LZCNT__)
#define ATTN_ABI_LZCNT_ 1
#else
#define ATTN_ABI_LZCNT_ 0
#endif
#if defined(__MOVBE__)
#define ATTN_ABI_MOVBE_ 1
#else
#define ATTN_ABI_MOVBE_ 0
#endif
#if defined(__AVX512F__)
#define ATTN_ABI_AVX512F_ 1
#else
#define ATTN_ABI_AVX512F_ 0
#endif
#if defined(__AVX512CD__)
#define ATTN_ABI_AVX512CD_ 1
#else
#define ATTN_ABI_AVX512CD_ 0
#endif
#if defined(__AVX512BW__)
#define ATTN_ABI_AVX512BW_ 1
#else
#define ATTN_ABI_AVX512BW_ 0
#endif
#if defined(__AVX512DQ__)
#define ATTN_ABI_AVX512DQ_ 1
#else
#define ATTN_ABI_AVX512DQ_ 0
#endif
#if defined(__AVX512VL__)
#define ATTN_ABI_AVX512VL_ 1
#else
#define ATTN_ABI_AVX512VL_ 0
#endif
#define ATTN_ABI_DIGITS9_(a, b, c, d, e, f, g, h, i) a##b##c##d##e##f##g##h##i
#define ATTN_ABI_DIGITS9(...) ATTN_ABI_DIGITS9_(__VA_ARGS__)
#define ATTN_ABI_D1_                                                                  \
  ATTN_ABI_DIGITS9(ATTN_ABI_SSE3_, ATTN_ABI_SSSE3_, ATTN_ABI_SSE41_, ATTN_ABI_SSE42_, \
                   ATTN_ABI_POPCNT_, ATTN_ABI_AVX_, ATTN_ABI_AVX2_, ATTN_ABI_FMA_, ATTN_ABI_F16C_)
#define ATTN_ABI_D2_                                                                              \
  ATTN_ABI_DIGITS9(ATTN_ABI_BMI_, ATTN_ABI_BMI2_, ATTN_ABI_LZCNT_, ATTN_ABI_MOVBE_,               \
                   ATTN_ABI_AVX512F_, ATTN_ABI_AVX512CD_, ATTN_ABI_AVX512BW_, ATTN_ABI_AVX512DQ_, \
                   ATTN_ABI_AVX512VL_)
#define ATTN_ABI_ISA_ ATTN_ABI_X86_(x86_)
#else
#define ATTN_ABI_ISA_ generic
#endif
#if defined(_OPENMP)
#define ATTN_ABI_THREADS_ _omp
#else
#define ATTN_ABI_THREADS_ _seq
#endif
/// The inline namespace of this translation unit's flags, e.g. abi1_x86_000000000000000000_omp
/// for plain x86-64 with -fopenmp ("abi1": attn's ABI revision).
#define ATTN_ABI_TAG ATTN_PP_CAT(ATTN_PP_CAT(abi1_, ATTN_ABI_ISA_), ATTN_ABI_THREADS_)
#define ATTN_NAMESPACE_BEGIN \
  namespace attn {           \
  inline namespace ATTN_ABI_TAG {
#define ATTN_NAMESPACE_END \
  }                        \
  }

ATTN_NAMESPACE_BEGIN

/// Signed index for every extent, stride and index; equal to Eigen::Index
/// (std::ptrdiff_t), so views map onto Eigen without casts.
using Index = std::ptrdiff_t;

ATTN_NAMESPACE_END

/// Internal invariant and unchecked-access check. Defaults to assert() (compiled out
/// under NDEBUG); define ATTN_ASSERT before including attn to override it.
#ifndef ATTN_ASSERT
#define ATTN_ASSERT(condition) assert(condition)
#endif

/// 1 when compiled with OpenMP (-fopenmp), else 0. Threads are then used inside the
/// attention kernel and the projections; without OpenMP everything runs on one thread.
#if defined(_OPENMP)
#define ATTN_HAS_OPENMP 1
#else
#define ATTN_HAS_OPENMP 0
#endif
