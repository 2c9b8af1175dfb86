// SPDX-License-Identifier: MIT
// attn/parallel.hpp: the thread count attn uses (OpenMP when compiled with -fopenmp).
#pragma once

#include <algorithm>

#include "attn/detail/eigen_core.hpp"

#include "attn/config.hpp"

#if ATTN_HAS_OPENMP
#include <omp.h>
#endif

namespace attn {

/// Sets the number of threads attn's kernels and projections use (and Eigen's, so
/// products called through Eigen follow). Without OpenMP this is a no-op and attn runs
/// on one thread. The default is OpenMP's (OMP_NUM_THREADS, else the core count).
inline void set_num_threads(int n) {
  n = std::max(n, 1);
#if ATTN_HAS_OPENMP
  omp_set_num_threads(n);
#endif
  Eigen::setNbThreads(n);
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
}  // namespace attn
