#!/usr/bin/env bash
# Hardening steps of the test command (scripts/run_tests.sh runs them after the suites):
#   fuzz:     libFuzzer (clang, ASan + UBSan): fuzz/safetensors_fuzz, fuzz/mask_api_fuzz,
#             fuzz/attn_run_fuzz, and the call-sequence targets fuzz/kv_cache_fuzz and
#             fuzz/training_fuzz, each for ATTN_FUZZ_SECONDS (default 25), ATTN_JOBS at a time
#             (the five, build excluded, within about 80 s on two cores), from the committed
#             seeds in fuzz/corpus/<target>/, with the dictionaries in fuzz/ and inputs up to
#             256 KiB (enough for the 100000-deep JSON headers of the crash corpus). Built in a
#             tree of their own (build/fuzz), or taken from the tree ATTN_FUZZ_TREE names
#             (scripts/run_tests.sh: its sanitizer tree, configured with
#             -DATTN_BUILD_FUZZERS=ON, where they link the tests' kernel units);
#   tsan:     ThreadSanitizer (clang, no OpenMP) build of tests/concurrency, run once;
#   valgrind: memcheck (--error-exitcode=1) of attn_run on a committed fixture and of the
#             notebook catalogue tests (every notebook class), on the AVX2 kernels
#             (ATTN_ISA=avx2: valgrind lacks AVX-512): the release tree's programs when
#             run_tests.sh has built them, else a tree of its own.
# Longer fuzzing on demand:  ATTN_FUZZ_SECONDS=3600 scripts/run_hardening.sh fuzz
# Usage: scripts/run_hardening.sh [fuzz|tsan|valgrind]...   (default: all three)
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"

fuzz_seconds="${ATTN_FUZZ_SECONDS:-25}"

run_fuzzers() {
  ensure_packages "${ATTN_BASE_PACKAGES[@]}" clang libfuzzer-14-dev libclang-rt-14-dev
  local build="${ATTN_FUZZ_TREE:-$ATTN_ROOT/build/fuzz}"
  if [ -n "${ATTN_FUZZ_TREE:-}" ]; then
    # scripts/run_tests.sh: the targets built in its sanitizer tree, sharing its kernel units
    log "[fuzz] the targets of $build"
  else
    log "[fuzz] building (clang, -fsanitize=fuzzer,address,undefined)"
    cmake -S "$ATTN_ROOT" -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug \
      -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only" -DATTN_BUILD_FUZZERS=ON -DATTN_BUILD_IO=ON \
      -DATTN_WERROR=ON -DATTN_BUILD_TESTS=OFF -DATTN_BUILD_EXAMPLES=OFF \
      -DATTN_BUILD_BENCHMARKS=OFF >/dev/null
    cmake --build "$build" -j "$ATTN_JOBS"
  fi
  # One thread per target (where the tree has OpenMP): they run ATTN_JOBS at a time.
  export OMP_NUM_THREADS=1
  # The targets run ATTN_JOBS at a time, each on one core for its full time.
  local target running=0 failed=0
  for target in safetensors_fuzz mask_api_fuzz attn_run_fuzz kv_cache_fuzz training_fuzz; do
    if [ "$running" -ge "$ATTN_JOBS" ]; then
      wait -n || failed=1
      running=$((running - 1))
    fi
    fuzz_one "$build" "$target" &
    running=$((running + 1))
  done
  while [ "$running" -gt 0 ]; do
    wait -n || failed=1
    running=$((running - 1))
  done
  return "$failed"
}

# fuzz_one <build> <target>: one libFuzzer run from the committed seeds.
fuzz_one() {
  local build="$1" target="$2"
  # New inputs go to build/fuzz/corpus/<target>; the committed seeds are read only.
  local work="$build/corpus/$target" options=()
  case "$target" in
    safetensors_fuzz) options=(-dict="$ATTN_ROOT/fuzz/safetensors.dict" -max_len=262144) ;;
    attn_run_fuzz) options=(-dict="$ATTN_ROOT/fuzz/attn_run.dict" -max_len=262144) ;;
  esac
  mkdir -p "$work"
  log "[fuzz] $target for ${fuzz_seconds} s"
  local t0=$SECONDS
  if ! "$build/fuzz/$target" "$work" "$ATTN_ROOT/fuzz/corpus/$target" "${options[@]}" \
      -max_total_time="$fuzz_seconds" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$build/$target-" >"$build/$target.log" 2>&1; then
    tail -n 60 "$build/$target.log"
    echo "fuzz target $target failed; the crashing input is in $build/ ($target-crash-*)" >&2
    return 1
  fi
  echo "$target: $((SECONDS - t0)) s, $(grep -E "stat::(number_of_executed_units|new_units_added)" \
    "$build/$target.log" | tr -s ' ' | tr '\n' ' ')"
}

