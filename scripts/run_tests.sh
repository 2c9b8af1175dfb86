#!/usr/bin/env bash
# README command 2: installs what is missing, then builds and runs the whole test suite:
#   1. release build (-O2 -march=native, OpenMP, -Werror): every test, the packaging tests,
#      and the examples, tools and benchmarks compiled (benchmarks are not run);
#   2. ASan + UBSan build (-O0 -g1, -Werror): every test again;
#   3. libFuzzer targets (clang) for ATTN_FUZZ_SECONDS (30) each; 4. valgrind memcheck.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"

ensure_packages "${ATTN_BASE_PACKAGES[@]}"

run_suite() {  # run_suite <name> <cmake args...>
  local name="$1"; shift
  local build="$ATTN_ROOT/build/$name"
  log "[$name] configuring"
  cmake -S "$ATTN_ROOT" -B "$build" -DATTN_WERROR=ON -DATTN_BUILD_TESTS=ON "$@" >/dev/null
  log "[$name] building"
  cmake --build "$build" -j "$ATTN_JOBS"
  log "[$name] testing"
  ctest --test-dir "$build" --output-on-failure -j "$ATTN_JOBS" --timeout 600
}

# Idle OpenMP workers would spin between parallel regions and steal the core the other
# ctest job needs; results do not depend on it (they are thread-count invariant anyway).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

start=$(date +%s)
run_suite release -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
  -DATTN_BUILD_EXAMPLES=ON -DATTN_BUILD_BENCHMARKS=ON
# -O0: the sanitizers find the same bugs; -O1 would triple the compile time of this build.
run_suite sanitize -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O0 -g1" -DATTN_SANITIZE=ON \
  -DATTN_BUILD_EXAMPLES=OFF -DATTN_BUILD_BENCHMARKS=OFF
# 3.-4. hardening: libFuzzer targets (30 s each) and a valgrind memcheck run (scripts/run_hardening.sh).
"$ATTN_ROOT/scripts/run_hardening.sh" fuzz valgrind
"$ATTN_ROOT/scripts/run_hardening.sh" tsan  # 5. ThreadSanitizer build of tests/concurrency
log "all test suites passed in $(( $(date +%s) - start )) s"
