#!/usr/bin/env bash
# README command: attn's MultiHeadAttention side by side with PyTorch's nn.MultiheadAttention.
#   1. installs what is missing (build packages, python3-torch, python3-numpy,
#      libopenblas0-pthread, gnuplot-nox) and builds the bench targets in build/bench;
#   2. measures the machine's FMA peak (bench/fma_peak);
#   3. for every shape and thread count (1, 2), alternates fresh attn processes
#      (bench/mha_timer) and PyTorch processes (scripts/bench/pytorch_mha.py, best of its
#      variants), several rounds, and takes the median of the per-process medians;
#   4. sweeps T at B1 D512 H8 (1 thread) for the GFLOP/s-vs-T plot;
#   5. prints the machine, the table and, as the very last line,
#      summary: speedup_min=X.XX speedup_median=X.XX peak_fraction_best=0.XX
# Writes bench/results/<date>.csv (one row per shape, threads and implementation),
# bench/results/<date>.txt (what was printed), bench/results/gflops_vs_seqlen.png.
# --quick: a few small shapes, one round, into bench/results/tmp/ (git-ignored).
#
# Settings (both sides): OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = MKL_NUM_THREADS = threads,
# glibc MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=268435456,
# OPENBLAS_CORETYPE=SkylakeX when the CPU has AVX-512 (else Haswell). attn also gets
# OMP_WAIT_POLICY=ACTIVE; PyTorch keeps the default (its OpenMP workers would otherwise spin
# against OpenBLAS's own threads). Override with ATTN_BENCH_OPENBLAS_CORETYPE,
# ATTN_BENCH_ATTN_WAIT_POLICY, ATTN_BENCH_TORCH_WAIT_POLICY (empty = unset);
# ATTN_BENCH_BUILD_DIR changes the build directory. attn's module is frozen (its weights
# packed for the GEMM once, MultiHeadAttention::freeze(), as an inference deployment runs
# it); ATTN_BENCH_NO_FREEZE=1 times it unfrozen (weights repacked on every call).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"

usage() {
  cat <<EOF
usage: $0 [--quick] [--rounds N] [--reps N] [--max-seconds S] [--threads 1,2] [--no-sweep]
          [--out DIR]
  --quick        smoke test: 3 small shapes, T sweep 128..512, 1 round, 3 reps
  --rounds N     alternating attn/PyTorch process pairs per shape and thread count (default 3)
  --reps N       timed calls per process, at most (default 20)
  --max-seconds  stop a process's timing after this many seconds (>= 3 calls; default 3)
  --threads L    comma-separated thread counts (default 1,2)
  --no-sweep     skip the T sweep (no plot unless a main shape is on the sweep line)
  --out DIR      results directory (default bench/results, --quick: bench/results/tmp)
EOF
  exit 2
}

QUICK=0 ROUNDS="" REPS="" MAX_SECONDS="" THREADS="1,2" SWEEP=1 OUT_DIR=""
COMMAND_LINE="scripts/bench_vs_pytorch.sh${*:+ $*}"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --rounds) ROUNDS="$2"; shift ;;
    --reps) REPS="$2"; shift ;;
    --max-seconds) MAX_SECONDS="$2"; shift ;;
    --threads) THREADS="$2"; shift ;;
    --no-sweep) SWEEP=0 ;;
    --out) OUT_DIR="$2"; shift ;;
    -h|--help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
  esac
  shift
done

# Shapes: "B Tq Tk D H causal cross" (the GitHub issue "Fast attention on the CPU", item 5).
if [ "$QUICK" -eq 1 ]; then
  SHAPES=("1 128 128 512 8 0 0" "1 512 512 512 8 1 0" "2 64 256 512 8 0 1")
  SWEEP_T=(128 256 512)
  ROUNDS="${ROUNDS:-1}" REPS="${REPS:-3}" MAX_SECONDS="${MAX_SECONDS:-0.5}"
  OUT_DIR="${OUT_DIR:-$ATTN_ROOT/bench/results/tmp}"
else
  SHAPES=("1 128 128 512 8 0 0" "8 512 512 512 8 0 0" "1 2048 2048 768 12 0 0"
          "1 8192 8192 512 8 0 0" "1 8192 8192 512 8 1 0" "8 128 512 512 8 0 1")
  SWEEP_T=(128 256 512 1024 2048 4096 8192)
  ROUNDS="${ROUNDS:-3}" REPS="${REPS:-20}" MAX_SECONDS="${MAX_SECONDS:-3}"
  OUT_DIR="${OUT_DIR:-$ATTN_ROOT/bench/results}"
fi
IFS=',' read -r -a THREAD_LIST <<< "$THREADS"
PYTHON=/usr/bin/python3  # Debian's python3-torch; a pyenv python3 on PATH does not see it

