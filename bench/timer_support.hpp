// SPDX-License-Identifier: MIT
// bench/timer_support.hpp: what the one-line command-line timers (mha_timer, decode_timer)
// share: peak RSS, argument parsing and the timing loop (warm-up calls, then timed calls up
// to a count or a time budget, sorted, and their median).
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace attn::bench {

/// Peak resident set of the process so far, MiB (getrusage's ru_maxrss).
inline double max_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // Linux: KiB
}

/// Prints "<argv0>: <why>" and the usage line `arguments` ("usage: <argv0> <arguments>"),
/// exits with status 2.
[[noreturn]] inline void usage_error(const char* argv0, const std::string& why,
                                     const char* arguments) {
  std::fprintf(stderr, "%s: %s\nusage: %s %s\n", argv0, why.c_str(), argv0, arguments);
  std::exit(2);
}

/// A non-negative integer from the whole of `text`, or usage_error() naming `what`.
inline long parse_count(const char* argv0, const char* text, const char* what,
                        const char* arguments) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < 0) {
    usage_error(argv0, std::string("bad ") + what + " '" + text + "'", arguments);
  }
  return value;
}

/// `warmup` untimed calls of `step`, then up to `reps` timed ones, stopping once
/// `max_seconds` of timed calls have run and at least 3 were timed: the times in ms, sorted.
template <class Step>
std::vector<double> time_calls(Step&& step, long warmup, long reps, double max_seconds) {
  for (long i = 0; i < warmup; ++i) step();
  std::vector<double> ms;
  ms.reserve(static_cast<std::size_t>(std::max(1L, reps)));
  double total = 0;
  for (long i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    step();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ms.push_back(s * 1e3);
    total += s;
    if (total >= max_seconds && ms.size() >= 3) break;
  }
  std::sort(ms.begin(), ms.end());
  return ms;
}

/// The median of sorted, non-empty times.
inline double median_of(const std::vector<double>& sorted) {
  const std::size_t n = sorted.size();
  return n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
}

}  // namespace attn::bench
