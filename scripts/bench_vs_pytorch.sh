#!/usr/bin/env bash
# The benchmark command (docs/benchmarks.md): attn's MultiHeadAttention side by side with PyTorch's nn.MultiheadAttention
# and ONNX Runtime 1.30, attn built twice: with the project's default flags and with
# -march=native.
#   1. installs what is missing (build packages, python3-torch, python3-numpy,
#      libopenblas0-pthread, gnuplot-nox, python3-onnx; onnxruntime-node@1.30.0 from the npm
#      registry into <build>/ort, never into the repository) and builds the bench targets
#      twice: <build> with -DATTN_NATIVE=ON (-march=native) and <build>-default with
#      -DATTN_NATIVE=OFF (the flags a consumer gets);
#   2. measures the machine's FMA peak (bench/fma_peak) and writes ONNX Runtime's graphs for
#      every shape (scripts/bench/ort_graphs.py: MultiHeadAttention, GroupQueryAttention,
#      Attention and the torch.onnx.export graph of the module, each with the projections,
#      plus nn.MultiheadAttention's output on the same input and weights);
#   3. for every shape and thread count (1, 2): one ONNX Runtime process checks every graph
#      against nn.MultiheadAttention, times those that pass one after the other
#      (scripts/bench/ort_mha.js) and picks the fastest; then, several rounds, alternates fresh processes of attn (default
#      flags; bench/mha_timer), attn (-march=native), ONNX Runtime (that graph) and PyTorch
#      (scripts/bench/pytorch_mha.py, best of its variants), rotating who goes first, and
#      takes the median of the per-process medians; at 1 thread the first --bf16-rounds (2)
#      rounds also alternate attn's bfloat16 module (MultiHeadAttention<bfloat16>, the float
#      module converted and frozen; mha_timer --dtype bf16) and PyTorch's module after
#      .to(torch.bfloat16) (pytorch_mha.py --dtype bf16) with the others (PyTorch's only on
#      shapes of at most 2048 x 2048 scores where the CPU has neither AMX nor AVX512-BF16: it is
#      100x slower there); the bfloat16 table takes ONNX Runtime's float32 time of the same row
#      from the float table;
#   4. sweeps T at B1 D512 H8 (1 thread) for the GFLOP/s-vs-T plot;
#   5. prints the machine and the table;
#   6. runs the decode section (scripts/bench/decode.sh: a Llama-3-8B-shaped layer's decode
#      step and 128-token chunk through a KV cache vs PyTorch and the memory bandwidth, and the
#      bfloat16 module's decode step against the float one's) and
#      the training section (scripts/bench/train.sh: forward + backward vs PyTorch autograd),
#      each in --section-rounds (2) rounds, and the variants section (scripts/bench/variants.sh:
#      softcap, sinks and ALiBi against the plain kernel);
#   7. prints, as the very last line,
#        summary: speedup_min=X.XX speedup_median=X.XX peak_fraction_best=0.XX
#                 ort_speedup_min=X.XX default_vs_native_min=X.XX
#                 bf16_vs_fp32_min=X.XX bf16_vs_torch_bf16_min=X.XX bf16_peak_fraction_best=0.XX
#                 decode_bw_fraction_min=0.XX decode_speedup_min=X.XX
#                 prefill_chunk_speedup_min=X.XX (the decode section's KV-cache fields)
#                 bf16_decode_vs_fp32_min=X.XX train_speedup_min=X.XX
#                 train_peak_fraction_best=0.XX bf16_train_vs_fp32_min=X.XX
#                 variants_overhead_max=X.XXX   (one line; a bf16_ field is nan when a side is
#                 missing, the report saying why)
#      (attn's figures are the default-flags build's; the report and the sections say what
#      each field is).
# Writes bench/results/<date>.csv (one row per shape, threads and implementation),
# bench/results/<date>.txt (what was printed), bench/results/gflops_vs_seqlen.png, and the
# sections' decode.csv, decode.txt, decode_step_vs_length.png, <date>-train.txt and
# <date>-variants.txt.
# --quick: a few small shapes, one round, into bench/results/tmp/ (git-ignored).
# --no-bf16: no bfloat16 rows in any section (their summary fields are nan).
# Without node/npm, registry access or python3-onnx the ONNX Runtime columns stay empty and
# the report says why; the rest runs as before.
#
# Settings (every side): OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = MKL_NUM_THREADS = threads,
# glibc MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=268435456,
# OPENBLAS_CORETYPE=SkylakeX when the CPU has AVX-512 (else Haswell), and one warm-up rule:
# --warmup (2) untimed calls per process before the timed ones (ONNX Runtime touches fresh
# memory on its first two runs). attn also gets OMP_WAIT_POLICY=ACTIVE; PyTorch keeps the
# default (its OpenMP workers would otherwise spin against OpenBLAS's own threads); ONNX
# Runtime runs intraOpNumThreads = threads, interOpNumThreads = 1, its threads spinning (its
# default). Override with ATTN_BENCH_OPENBLAS_CORETYPE, ATTN_BENCH_ATTN_WAIT_POLICY,
# ATTN_BENCH_TORCH_WAIT_POLICY (empty = unset); ATTN_BENCH_BUILD_DIR changes the build
# directory (the default-flags build goes to the same path with -default appended). attn's
# module is frozen (its weights packed for the GEMM once, MultiHeadAttention::freeze(), as
# an inference deployment runs it); ATTN_BENCH_NO_FREEZE=1 times it unfrozen (weights
# repacked on every call).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/bench/env.sh"

