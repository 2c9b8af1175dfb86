// SPDX-License-Identifier: MIT
// bench/timer_support.hpp: what the one-line timers (mha_timer, decode_timer, train_timer)
// share: argument parsing, the timing loop and the peak RSS.
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace attn::bench {

/// getrusage's ru_maxrss (the peak resident set of the process) in MiB.
inline double max_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // Linux: KiB
}

/// Prints "<argv0>: <why>" and the usage line `arguments` ("usage: <argv0> <arguments>"),
/// exits with status 2 (for a timer that parses its own command line, as decode_timer).
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

/// A timer's command line: `positional` arguments (all non-negative integers) and the
/// options --max-seconds S (default 10) and --warmup N (default 1); other flags are left in
/// `flags`. Exits with status 2 and `synopsis` on a bad command line.
struct TimerArgs {
  std::vector<long> positional;
  std::vector<std::string> flags;
  double max_seconds = 10.0;
  long warmup = 1;

  TimerArgs(int argc, char** argv, std::size_t count, const char* synopsis)
      : argv0_(argv[0]), synopsis_(synopsis) {
    for (int i = 1; i < argc; ++i) {
      if (std::strcmp(argv[i], "--max-seconds") == 0 && i + 1 < argc) {
        max_seconds = std::atof(argv[++i]);
      } else if (std::strcmp(argv[i], "--warmup") == 0 && i + 1 < argc) {
        warmup = parse(argv[++i], "--warmup");
      } else if (std::strncmp(argv[i], "--", 2) == 0) {
        flags.emplace_back(argv[i]);
      } else {
        positional.push_back(parse(argv[i], "argument"));
      }
    }
    if (positional.size() != count) {
      fail("expected " + std::to_string(count) + " positional arguments");
    }
  }
  [[noreturn]] void fail(const std::string& why) const { usage_error(argv0_, why, synopsis_); }

 private:
  long parse(const char* text, const char* what) const {
    char* end = nullptr;
    const long value = std::strtol(text, &end, 10);
    if (end == text || *end != '\0' || value < 0) {
      fail(std::string("bad ") + what + " '" + text + "'");
    }
    return value;
  }
  const char* argv0_;
  const char* synopsis_;
};

/// Runs `warmup` untimed calls of fn, then up to `reps` timed ones, stopping once
/// `max_seconds` of timed calls have run and at least 3 were timed. Returns the
/// milliseconds of each timed call, sorted.
template <class Fn>
std::vector<double> time_calls(Fn&& fn, long warmup, long reps, double max_seconds) {
  for (long i = 0; i < warmup; ++i) fn();
  std::vector<double> times_ms;
  times_ms.reserve(static_cast<std::size_t>(std::max(1L, reps)));
  double total_s = 0;
  for (long i = 0; i < std::max(1L, reps); ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    times_ms.push_back(s * 1e3);
    total_s += s;
    if (total_s >= max_seconds && times_ms.size() >= 3) break;
  }
  std::sort(times_ms.begin(), times_ms.end());
  return times_ms;
}

/// The median of sorted values.
inline double median(const std::vector<double>& sorted) {
  const std::size_t n = sorted.size();
  return n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
}

}  // namespace attn::bench
