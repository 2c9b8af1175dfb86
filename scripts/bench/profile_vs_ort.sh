#!/usr/bin/env bash
# scripts/bench/profile_vs_ort.sh: where ONNX Runtime and attn spend the time of one MHA
# forward, per shape (bench/README.md, "vs ONNX Runtime"):
#   - ONNX Runtime: every graph of scripts/bench/ort_graphs.py that passes the check, timed
#     with its profiler on (scripts/bench/ort_mha.js --profile), each profile summarised per
#     node (scripts/bench/profile_summary.py ort: share of the run, MatMul/Gemm GFLOP/s);
#   - attn: bench/mha_timer (the -march=native build) under `perf record -e cpu-clock` (this
#     VM has no hardware counters), summarised into projections / attention core / rest
#     (profile_summary.py perf);
#   - with --gemm, attn's GEMM alone on the projection shapes (bench/gemm_bench), to hold
#     against the MatMul / Gemm GFLOP/s ONNX Runtime's profiler reports.
# Uses the builds of scripts/bench_vs_pytorch.sh (build/bench, ONNX Runtime in
# build/bench/ort) and builds what is missing. Profiles go to build/bench/profile/.
#
# Usage: scripts/bench/profile_vs_ort.sh [--threads N] [--seconds S] [--gemm] ["B Tq Tk D H causal cross" ...]
#   default shapes: B1 T128 D512 H8; B8 T512 D512 H8; B1 T2048 D768 H12; B1 T8192 D512 H8
#   causal; default threads 1; each process (and each ORT graph) times calls for S seconds
#   (default 3, at least 3 calls), so set-up is a small part of the samples.
# Same environment as the side-by-side command (scripts/bench/env.sh). The profilers cost
# a little time themselves; take the shares, not the milliseconds, from here.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
source "$(dirname "$0")/env.sh"

THREADS=1 SECONDS_EACH=3 GEMM=0 SHAPES=()
REPS=1000000  # bounded by SECONDS_EACH
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) THREADS="$2"; shift ;;
    --seconds) SECONDS_EACH="$2"; shift ;;
    --gemm) GEMM=1 ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | grep '^#'; exit 2 ;;
    *) SHAPES+=("$1") ;;
  esac
  shift
done
[ "${#SHAPES[@]}" -gt 0 ] || SHAPES=("1 128 128 512 8 0 0" "8 512 512 512 8 0 0"
                                     "1 2048 2048 768 12 0 0" "1 8192 8192 512 8 1 0")

ensure_packages "${ATTN_BASE_PACKAGES[@]}" python3-torch python3-numpy linux-perf
BUILD="${ATTN_BENCH_BUILD_DIR:-$ATTN_ROOT/build/bench}"
ORT_DIR="$BUILD/ort"
OUT="$BUILD/profile"
mkdir -p "$OUT"
TARGETS=(mha_timer)
[ "$GEMM" -eq 1 ] && TARGETS+=(gemm_bench)
cmake -S "$ATTN_ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DATTN_BUILD_BENCHMARKS=ON \
  -DATTN_BUILD_TESTS=OFF -DATTN_BUILD_EXAMPLES=OFF -DATTN_INSTALL=OFF -DATTN_NATIVE=ON >/dev/null
cmake --build "$BUILD" -j "$ATTN_JOBS" --target "${TARGETS[@]}" >/dev/null
ort_setup "$ORT_DIR"
if [ -z "$ORT_NOTE" ]; then
  GRAPH_ARGS=()
  for shape in "${SHAPES[@]}"; do GRAPH_ARGS+=(--shape "$shape"); done
  "$BENCH_PYTHON" "$ATTN_ROOT/scripts/bench/ort_graphs.py" --out "$ORT_DIR/graphs" "${GRAPH_ARGS[@]}"
else
  log "ONNX Runtime left out: $ORT_NOTE"
fi

run_env() {  # run_env wait_policy command...: the command in the benchmark's environment
  local wait="$1"; shift
  local -a vars
  mapfile -t vars < <(bench_env "$THREADS" "$wait")
  env -u OMP_WAIT_POLICY -u OPENBLAS_CORETYPE -u GOMP_SPINCOUNT "${vars[@]}" "$@"
}

for shape in "${SHAPES[@]}"; do
  read -r -a s <<< "$shape"
  tag="b${s[0]}_tq${s[1]}_tk${s[2]}_d${s[3]}_h${s[4]}_c${s[5]}_x${s[6]}_t$THREADS"
  log "$(shape_label "${s[@]}"), $THREADS thread(s)"
  if [ -z "$ORT_NOTE" ]; then
    out="$(run_env "" node "$ATTN_ROOT/scripts/bench/ort_mha.js" "${s[@]}" "$THREADS" "$REPS" \
             --max-seconds "$SECONDS_EACH" --graphs "$(graph_dir "$ORT_DIR" "${s[@]}")" --ort "$ORT_DIR" \
             --profile "$OUT/ort_$tag")"
    grep -E '^(variant|skipped)=' <<< "$out" | sed 's/ B=[^ ]* .* threads=[0-9]*//'
    for f in $(sed -n 's/.* profile=\([^ ]*\).*/\1/p' <<< "$out" | tr ',' ' '); do
      "$BENCH_PYTHON" "$ATTN_ROOT/scripts/bench/profile_summary.py" ort "$f"
    done
  fi
  line="$(run_env ACTIVE perf record -q -e cpu-clock -F 1999 -o "$OUT/attn_$tag.data" -- \
    "$BUILD/bench/mha_timer" "${s[@]}" "$THREADS" "$REPS" --max-seconds "$SECONDS_EACH" --warmup 2 2>/dev/null)"
  echo "$line"
  "$BENCH_PYTHON" "$ATTN_ROOT/scripts/bench/profile_summary.py" perf "$OUT/attn_$tag.data" \
    --ms "$(sed -n 's/.* median_ms=\([^ ]*\).*/\1/p' <<< "$line")"
done

if [ "$GEMM" -eq 1 ]; then
  log "attn's GEMM alone (bench/gemm_bench, $THREADS thread(s), 5 repetitions; packs the weight per call)"
  run_env ACTIVE "$BUILD/bench/gemm_bench" --benchmark_repetitions=5 --benchmark_format=json \
    --benchmark_filter='BM_Gemm<float>.*' > "$OUT/gemm_t$THREADS.json" 2>/dev/null
  "$BENCH_PYTHON" "$ATTN_ROOT/scripts/bench/profile_summary.py" gemm "$OUT/gemm_t$THREADS.json"
fi