usage() {
  cat <<USAGE
usage: $0 [--quick] [--rounds N] [--reps N] [--max-seconds S] [--warmup N] [--threads 1,2]
          [--no-sweep] [--no-ort] [--no-decode] [--no-train] [--no-variants] [--no-bf16]
          [--bf16-rounds N] [--section-rounds N]
          [--shape "B Tq Tk D H causal cross"]... [--out DIR]
  --quick        smoke test: 3 small shapes, T sweep 128..512, 1 round, 3 reps
  --rounds N     alternating process groups per shape and thread count (default 3)
  --reps N       timed calls per process, at most (default 20)
  --max-seconds  stop a process's timing after this many seconds (>= 3 calls; default 3)
  --warmup N     untimed calls per process before timing, every implementation (default 2)
  --threads L    comma-separated thread counts (default 1,2)
  --no-sweep     skip the T sweep (no plot unless a main shape is on the sweep line)
  --no-ort       leave ONNX Runtime out
  --no-decode    skip the decode section (scripts/bench/decode.sh)
  --no-train     skip the training section (scripts/bench/train.sh)
  --no-variants  skip the variants section (scripts/bench/variants.sh)
  --no-bf16      no bfloat16 rows (forward, decode, training)
  --bf16-rounds N  rounds that also time the bfloat16 modules, 1 thread (default 2, --quick 1;
                 given, the decode section's too)
  --section-rounds N  rounds of the decode and training sections (default 2; run alone, those
                 sections take 3): with 3, the whole command took 71 minutes on a Zen 5
  --shape S      measure these shapes instead of the default six (repeatable; causal, cross: 0/1)
  --out DIR      results directory (default bench/results, --quick: bench/results/tmp)
USAGE
  exit 2
}

QUICK=0 ROUNDS="" REPS="" MAX_SECONDS="" WARMUP=2 THREADS="1,2" SWEEP=1 OUT_DIR="" WANT_ORT=1
WANT_DECODE=1 WANT_TRAIN=1 WANT_VARIANTS=1 WANT_BF16=1 BF16_ROUNDS="" SECTION_ROUNDS=2
USER_SHAPES=()
COMMAND_LINE="scripts/bench_vs_pytorch.sh${*:+ $*}"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --rounds) ROUNDS="$2"; shift ;;
    --reps) REPS="$2"; shift ;;
    --max-seconds) MAX_SECONDS="$2"; shift ;;
    --warmup) WARMUP="$2"; shift ;;
    --threads) THREADS="$2"; shift ;;
    --no-sweep) SWEEP=0 ;;
    --no-ort) WANT_ORT=0 ;;
    --no-decode) WANT_DECODE=0 ;;
    --no-train) WANT_TRAIN=0 ;;
    --no-variants) WANT_VARIANTS=0 ;;
    --no-bf16) WANT_BF16=0 ;;
    --bf16-rounds) BF16_ROUNDS="$2"; shift ;;
    --section-rounds) SECTION_ROUNDS="$2"; shift ;;
    --shape) USER_SHAPES+=("$2"); shift ;;
    --out) OUT_DIR="$2"; shift ;;
    -h|--help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
  esac
  shift
