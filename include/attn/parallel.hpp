// SPDX-License-Identifier: MIT
// attn/parallel.hpp: the thread count attn uses (OpenMP when compiled with -fopenmp).
#pragma once

#include <algorithm>

#include "attn/config.hpp"

#if ATTN_HAS_OPENMP
#include <omp.h>
#endif

ATTN_NAMESPACE_BEGIN

/// Sets the number of threads attn's kernels and projections use: OpenMP's count for the
/// calling thread (omp_set_num_threads). Without OpenMP this is a no-op and attn runs on one
/// thread. The default is OpenMP's (OMP_NUM_THREADS, else the core count).
///
/// attn computes nothing through Eigen, so Eigen's own thread count does not affect attn's
/// results; products a user writes with Eigen follow this count too unless
/// Eigen::setNbThreads() was called (Eigen then uses its own setting instead of OpenMP's).
inline void set_num_threads(int n) {
  n = std::max(n, 1);
#if ATTN_HAS_OPENMP
  omp_set_num_threads(n);
#endif
}

/// The number of threads a parallel region started now would use (1 without OpenMP).
inline int num_threads() {
#if ATTN_HAS_OPENMP
  return omp_in_parallel() ? 1 : omp_get_max_threads();
#else
  return 1;
#endif
}

namespace detail {

inline int thread_id() {
#if ATTN_HAS_OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

}  // namespace detail
ATTN_NAMESPACE_END
