#!/usr/bin/env bash
# README command 2: installs what is missing, then builds and runs the whole test suite:
#   1. release build (-O2 -march=native, OpenMP, -Werror): every test, the packaging tests;
#   2. ASan + UBSan build (-Werror): every test again;
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

start=$(date +%s)
run_suite release -DCMAKE_BUILD_TYPE=Release -DATTN_BUILD_EXAMPLES=ON -DATTN_BUILD_BENCHMARKS=ON
run_suite sanitize -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" -DATTN_SANITIZE=ON \
  -DATTN_BUILD_EXAMPLES=OFF -DATTN_BUILD_BENCHMARKS=OFF
# 3.-4. hardening: libFuzzer targets (30 s each) and a valgrind memcheck run (scripts/run_hardening.sh).
"$ATTN_ROOT/scripts/run_hardening.sh" fuzz valgrind
log "all test suites passed in $(( $(date +%s) - start )) s"