done

# Shapes: "B Tq Tk D H causal cross" (the six of docs/benchmarks.md and bench/bench_support.hpp).
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
# The bfloat16 rows: 1 thread, the first BF16_ROUNDS rounds, so that they add minutes, not
# tens of minutes (PyTorch's bfloat16 module materialises the T x T scores as its float one does).
BF16_ROUNDS_GIVEN="$BF16_ROUNDS"
BF16_ROUNDS="${BF16_ROUNDS:-2}"
[ "$BF16_ROUNDS" -gt "$ROUNDS" ] && BF16_ROUNDS="$ROUNDS"
[ "$WANT_BF16" -eq 1 ] || BF16_ROUNDS=0
[ "${#USER_SHAPES[@]}" -gt 0 ] && SHAPES=("${USER_SHAPES[@]}")
IFS=',' read -r -a THREAD_LIST <<< "$THREADS"
PYTHON="$BENCH_PYTHON"

# ---- 1. packages and builds ----
ensure_packages "${ATTN_BASE_PACKAGES[@]}" python3-torch python3-numpy libopenblas0-pthread
if ! command -v gnuplot >/dev/null && ! "$PYTHON" -c "import matplotlib" 2>/dev/null; then
  ensure_packages gnuplot-nox || log "could not install gnuplot-nox: no plot"
fi

BUILD="${ATTN_BENCH_BUILD_DIR:-$ATTN_ROOT/build/bench}"
BUILD_DEFAULT="$BUILD-default"
TARGETS=(fma_peak mha_timer)
[ "$QUICK" -eq 1 ] || TARGETS+=(attention_bench kernel_bench softmax_bench tensor_view_bench)
BENCH_CMAKE_ARGS=(-DCMAKE_BUILD_TYPE=Release -DATTN_BUILD_BENCHMARKS=ON -DATTN_BUILD_TESTS=OFF
                  -DATTN_BUILD_EXAMPLES=OFF -DATTN_INSTALL=OFF)
log "building ${TARGETS[*]} in $BUILD (Release, -DATTN_NATIVE=ON)"
cmake -S "$ATTN_ROOT" -B "$BUILD" "${BENCH_CMAKE_ARGS[@]}" -DATTN_NATIVE=ON >/dev/null
cmake --build "$BUILD" -j "$ATTN_JOBS" --target "${TARGETS[@]}"
log "building mha_timer in $BUILD_DEFAULT (Release, -DATTN_NATIVE=OFF: the default flags)"
cmake -S "$ATTN_ROOT" -B "$BUILD_DEFAULT" "${BENCH_CMAKE_ARGS[@]}" -DATTN_NATIVE=OFF >/dev/null
cmake --build "$BUILD_DEFAULT" -j "$ATTN_JOBS" --target mha_timer

# build_flags BUILD: the compile flags mha_timer got (Makefile generator), for the report.
build_flags() {
  local f="$1/bench/CMakeFiles/mha_timer.dir/flags.make"
  if [ -f "$f" ]; then
    sed -n 's/^CXX_FLAGS = //p' "$f" | tr -s ' ' '\n' | grep -v '^-W' | paste -sd' ' -
  else
    echo "?"
  fi
}
FLAGS_NATIVE="$(build_flags "$BUILD")"
FLAGS_DEFAULT="$(build_flags "$BUILD_DEFAULT")"

