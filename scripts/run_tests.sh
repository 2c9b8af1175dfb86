#!/usr/bin/env bash
# README command 2: installs what is missing, then builds and runs the whole test suite:
#   0. the format check (scripts/check_format.sh) and the layer check (scripts/check_layers.sh);
#   1. release build (-O2, OpenMP, -Werror; no -march flag, as users build; Ninja where
#      installed): every test, the packaging tests and attn_run; then the tests again once
#      per narrower kernel set this CPU has (ATTN_ISA);
#   2. ASan + UBSan build with clang (-O0, no debug info, -Werror; the kernels at -O2), built
#      beside stage 1 at nice 19: every test again (but packaging), through the other compiler,
#      the examples (run as tests), the benchmarks (compiled, not run) and the libFuzzer targets;
#   3. the libFuzzer targets for ATTN_FUZZ_SECONDS (25) each; valgrind memcheck; TSan.
# At the end it prints each stage's wall and CPU time and the tests it ran; with
# ATTN_COMPILE_CPU=1, also the CPU time of each tree's costliest compiles
# (scripts/lib/compile_cpu.sh writes every compile's to build/<tree>/compile-cpu.txt).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"

ensure_packages "${ATTN_BASE_PACKAGES[@]}"

# ---- stage bookkeeping: wall time, CPU time (user + sys of every process the stage ran) ----
stage_rows=()
cpu_now=0
children_cpu() {  # sets cpu_now: user + sys seconds of the waited-for children so far
  # (bash `times`, run in this shell: in a $(...) subshell it would see no children)
  mkdir -p "$ATTN_ROOT/build"
  times >"$ATTN_ROOT/build/.times"
  cpu_now="$(awk 'NR == 2 {
    split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%.0f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' \
    "$ATTN_ROOT/build/.times")"
}
stage_tests=""
stage() {  # stage <name> <command...>: runs the command, records its times and stage_tests
  local name="$1"; shift
  local t0=$SECONDS c0
  children_cpu
  c0=$cpu_now
  stage_tests=""
  "$@"
  children_cpu
  stage_rows+=("$(printf '%-34s %6d %6d   %s' "$name" $((SECONDS - t0)) $((cpu_now - c0)) \
                  "$stage_tests")")
}

# ctest_run <tree> <ctest args...>: every ctest entry of build/<tree>; stage_tests says how
# many entries ran and how many GoogleTest tests they ran (from their XML results).
ctest_run() {
  local build="$ATTN_ROOT/build/$1"; shift
  rm -rf "$build/gtest-results"
  local out="$build/ctest.log"
  local rc=0
  ctest --test-dir "$build" --output-on-failure -j "$ATTN_JOBS" --timeout 600 "$@" 2>&1 |
    tee "$out" || rc=$?
  local entries gtests skipped
  entries="$(sed -n 's/.*tests failed out of \([0-9]*\).*/\1/p' "$out" | tail -n 1)"
  # (grep finding nothing is not an error here: `|| true` keeps pipefail from ending the script)
  gtests="$(cat "$build"/gtest-results/*.xml 2>/dev/null | { grep -o '<testcase [^>]*status="run"' || true; } | wc -l)"
  skipped="$(cat "$build"/gtest-results/*.xml 2>/dev/null | { grep -o '<testcase [^>]*result="skipped"' || true; } | wc -l)"
  stage_tests="${entries:-0} ctest entries, $gtests GoogleTest tests ($skipped skipped)"
  return $rc
}

