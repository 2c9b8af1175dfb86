// SPDX-License-Identifier: MIT
// attn/parallel.hpp: the thread count attn uses (OpenMP when compiled with -fopenmp) and the
// one task runner every driver (GEMM, attention forward and backward) runs its tasks on.
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

/// The threads a run of `tasks` tasks uses: num_threads(), but never more than the tasks.
inline int task_threads(Index tasks) {
  return static_cast<int>(std::max<Index>(1, std::min<Index>(num_threads(), tasks)));
}

/// No second phase (run_tasks' default).
struct NoTasks {
  void operator()(Index, int) const noexcept {}
};

/// The one task runner of every driver. Runs body(task, thread) for each task in
/// [0, tasks) on `threads` threads (thread in [0, threads): the index of the calling
/// thread's scratch), handed out one at a time (tasks differ in cost: causal tiles, ragged
/// items); then, in the same parallel region once every task of the first phase is done,
/// after(task, thread) for each task in [0, after_tasks) in the same way (the merges of a
/// split-keys decode step, the query tiles of a backward after its key tiles: one fork per
/// call, not two). Every task of a phase must write what no other task of that
/// phase writes, each in a fixed order of its own: the results then do not depend on the
/// thread count or the schedule. With one thread, or without OpenMP, the tasks run in order
/// on the calling thread. The callers size each thread's scratch before calling (see
/// task_threads()): a task never allocates.
template <class Body, class After = NoTasks>
void run_tasks(int threads, Index tasks, Body&& body, Index after_tasks = 0,
               After&& after = After{}) {
#if ATTN_HAS_OPENMP
  if (threads > 1) {
#pragma omp parallel num_threads(threads)
    {
      const int thread = thread_id();
#pragma omp for schedule(dynamic, 1)
      for (Index task = 0; task < tasks; ++task) body(task, thread);
#pragma omp for schedule(dynamic, 1)
      for (Index task = 0; task < after_tasks; ++task) after(task, thread);
    }
    return;
  }
#endif
  (void)threads;
  for (Index task = 0; task < tasks; ++task) body(task, 0);
  for (Index task = 0; task < after_tasks; ++task) after(task, 0);
}

}  // namespace detail
ATTN_NAMESPACE_END
