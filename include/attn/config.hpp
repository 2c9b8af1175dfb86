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

namespace attn {

/// Signed index for every extent, stride and index; equal to Eigen::Index
/// (std::ptrdiff_t), so views map onto Eigen without casts.
using Index = std::ptrdiff_t;

}  // namespace attn

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