# ---- 1. packages and build ----
ensure_packages "${ATTN_BASE_PACKAGES[@]}" python3-torch python3-numpy libopenblas0-pthread
if ! command -v gnuplot >/dev/null && ! "$PYTHON" -c "import matplotlib" 2>/dev/null; then
  ensure_packages gnuplot-nox || log "could not install gnuplot-nox: no plot"
fi

BUILD="${ATTN_BENCH_BUILD_DIR:-$ATTN_ROOT/build/bench}"
TARGETS=(fma_peak mha_timer)
[ "$QUICK" -eq 1 ] || TARGETS+=(attention_bench kernel_bench softmax_bench tensor_view_bench)
log "building ${TARGETS[*]} in $BUILD (Release)"
cmake -S "$ATTN_ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DATTN_BUILD_BENCHMARKS=ON \
  -DATTN_BUILD_TESTS=OFF -DATTN_BUILD_EXAMPLES=OFF -DATTN_INSTALL=OFF >/dev/null
cmake --build "$BUILD" -j "$ATTN_JOBS" --target "${TARGETS[@]}"

# ---- 2. machine, settings, FMA peak ----
mkdir -p "$OUT_DIR" "$ATTN_ROOT/bench/results/tmp"
DATE="$(date -u +%Y-%m-%d)"
RAW="$ATTN_ROOT/bench/results/tmp/raw-$(date -u +%Y%m%dT%H%M%S).txt"
PEAK_FILE="${RAW%.txt}.peak"
: > "$RAW"

if grep -qw avx512f /proc/cpuinfo; then HAS_AVX512=yes; else HAS_AVX512=no; fi
CORETYPE_DEFAULT=Haswell
[ "$HAS_AVX512" = yes ] && CORETYPE_DEFAULT=SkylakeX
OPENBLAS_CORETYPE_SET="${ATTN_BENCH_OPENBLAS_CORETYPE-$CORETYPE_DEFAULT}"
ATTN_WAIT="${ATTN_BENCH_ATTN_WAIT_POLICY-ACTIVE}"
ATTN_FREEZE_ARGS=()
ATTN_FROZEN=frozen
if [ "${ATTN_BENCH_NO_FREEZE:-0}" = 1 ]; then ATTN_FREEZE_ARGS=(--no-freeze); ATTN_FROZEN=unfrozen; fi
TORCH_WAIT="${ATTN_BENCH_TORCH_WAIT_POLICY-}"

CPU_MODEL="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
CPU_FAMILY="$(sed -n 's/^cpu family[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
CPU_MODEL_NO="$(sed -n 's/^model[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
CPUS="$(nproc)"
TORCH_VERSION="$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo missing)"
OPENBLAS_VERSION="$(dpkg-query -W -f='${Version}' libopenblas0-pthread 2>/dev/null || echo '?')"
GIT_REV="$(git -C "$ATTN_ROOT" describe --always --dirty 2>/dev/null || echo unknown)"
MACHINE="machine: ${CPU_MODEL:-unknown CPU} (family $CPU_FAMILY model $CPU_MODEL_NO), $CPUS CPUs, AVX-512: $HAS_AVX512; $(uname -sr)
software: attn $GIT_REV built by $(g++ -dumpfullversion 2>/dev/null | sed 's/^/g++ /') -O3 -march=native; PyTorch $TORCH_VERSION with OpenBLAS $OPENBLAS_VERSION (pthread)
settings: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE_SET:-unset}, MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=268435456, OMP_WAIT_POLICY attn=${ATTN_WAIT:-unset} PyTorch=${TORCH_WAIT:-unset}; attn module $ATTN_FROZEN; $ROUNDS round(s), <= $REPS calls or ${MAX_SECONDS} s per process
date: $(date -u '+%Y-%m-%d %H:%M UTC')
command: $COMMAND_LINE"
log "machine"
echo "$MACHINE"

log "measuring the FMA peak (threads ${THREAD_LIST[*]})"
PEAK_ARGS=(--threads "$THREADS")
[ "$QUICK" -eq 1 ] && PEAK_ARGS+=(--quick)
"$BUILD/bench/fma_peak" "${PEAK_ARGS[@]}" | tee "$PEAK_FILE"

# ---- 3. measurements ----
# bench_env threads wait_policy: the environment of one measured process.
bench_env() {
  local t="$1" wait="$2"
  local vars=(OMP_NUM_THREADS="$t" OPENBLAS_NUM_THREADS="$t" MKL_NUM_THREADS="$t"
              MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=268435456)
  [ -n "$OPENBLAS_CORETYPE_SET" ] && vars+=(OPENBLAS_CORETYPE="$OPENBLAS_CORETYPE_SET")
  [ -n "$wait" ] && vars+=(OMP_WAIT_POLICY="$wait")
  printf '%s\n' "${vars[@]}"
}

