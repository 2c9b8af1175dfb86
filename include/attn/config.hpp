// SPDX-License-Identifier: MIT
// attn/config.hpp: index type, the overridable ATTN_ASSERT hook and feature switches.
#pragma once

#include <cassert>
#include <cstddef>

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