# ThreadSanitizer on the concurrency tests (one const module, several std::threads). Without
# OpenMP: libgomp is not instrumented, so TSan would report its internals. They run on one
# kernel set: ATTN_TSAN_KERNEL_SET (scripts/run_tests.sh passes the CPU's best), the others
# then compiled at -O0 without TSan (ATTN_UNRUN_KERNEL_SETS), since nothing runs them there
# (with TSan at -O2 the SSE2 and scalar units took 47 and 20 s beside the fuzzers on a Zen 3,
# the AVX-512 unit 7 s at -O0). Unset: every set the CPU has built with TSan, its best run.
run_tsan() {
  ensure_packages "${ATTN_BASE_PACKAGES[@]}" clang libclang-rt-14-dev
  local build="$ATTN_ROOT/build/tsan" isa="${ATTN_TSAN_KERNEL_SET:-}"
  local unrun="${ATTN_UNRUN_KERNEL_SETS:-}"
  [ -n "$isa" ] && unrun="$(kernel_sets_except "$isa")"
  log "[tsan] building tests/concurrency (clang, -fsanitize=thread, no OpenMP${isa:+, kernel set $isa})"
  cmake -S "$ATTN_ROOT" -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only -fsanitize=thread" -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread \
    -DATTN_OPENMP=OFF -DATTN_WERROR=ON -DATTN_BUILD_TESTS=ON -DATTN_BUILD_IO=OFF \
    -DATTN_BUILD_EXAMPLES=OFF -DATTN_BUILD_BENCHMARKS=OFF -DATTN_TEST_SELECT="concurrency/*" \
    -DATTN_UNRUN_KERNEL_SETS="$unrun" >/dev/null
  cmake --build "$build" -j "$ATTN_JOBS" --target attn_tests  # the concurrency tests alone
  log "[tsan] tests/concurrency${isa:+ (ATTN_ISA=$isa)}"
  (
    if [ -n "$isa" ]; then export ATTN_ISA="$isa"; fi
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" "$build/tests/attn_tests"
  )
}

run_valgrind() {
  ensure_packages "${ATTN_BASE_PACKAGES[@]}" valgrind
  # The release tree's programs when scripts/run_tests.sh has built them (what users build,
  # run on one OpenMP thread: libgomp's thread stacks would read as "possibly lost"); else a
  # tree of its own, without OpenMP.
  local build="$ATTN_ROOT/build/release"
  if [ ! -x "$build/tools/attn_run" ] || [ ! -f "$build/tests/attn_tests.catalogue.gtest_filter" ]; then
    build="$ATTN_ROOT/build/valgrind"
    log "[valgrind] building attn_run and tests/catalogue (no -march=native, no OpenMP)"
    cmake -S "$ATTN_ROOT" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTN_NATIVE=OFF \
      -DATTN_OPENMP=OFF -DATTN_BUILD_TOOLS=ON -DATTN_BUILD_IO=ON -DATTN_WERROR=ON \
      -DATTN_BUILD_TESTS=ON -DATTN_SHARE_KERNELS=ON -DATTN_BUILD_EXAMPLES=OFF \
      -DATTN_BUILD_BENCHMARKS=OFF -DATTN_TEST_SELECT="catalogue/*" >/dev/null
    cmake --build "$build" -j "$ATTN_JOBS" --target attn_run attn_tests
  fi
  export ATTN_ISA=avx2  # clamped to the CPU; valgrind cannot run AVX-512 instructions
  export OMP_NUM_THREADS=1
  local memcheck=(valgrind --tool=memcheck --error-exitcode=1 --leak-check=full
                  --errors-for-leak-kinds=definite -q)
  local fixtures="$ATTN_ROOT/tests/fixtures/io" out="$ATTN_ROOT/build/valgrind-out"
  mkdir -p "$out"
  # attn_run and ATTN_JOBS shards of the catalogue tests, side by side (each is one thread).
  local catalogue
  catalogue="$(cat "$build/tests/attn_tests.catalogue.gtest_filter")"
  log "[valgrind] attn_run on tests/fixtures/io/case045 (cross, bool mask, weights) and" \
    "tests/catalogue (every notebook class, $ATTN_JOBS shards), $build"
  local pids=() failed=0 shard
  "${memcheck[@]}" "$build/tools/attn_run" --weights "$fixtures/case045.weights.safetensors" \
    --input "$fixtures/case045.input.safetensors" --output "$out/case045.output.safetensors" \
    --num-heads 4 --need-weights &
  pids+=($!)
  for ((shard = 0; shard < ATTN_JOBS; ++shard)); do
    GTEST_TOTAL_SHARDS="$ATTN_JOBS" GTEST_SHARD_INDEX="$shard" \
      "${memcheck[@]}" "$build/tests/attn_tests" --gtest_filter="$catalogue" --gtest_brief=1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  return "$failed"
}

steps=("$@")
[ "${#steps[@]}" -eq 0 ] && steps=(fuzz tsan valgrind)
start=$(date +%s)
for step in "${steps[@]}"; do
  case "$step" in
    fuzz) run_fuzzers ;;
    tsan) run_tsan ;;
    valgrind) run_valgrind ;;
    *) echo "unknown step '$step' (fuzz, tsan, valgrind)" >&2; exit 2 ;;
  esac
done
log "hardening steps (${steps[*]}) passed in $(( $(date +%s) - start )) s"