configure() {  # configure <tree> <cmake args...>
  local build="$ATTN_ROOT/build/$1"; shift
  log "[$(basename "$build")] configuring"
  local launcher=()
  if [ "${ATTN_COMPILE_CPU:-0}" = 1 ]; then
    rm -f "$build/compile-cpu.txt"
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER="$ATTN_ROOT/scripts/lib/compile_cpu.sh")
  fi
  cmake -S "$ATTN_ROOT" -B "$build" -DATTN_WERROR=ON -DATTN_BUILD_TESTS=ON "${launcher[@]}" "$@" \
    >/dev/null
}
build() {  # build <tree> [targets...]
  local build="$ATTN_ROOT/build/$1"; shift
  log "[$(basename "$build")] building ${*:-everything}"
  if [ $# -gt 0 ]; then
    cmake --build "$build" -j "$ATTN_JOBS" --target "$@"
  else
    cmake --build "$build" -j "$ATTN_JOBS"
  fi
}
run_tests() {  # run_tests <tree> [ctest args...]
  log "[$1] testing ${ATTN_ISA:+with ATTN_ISA=$ATTN_ISA}"
  ctest_run "$@"
}

# Idle OpenMP workers would spin between parallel regions and steal the core the other
# ctest job needs; results do not depend on it (they are thread-count invariant anyway).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

# The suite itself picks kernel sets through ATTN_ISA; start from the CPU's choice.
unset ATTN_ISA

start=$SECONDS
# 0. Formatting: every C++ file as clang-format makes it (skipped without clang-format).
stage "format check" "$ATTN_ROOT/scripts/check_format.sh"
# Layering: no #include in include/attn/ climbs a layer.
stage "layer check" "$ATTN_ROOT/scripts/check_layers.sh"

# The widest kernel set this CPU runs (scripts/lib/best_isa.cpp, one header, a second to
# compile): both trees are configured from it before either is built.
ensure_packages clang libfuzzer-14-dev libclang-rt-14-dev
mkdir -p "$ATTN_ROOT/build"
"${CXX:-c++}" -std=c++17 -I"$ATTN_ROOT/include" "$ATTN_ROOT/scripts/lib/best_isa.cpp" \
  -o "$ATTN_ROOT/build/best_isa"
best="$("$ATTN_ROOT/build/best_isa")"

# 1. Release: every test on the widest kernel set, and attn_run (its tests and valgrind's run;
# at -O0, see tools/CMakeLists.txt: its logic is compiled at -O2 by the io tests).
# The programs link the tests' compiled kernel units (ATTN_SHARE_KERNELS): a quarter of their
# compile time; tests/cmake builds header-only programs, and tests/dispatch one unit of its
# program header-only with -march=native (the other links the kernel units). Each test executable
# is one unity batch (ATTN_TEST_UNITY_BATCH=0, here and in the sanitizer tree): the 29
# attention tests compiled in 172 CPU s as one unit, 271 s as four batches of 8. The examples
# and benchmarks are built in the sanitizer tree instead: GCC at -O2 took 320 CPU s for them,
# a quarter of this build, clang at -O0 about a third of that. The tests at -O1 would not
# build faster: the attention tests' unit took 209 CPU s at -O1 and 210 at -O2 side by side,
# 93 % of it code generation for the volume of code (-ftime-report), not optimisation.
configure release -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
  -DATTN_BUILD_EXAMPLES=OFF -DATTN_BUILD_BENCHMARKS=OFF -DATTN_BUILD_TOOLS=ON \
  -DATTN_TOOLS_OPTIMIZE=OFF -DATTN_SHARE_KERNELS=ON -DATTN_TEST_UNITY_BATCH=0

# 2. ASan + UBSan, compiled by clang: every test, the examples, the benchmarks and the fuzz
# targets through the second compiler and the sanitizers in one tree, sharing one set of
# kernel units. -O0 (the kernel units at -O2, the kernel tests and the fuzz targets at -O1):
# the sanitizers find the same bugs, and clang compiled the tests in 440 CPU s where GCC took
# 852 s (GCC's -O0 front end spends 3x clang's on the same test units). No debug info: line
# tables (-g1) cost 18 % of a test unit's compile time at -O0 and 25 % of the AVX-512 kernel
# unit's at -O2 (115 -> 86 CPU s); the sanitizers' reports still name every function of the
# stack, and docs/testing.md says how to rebuild one test with line numbers. ASan's checks
# as calls (-mllvm -asan-instrumentation-with-call-threshold=0) built this tree in 701 CPU s
# instead of 783 (the AVX-512 kernel unit 43 s instead of 77), but the kernel-heavy tests then
# ran 3-6x slower (kernels.GemmTest/double 4.6 -> 29.8 s): a loss overall.
# Kernel sets this CPU lacks are compiled there, and in the ThreadSanitizer tree, at -O0
# without sanitizers (ATTN_UNRUN_KERNEL_SETS): nothing runs them.
export ATTN_UNRUN_KERNEL_SETS="$(kernel_sets_above "$best")"
configure sanitize -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG="-O0" -DATTN_SANITIZE=ON -DATTN_BUILD_EXAMPLES=ON \
  -DATTN_BUILD_BENCHMARKS=ON -DATTN_BUILD_TOOLS=OFF -DATTN_BUILD_FUZZERS=ON \
  -DATTN_SHARE_KERNELS=ON -DATTN_TEST_UNITY_BATCH=0 -DATTN_UNRUN_KERNEL_SETS="$ATTN_UNRUN_KERNEL_SETS"
# Jobs beside the stages (the sanitizer build, ThreadSanitizer) run in process groups of
# their own (job control on while they start), so that when a stage fails the exit stops
# them with every compiler and test they started, not only their first process. Not in a
# session of their own (setsid): Linux then schedules the session as its own group, against
# which the stages' session gets only an equal share whatever the nice value, and the
# release build took 788 s instead of 458.
background_pids=()
background() {  # background <log> <command...>: starts it, appends its pid to background_pids
  local out="$1"; shift
  set -m
  "$@" >"$out" 2>&1 &
  background_pids+=("$!")
  set +m
}
background_wait() {  # background_wait <pid>: its exit status, once it has ended
  local pid="$1" rc=0 kept=() p
  wait "$pid" || rc=$?
  for p in "${background_pids[@]}"; do [ "$p" = "$pid" ] || kept+=("$p"); done
  background_pids=("${kept[@]}")
  return "$rc"
}
stop_background() {
  local pid
  for pid in "${background_pids[@]}"; do kill -- "-$pid" 2>/dev/null || true; done
}
trap stop_background EXIT
# The sanitizer tree builds beside the release stages at nice 19, on the core they leave
# idle: the release build's last 100 s or so are its largest unit alone (one core idle), and
# without this the whole command left 70 s of a core's time idle. Its row counts its CPU
# time and the wall time left after the release stages.
log "[sanitize] building beside the release stages at nice 19 (log: build/sanitize-build.log)"
background "$ATTN_ROOT/build/sanitize-build.log" \
  nice -n 19 cmake --build "$ATTN_ROOT/build/sanitize" -j "$ATTN_JOBS"
sanitize_pid=${background_pids[-1]}
sanitize_wait() {
  local rc=0
  background_wait "$sanitize_pid" || rc=$?
  if [ "$rc" -ne 0 ]; then
    tail -n 60 "$ATTN_ROOT/build/sanitize-build.log"
    echo "the sanitizer tree's build failed; its log is build/sanitize-build.log" >&2
    return 1
  fi
  tail -n 1 "$ATTN_ROOT/build/sanitize-build.log"
}

stage "release: build" build release
dispatch_best="$("$ATTN_ROOT/build/release/tests/dispatch_test" --report |
  sed -n 's/.* best=\([a-z0-9]*\).*/\1/p')"
