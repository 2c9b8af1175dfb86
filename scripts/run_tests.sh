#!/usr/bin/env bash
# README command 2: installs what is missing, then builds and runs the whole test suite:
#   1. release build (-O2, OpenMP, -Werror; no -march flag, as users build): every test, the
#      packaging tests and the examples, tools and benchmarks compiled (benchmarks are not
#      run); then the tests again once per narrower kernel set this CPU has (ATTN_ISA);
#   2. a clang build (-Werror) of the dispatch test (a baseline and a -march=native unit in
#      one program) and of the kernel tests, run;
#   3. ASan + UBSan build (-O0 -g1, -Werror): every test again;
#   4. libFuzzer targets (clang) for ATTN_FUZZ_SECONDS (30) each; valgrind memcheck; TSan.
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

# The suite itself picks kernel sets through ATTN_ISA; start from the CPU's choice.
unset ATTN_ISA

start=$(date +%s)
# 0. Formatting: every C++ file as clang-format makes it (skipped without clang-format).
"$ATTN_ROOT/scripts/check_format.sh"
run_suite release -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
  -DATTN_BUILD_EXAMPLES=ON -DATTN_BUILD_BENCHMARKS=ON
# 1b. Every test (but packaging and compile-fail, which run no kernel) on each narrower kernel
# set this CPU supports: the run above used the widest.
best="$("$ATTN_ROOT/build/release/tests/dispatch_test" --report | sed -n 's/.* best=\([a-z0-9]*\).*/\1/p')"
for isa in avx2 sse2 scalar; do
  case "$best:$isa" in
    avx512:*|avx2:sse2|avx2:scalar|sse2:scalar) ;;
    *) continue ;;
  esac
  log "[release] testing with ATTN_ISA=$isa (the $isa kernels; best on this CPU: $best)"
  ATTN_ISA=$isa ctest --test-dir "$ATTN_ROOT/build/release" --output-on-failure -j "$ATTN_JOBS" \
    --timeout 600 -LE "packaging|compile_fail"
done
# 2. clang: the same headers through the other compiler, in a baseline and a native unit.
ensure_packages clang
log "[clang] configuring, building and running the dispatch and kernel tests"
cmake -S "$ATTN_ROOT" -B "$ATTN_ROOT/build/clang" -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" -DATTN_WERROR=ON \
  -DATTN_BUILD_TESTS=ON -DATTN_BUILD_EXAMPLES=ON -DATTN_BUILD_BENCHMARKS=OFF -DATTN_TEST_PCH=OFF >/dev/null
clang_tests=(dispatch_test simd_test nonfinite_test kernel_paths_test gemm_test)
cmake --build "$ATTN_ROOT/build/clang" -j "$ATTN_JOBS" --target "${clang_tests[@]}"
for t in "${clang_tests[@]}"; do "$ATTN_ROOT/build/clang/tests/$t" --gtest_brief=1; done
# -O0: the sanitizers find the same bugs; -O1 would triple the compile time of this build.
run_suite sanitize -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O0 -g1" -DATTN_SANITIZE=ON \
  -DATTN_BUILD_EXAMPLES=OFF -DATTN_BUILD_BENCHMARKS=OFF
# 3.-4. hardening: libFuzzer targets (30 s each) and a valgrind memcheck run (scripts/run_hardening.sh).
"$ATTN_ROOT/scripts/run_hardening.sh" fuzz valgrind
"$ATTN_ROOT/scripts/run_hardening.sh" tsan  # 5. ThreadSanitizer build of tests/concurrency
log "all test suites passed in $(( $(date +%s) - start )) s"