# ONNX Runtime: python3-onnx writes the graphs, onnxruntime-node from npm runs them. Any
# failure leaves ORT_NOTE saying why and the ORT columns empty.
ORT_DIR="$BUILD/ort"
if [ "$WANT_ORT" -eq 0 ]; then ORT_NOTE="left out (--no-ort)"; else ort_setup "$ORT_DIR"; fi

# ---- 2. machine, settings, FMA peak ----
mkdir -p "$OUT_DIR" "$ATTN_ROOT/bench/results/tmp"
DATE="$(date -u +%Y-%m-%d)"
RAW="$ATTN_ROOT/bench/results/tmp/raw-$(date -u +%Y%m%dT%H%M%S).txt"
PEAK_FILE="${RAW%.txt}.peak"
: > "$RAW"

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
GXX="$(g++ -dumpfullversion 2>/dev/null | sed 's/^/g++ /')"
if [ -z "$ORT_NOTE" ]; then
  ORT_TEXT="ONNX Runtime $ORT_VERSION (npm onnxruntime-node, CPU execution provider, node $(node --version))"
else
  ORT_TEXT="no ONNX Runtime ($ORT_NOTE)"
fi
MACHINE="machine: ${CPU_MODEL:-unknown CPU} (family $CPU_FAMILY model $CPU_MODEL_NO), $CPUS CPUs, AVX-512: $BENCH_HAS_AVX512; $(uname -sr)
software: attn $GIT_REV built by $GXX twice, default flags ($FLAGS_DEFAULT) and native ($FLAGS_NATIVE); PyTorch $TORCH_VERSION with OpenBLAS $OPENBLAS_VERSION (pthread); $ORT_TEXT
settings: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE_SET:-unset}, MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=268435456, OMP_WAIT_POLICY attn=${ATTN_WAIT:-unset} PyTorch=${TORCH_WAIT:-unset}; attn module $ATTN_FROZEN; $ROUNDS round(s), $WARMUP warm-up call(s) then <= $REPS calls or ${MAX_SECONDS} s per process
date: $(date -u '+%Y-%m-%d %H:%M UTC')
command: $COMMAND_LINE"
log "machine"
echo "$MACHINE"
case " $FLAGS_DEFAULT " in
  *" -march="*)
    MACHINE="$MACHINE
warning: the default-flags build compiled mha_timer with -march (bench/CMakeLists.txt adds it whatever ATTN_NATIVE says): its column measures a native build"
    echo "${MACHINE##*$'\n'}" ;;
esac

log "measuring the FMA peak (threads ${THREAD_LIST[*]})"
PEAK_ARGS=(--threads "$THREADS")
[ "$QUICK" -eq 1 ] && PEAK_ARGS+=(--quick)
"$BUILD/bench/fma_peak" "${PEAK_ARGS[@]}" | tee "$PEAK_FILE"

# PyTorch 1.13 multiplies bfloat16 quickly only on AMX or AVX512-BF16 (through oneDNN). On a
# CPU with neither its bfloat16 module took 14 s per call on B1 T2048 D768 H12 (AVX2 Zen 3),
# so its T8192 rows alone would run for hours: there it is timed on shapes of at most
# 2048 x 2048 scores, and its column is n/a on the others.
TORCH_BF16_MAX_SCORES=0  # 0: every shape
TORCH_BF16_SHAPES="every shape"
if ! grep -qE '^(avx512bf16|amx_bf16)_supported=1' "$PEAK_FILE"; then
  TORCH_BF16_MAX_SCORES=$((2048 * 2048))
  TORCH_BF16_SHAPES="shapes of at most 2048 x 2048 scores"
  MACHINE="$MACHINE
note: no bfloat16 units on this CPU: PyTorch's bfloat16 module is timed only on $TORCH_BF16_SHAPES"
fi

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