# measure kind impl round threads B Tq Tk D H causal cross: one fresh process; appends its
# result line to $RAW and echoes the median ms (or "failed").
measure() {
  local kind="$1" impl="$2" round="$3" t="$4"; shift 4
  local -a env_vars cmd
  local out line
  if [ "$impl" = attn ]; then
    mapfile -t env_vars < <(bench_env "$t" "$ATTN_WAIT")
    cmd=("$BUILD/bench/mha_timer" "$@" "$t" "$REPS" --max-seconds "$MAX_SECONDS"
         "${ATTN_FREEZE_ARGS[@]}")
  else
    mapfile -t env_vars < <(bench_env "$t" "$TORCH_WAIT")
    cmd=("$PYTHON" "$ATTN_ROOT/scripts/bench/pytorch_mha.py" "$@" "$t" "$REPS"
         --max-seconds "$MAX_SECONDS")
  fi
  # Start from a clean slate: no inherited thread, BLAS or malloc settings.
  if out="$(env -u OMP_WAIT_POLICY -u OPENBLAS_CORETYPE -u GOMP_SPINCOUNT \
              "${env_vars[@]}" "${cmd[@]}" 2>&1)"; then
    line="$(grep '^impl=' <<< "$out" | tail -n1)"
    echo "$out" | grep '^variant=' | sed "s/^/# $impl $* t=$t round=$round /" >> "$RAW" || true
    echo "kind=$kind round=$round $line" >> "$RAW"
    sed -n 's/.* median_ms=\([^ ]*\).*/\1/p' <<< "$line"
  else
    printf '# FAILED: %s\n#   %s\n' "${cmd[*]}" "${out//$'\n'/$'\n#   '}" >> "$RAW"
    echo failed
  fi
}

label() {  # label B Tq Tk D H causal cross
  local s
  if [ "$7" = 1 ]; then s="cross B$1 Tq$2 Tk$3 D$4 H$5"; else s="B$1 T$2 D$4 H$5"; fi
  [ "$6" = 1 ] && s="$s causal"
  echo "$s"
}

# Work list: "kind threads shape".
JOBS=()
for shape in "${SHAPES[@]}"; do
  for t in "${THREAD_LIST[@]}"; do JOBS+=("main $t $shape"); done
done
if [ "$SWEEP" -eq 1 ]; then
  for T in "${SWEEP_T[@]}"; do
    shape="1 $T $T 512 8 0 0"
    # a main shape at 1 thread already measured it
    if printf '%s\n' "${SHAPES[@]}" | grep -qx "$shape" && printf '%s\n' "${THREAD_LIST[@]}" | grep -qx 1; then
      continue
    fi
    JOBS+=("sweep 1 $shape")
  done
fi

log "measuring ${#JOBS[@]} configurations x $ROUNDS round(s), attn and PyTorch alternating"
n=0
for job in "${JOBS[@]}"; do
  read -r kind t b tq tk d h causal cross <<< "$job"
  n=$((n + 1))
  for round in $(seq 1 "$ROUNDS"); do
    # Alternate which side goes first, so drifts in machine load hit both alike.
    if [ $((round % 2)) -eq 1 ]; then order=(attn pytorch); else order=(pytorch attn); fi
    declare -A ms=()
    for impl in "${order[@]}"; do
      ms[$impl]="$(measure "$kind" "$impl" "$round" "$t" "$b" "$tq" "$tk" "$d" "$h" "$causal" "$cross")"
    done
    printf '  [%d/%d] %-34s threads=%s round %s: attn %s ms, PyTorch %s ms\n' "$n" "${#JOBS[@]}" \
      "$(label "$b" "$tq" "$tk" "$d" "$h" "$causal" "$cross")" "$t" "$round" "${ms[attn]}" "${ms[pytorch]}"
    unset ms
  done
done

# The peak again, now that the machine is warm: the report takes the better of the two.
log "measuring the FMA peak again"
"$BUILD/bench/fma_peak" "${PEAK_ARGS[@]}" | tee -a "$PEAK_FILE"

# ---- 4. report (the summary line is the last line printed) ----
CSV="$OUT_DIR/$DATE.csv"
PNG="$OUT_DIR/gflops_vs_seqlen.png"
TXT="$OUT_DIR/$DATE.txt"
log "results"
{
  echo "$MACHINE"
  echo
  "$PYTHON" "$ATTN_ROOT/scripts/bench/report.py" --raw "$RAW" --peak "$PEAK_FILE" --csv "$CSV" \
    --plot "$PNG" --title-extra "$CPU_MODEL ($CPUS CPUs), $DATE, $COMMAND_LINE"
} | tee "$TXT"