if [ "$dispatch_best" != "$best" ]; then
  echo "scripts/lib/best_isa.cpp says $best, dispatch_test --report says $dispatch_best" >&2
  exit 1
fi
stage "release: tests ($best)" run_tests release
# 1b. Every test (but packaging and compile-fail, which run no kernel) on each narrower kernel
# set this CPU supports: the run above used the widest.
for isa in $(kernel_sets_below "$best"); do
  ATTN_ISA=$isa stage "release: tests ATTN_ISA=$isa" run_tests release -LE "packaging|compile_fail"
done

stage "sanitize: build (beside release)" sanitize_wait
# Every test again, but packaging: its consumer programs are built without the tree's
# sanitizers (they test the CMake package, which is the same for both compilers), and the
# release stage ran them (about 20 CPU s here).
stage "sanitize: tests" run_tests sanitize -LE packaging

# 3. hardening: the libFuzzer targets of the sanitizer tree (25 s each), a valgrind memcheck
# run and ThreadSanitizer on tests/concurrency (scripts/run_hardening.sh). ThreadSanitizer's
# build and run go beside the other two at nice 19: they take the core that the fuzzers' last
# round (five targets, two at a time) and valgrind's shorter shard leave idle, and take
# almost nothing from the fuzzers, which run for a fixed time. Its row counts its CPU time
# and the wall time left after valgrind.
log "[tsan] building and running beside the fuzzers and valgrind (log: build/tsan.log)"
ATTN_TSAN_KERNEL_SET="$best" background "$ATTN_ROOT/build/tsan.log" \
  nice -n 19 "$ATTN_ROOT/scripts/run_hardening.sh" tsan
tsan_pid=${background_pids[-1]}
tsan_wait() {
  if ! background_wait "$tsan_pid"; then
    tail -n 60 "$ATTN_ROOT/build/tsan.log"
    echo "ThreadSanitizer failed; its log is build/tsan.log" >&2
    return 1
  fi
  tail -n 2 "$ATTN_ROOT/build/tsan.log"
}
ATTN_FUZZ_TREE="$ATTN_ROOT/build/sanitize" stage "fuzz" "$ATTN_ROOT/scripts/run_hardening.sh" fuzz
stage "valgrind" "$ATTN_ROOT/scripts/run_hardening.sh" valgrind
stage "tsan (beside fuzz and valgrind)" tsan_wait

printf '\n%-34s %6s %6s   %s\n' "stage" "wall s" "cpu s" "tests"
printf '%s\n' "${stage_rows[@]}"
children_cpu
printf '%-34s %6d %6d\n' "total" $((SECONDS - start)) "$cpu_now"
if [ "${ATTN_COMPILE_CPU:-0}" = 1 ]; then
  for tree in release sanitize; do
    times_file="$ATTN_ROOT/build/$tree/compile-cpu.txt"
    printf '\n%s: compile CPU s, the costliest units (all: build/%s/compile-cpu.txt)\n' \
      "$tree" "$tree"
    awk '{ s += $1 } END { printf "%8.1f  (every compile)\n", s }' "$times_file"
    sort -rn "$times_file" | head -n 15 | awk '{ printf "%8.1f  %s\n", $1, $2 }'
  done
fi
log "all test suites passed in $((SECONDS - start)) s"