if [ -z "$ORT_NOTE" ]; then
  log "writing ONNX Runtime's graphs and nn.MultiheadAttention's outputs into $ORT_DIR/graphs"
  GRAPH_ARGS=()
  for job in "${JOBS[@]}"; do
    read -r _ _ shape <<< "$job"
    printf '%s\n' "${GRAPH_ARGS[@]}" | grep -qx "$shape" || GRAPH_ARGS+=(--shape "$shape")
  done
  if ! "$PYTHON" "$ATTN_ROOT/scripts/bench/ort_graphs.py" --out "$ORT_DIR/graphs" "${GRAPH_ARGS[@]}"; then
    ORT_NOTE="scripts/bench/ort_graphs.py failed"
  fi
fi
[ -n "$ORT_NOTE" ] && log "ONNX Runtime left out: $ORT_NOTE"

# ---- 3. measurements ----
# run_one impl threads B Tq Tk D H causal cross [extra args]: one fresh process of impl
# (attn = default-flags build, attn_native, ort, pytorch; attn_bf16 and pytorch_bf16: their
# bfloat16 modules, attn's from the default-flags build) in its environment; prints its
# output (the result line starts with impl=; attn_native's is renamed from mha_timer's
# impl=attn). Fails with the output as '#' lines.
run_one() {
  local impl="$1" t="$2"; shift 2
  local shape=("${@:1:7}") extra=("${@:8}")
  local -a env_vars cmd
  local build out
  case "$impl" in
    attn|attn_native|attn_bf16)
      build="$BUILD_DEFAULT"
      [ "$impl" = attn_native ] && build="$BUILD"
      mapfile -t env_vars < <(bench_env "$t" "$ATTN_WAIT")
      cmd=("$build/bench/mha_timer" "${shape[@]}" "$t" "$REPS" --max-seconds "$MAX_SECONDS"
           --warmup "$WARMUP" "${ATTN_FREEZE_ARGS[@]}")
      [ "$impl" = attn_bf16 ] && cmd+=(--dtype bf16) ;;
    ort)
      mapfile -t env_vars < <(bench_env "$t" "")
      cmd=(node "$ATTN_ROOT/scripts/bench/ort_mha.js" "${shape[@]}" "$t" "$REPS"
           --max-seconds "$MAX_SECONDS" --warmup "$WARMUP" --graphs "$(graph_dir "$ORT_DIR" "${shape[@]}")"
           --ort "$ORT_DIR" "${extra[@]}") ;;
    pytorch|pytorch_bf16)
      mapfile -t env_vars < <(bench_env "$t" "$TORCH_WAIT")
      cmd=("$PYTHON" "$ATTN_ROOT/scripts/bench/pytorch_mha.py" "${shape[@]}" "$t" "$REPS"
           --max-seconds "$MAX_SECONDS" --warmup "$WARMUP")
      [ "$impl" = pytorch_bf16 ] && cmd+=(--dtype bf16) ;;
  esac
  # Start from a clean slate: no inherited thread, BLAS or malloc settings.
  if out="$(env -u OMP_WAIT_POLICY -u OPENBLAS_CORETYPE -u GOMP_SPINCOUNT \
              "${env_vars[@]}" "${cmd[@]}" 2>&1)"; then
    [ "$impl" = attn_native ] && out="$(sed 's/^impl=attn /impl=attn_native /' <<< "$out")"
    echo "$out"
  else
    printf '# FAILED: %s\n#   %s\n' "${cmd[*]}" "${out//$'\n'/$'\n#   '}"
    return 1
  fi
}

# measure kind impl round threads B Tq Tk D H causal cross [extra]: one fresh process;
# appends its result line to $RAW and echoes the median ms (or "failed").
measure() {
  local kind="$1" impl="$2" round="$3" t="$4"; shift 4
  local out line
  if out="$(run_one "$impl" "$t" "$@")"; then
    line="$(grep '^impl=' <<< "$out" | tail -n1)"
    grep '^variant=' <<< "$out" | sed "s/^/# $impl ${*:1:7} t=$t round=$round /" >> "$RAW" || true
    echo "kind=$kind round=$round $line" >> "$RAW"
    sed -n 's/.* median_ms=\([^ ]*\).*/\1/p' <<< "$line"
  else
    echo "$out" >> "$RAW"
    echo failed
  fi
}

# select_ort_form threads B Tq Tk D H causal cross: one ONNX Runtime process checks every
# graph of the shape and times those that pass, one after the other; its lines go to $RAW
# as kind=select ones. Echoes "<fastest graph>|<what each graph did>" (graph "none" if none ran).
select_ort_form() {
  local t="$1"; shift
  local out best summary
  if out="$(run_one ort "$t" "$@" --forms auto)"; then
    grep -E '^(variant|skipped|impl)=' <<< "$out" | sed 's/^/kind=select round=0 /' >> "$RAW"
    best="$(sed -n 's/^impl=ort .* variant=\([^ ]*\).*/\1/p' <<< "$out" | tail -n1)"
    summary="$(sed -n 's/^variant=\([^ ]*\) .* median_ms=\([^ ]*\).*/\1 \2 ms/p
                 s/^skipped=\([^ ]*\) .*/\1 skipped/p' \
                 <<< "$out" | paste -sd, - | sed 's/,/, /g')"
    echo "${best:-none}|$summary"
  else
    echo "$out" >> "$RAW"
    echo "none|failed (see $RAW)"
  fi
}

IMPLS=(attn attn_native pytorch)
[ -z "$ORT_NOTE" ] && IMPLS=(attn attn_native ort pytorch)
log "measuring ${#JOBS[@]} configurations x $ROUNDS round(s): ${IMPLS[*]}, alternating"
[ "$BF16_ROUNDS" -gt 0 ] &&
  log "and attn_bf16 (pytorch_bf16 on $TORCH_BF16_SHAPES) in the first $BF16_ROUNDS round(s) at 1 thread"
start_all=$(date +%s)
n=0
for job in "${JOBS[@]}"; do
  read -r kind t b tq tk d h causal cross <<< "$job"
  shape=("$b" "$tq" "$tk" "$d" "$h" "$causal" "$cross")
  name="$(shape_label "${shape[@]}")"
  n=$((n + 1))
  start_job=$(date +%s)
  form=""
  if [ -z "$ORT_NOTE" ]; then
    selected="$(select_ort_form "$t" "${shape[@]}")"
    form="${selected%%|*}"
    printf '  [%d/%d] %-34s threads=%s: ONNX Runtime graphs: %s\n' "$n" "${#JOBS[@]}" "$name" "$t" \
      "${selected#*|}"
  fi
  for round in $(seq 1 "$ROUNDS"); do
    impls=("${IMPLS[@]}")
    with_bf16=0
    if [ "$kind" = main ] && [ "$t" = 1 ] && [ "$round" -le "$BF16_ROUNDS" ]; then
      impls+=(attn_bf16) with_bf16=1
      if [ "$TORCH_BF16_MAX_SCORES" -eq 0 ] || [ $((tq * tk)) -le "$TORCH_BF16_MAX_SCORES" ]; then
        impls+=(pytorch_bf16)
      fi
    fi
    # Rotate who goes first, so drifts in machine load hit every side alike.
    k=$(( (round - 1) % ${#impls[@]} ))
    order=("${impls[@]:k}" "${impls[@]:0:k}")
    declare -A ms=()
    for impl in "${order[@]}"; do
      if [ "$impl" = ort ]; then
        if [ "$form" = none ]; then ms[ort]=failed; continue; fi
        ms[ort]="$(measure "$kind" ort "$round" "$t" "${shape[@]}" --forms "$form")"
      else
        ms[$impl]="$(measure "$kind" "$impl" "$round" "$t" "${shape[@]}")"
      fi
    done
    ort_text=""
    [ -n "$form" ] && ort_text="ONNX Runtime ($form) ${ms[ort]} ms, "
    bf16_text=""
    [ "$with_bf16" -eq 1 ] && bf16_text="; bf16: attn ${ms[attn_bf16]} ms, PyTorch ${ms[pytorch_bf16]:-n/a} ms"
    printf '  [%d/%d] %-34s threads=%s round %s: attn %s ms, attn native %s ms, %sPyTorch %s ms%s\n' \
      "$n" "${#JOBS[@]}" "$name" "$t" "$round" "${ms[attn]}" "${ms[attn_native]}" "$ort_text" \
      "${ms[pytorch]}" "$bf16_text"
    unset ms
  done
  printf '  [%d/%d] %-34s threads=%s: %d s\n' "$n" "${#JOBS[@]}" "$name" "$t" "$(( $(date +%s) - start_job ))"
done
log "measured in $(( $(date +%s) - start_all )) s"

# The peak again, now that the machine is warm: the report takes the better of the two.
log "measuring the FMA peak again"
"$BUILD/bench/fma_peak" "${PEAK_ARGS[@]}" | tee -a "$PEAK_FILE"

# ---- 4. report (the summary line is the last line printed) ----
CSV="$OUT_DIR/$DATE.csv"
PNG="$OUT_DIR/gflops_vs_seqlen.png"
TXT="$OUT_DIR/$DATE.txt"
REPORT_ARGS=(--raw "$RAW" --peak "$PEAK_FILE" --csv "$CSV" --plot "$PNG"
             --title-extra "$CPU_MODEL ($CPUS CPUs), $DATE, $COMMAND_LINE")
[ -n "$ORT_NOTE" ] && REPORT_ARGS+=(--ort-note "$ORT_NOTE")
[ "$WANT_BF16" -eq 0 ] && REPORT_ARGS+=(--bf16-note "left out (--no-bf16)")
log "results"
{
  echo "$MACHINE"
  echo
  "$PYTHON" "$ATTN_ROOT/scripts/bench/report.py" "${REPORT_ARGS[@]}"
} | tee "$TXT"

# ---- 5. the decode, training and variants sections; one summary line for all ----
SUMMARY="$(grep '^summary:' "$TXT" | tail -n 1)"
[ -n "$SUMMARY" ] || SUMMARY="summary:"
# run_section NAME SCRIPT LOG PREFIX ARGS...: runs scripts/bench/SCRIPT, its printout into LOG,
# and appends the fields of its last "PREFIX: ..." line to SUMMARY (or NAME=failed).
run_section() {
  local name="$1" script="$2" section_log="$3" prefix="$4" line
  shift 4
  log "$name section (scripts/bench/$script)"
  if bash "$ATTN_ROOT/scripts/bench/$script" "$@" | tee "$section_log"; then
    line="$(grep "^$prefix:" "$section_log" | tail -n 1)"
    SUMMARY="$SUMMARY ${line#"$prefix: "}"
  else
    SUMMARY="$SUMMARY $name=failed"
  fi
}
QUICK_ARG=()
[ "$QUICK" -eq 1 ] && QUICK_ARG=(--quick)
SECTION_ARG=(--rounds "$SECTION_ROUNDS")  # the decode and training sections' (--quick: its own)
[ "$QUICK" -eq 1 ] && SECTION_ARG=(--quick)
BF16_ARG=()
[ "$WANT_BF16" -eq 0 ] && BF16_ARG=(--no-bf16)
DECODE_BF16_ARG=("${BF16_ARG[@]}")
[ -n "$BF16_ROUNDS_GIVEN" ] && DECODE_BF16_ARG+=(--bf16-rounds "$BF16_ROUNDS_GIVEN")
if [ "$WANT_DECODE" -eq 1 ]; then
  run_section decode decode.sh "$OUT_DIR/$DATE-decode.log" summary \
    --out "$OUT_DIR" --threads "$THREADS" "${SECTION_ARG[@]}" "${DECODE_BF16_ARG[@]}"
fi
if [ "$WANT_TRAIN" -eq 1 ]; then
  run_section train train.sh "$OUT_DIR/$DATE-train.txt" train_summary \
    --threads "$THREADS" --raw "$OUT_DIR/$DATE-train-raw.txt" "${SECTION_ARG[@]}" "${BF16_ARG[@]}"
fi
if [ "$WANT_VARIANTS" -eq 1 ]; then
  run_section variants variants.sh "$OUT_DIR/$DATE-variants.txt" variants_summary \
    "${QUICK_ARG[@]}"
fi
echo "$SUMMARY" | tee -a "$TXT"
