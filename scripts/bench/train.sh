#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scripts/bench/train.sh: one training step (forward + backward) of attn's MultiHeadAttention
# against PyTorch 1.13 autograd (nn.MultiheadAttention, loss.backward()), and attn's bfloat16
# module's step (MultiHeadAttention<bfloat16>) against its float one:
#   1. installs what is missing and builds bench/train_timer and bench/fma_peak with the
#      project's default flags (what a consumer gets; ATTN_BENCH_BUILD_DIR, default
#      build/bench, with -default appended as scripts/bench_vs_pytorch.sh does);
#   2. measures the machine's FMA peak (bench/fma_peak);
#   3. for every shape and thread count, several rounds of fresh processes, alternating who
#      goes first: attn (bench/train_timer), attn bfloat16 (train_timer --bf16) and PyTorch
#      (scripts/bench/pytorch_train.py), each in scripts/bench/env.sh's environment; the
#      median of the per-process medians;
#   4. prints the table (ms per step, speedup, attn's GFLOP/s and % of the FMA peak with the
#      backward counted as 2.5x the forward's attention plus 2x its projections, peak RSS of
#      each process), attn's float and bfloat16 CPU time per step (all threads' time, which a
#      shared machine disturbs less than the wall clock) and their ratio, and, as the very
#      last line,
#        train_summary: train_speedup_min=X.XX train_peak_fraction_best=0.XX
#                       bf16_train_vs_fp32_min=X.XX
#      (speedup_min over every shape and thread count; peak fraction: attn's best GFLOP/s
#      over the FMA peak of the same thread count; bf16_train_vs_fp32_min: the smallest
#      float CPU time over bfloat16 CPU time, above 1 where the bfloat16 step is faster).
# Shapes: B8 T512 D512 H8, and causal B1 T2048 / T8192 D512 H8, at 1 and 2
# threads. PyTorch's causal T8192 step materialises (B H, T, T) attention several times over
# (~10 GiB); a shape whose estimate exceeds 80% of MemAvailable is skipped on PyTorch's side
# and reported as such (its speedup is then left out of the minimum).
#   scripts/bench/train.sh [--quick] [--threads 1,2] [--rounds N] [--reps N]
#                          [--max-seconds S] [--shape "B T D H causal"]... [--raw FILE]
#                          [--no-pytorch] [--no-bf16]
#   --quick: two small shapes, one round, 3 reps (a smoke test of the script, not a figure).
#   --no-pytorch / --no-bf16: skip that side (its columns and summary fields are then nan).
# scripts/bench_vs_pytorch.sh can run it and append its last line to its own summary.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
source "$(dirname "$0")/env.sh"

usage() {
  sed -n '3,35p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

QUICK=0 ROUNDS="" REPS="" MAX_SECONDS="" THREADS="1,2" RAW="" WARMUP=1 PYTORCH=1 BF16=1
USER_SHAPES=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --rounds) ROUNDS="$2"; shift ;;
    --reps) REPS="$2"; shift ;;
    --max-seconds) MAX_SECONDS="$2"; shift ;;
    --threads) THREADS="$2"; shift ;;
    --shape) USER_SHAPES+=("$2"); shift ;;
    --raw) RAW="$2"; shift ;;
    --no-pytorch) PYTORCH=0 ;;
    --no-bf16) BF16=0 ;;
    -h|--help) usage ;;
    *) echo "unknown argument '$1'" >&2; usage ;;
  esac
  shift
done
if [ "$QUICK" -eq 1 ]; then
  SHAPES=("2 128 128 4 0" "1 512 256 4 1")
  ROUNDS="${ROUNDS:-1}" REPS="${REPS:-3}" MAX_SECONDS="${MAX_SECONDS:-1}"
else
  SHAPES=("8 512 512 8 0" "1 2048 512 8 1" "1 8192 512 8 1")
  ROUNDS="${ROUNDS:-3}" REPS="${REPS:-10}" MAX_SECONDS="${MAX_SECONDS:-5}"
fi
[ "${#USER_SHAPES[@]}" -gt 0 ] && SHAPES=("${USER_SHAPES[@]}")
IFS=',' read -r -a THREAD_LIST <<< "$THREADS"

# ---- 1. packages and build ----
if [ "$PYTORCH" -eq 1 ]; then
  ensure_packages "${ATTN_BASE_PACKAGES[@]}" python3-torch python3-numpy libopenblas0-pthread
else
  ensure_packages "${ATTN_BASE_PACKAGES[@]}"
fi
BUILD="${ATTN_BENCH_BUILD_DIR:-$ATTN_ROOT/build/bench}-default"
log "building train_timer and fma_peak in ${BUILD#"$ATTN_ROOT"/} (Release, default flags)"
cmake -S "$ATTN_ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DATTN_BUILD_BENCHMARKS=ON \
  -DATTN_BUILD_TESTS=OFF -DATTN_BUILD_EXAMPLES=OFF -DATTN_INSTALL=OFF -DATTN_NATIVE=OFF >/dev/null
cmake --build "$BUILD" -j "$ATTN_JOBS" --target train_timer fma_peak

# ---- 2. the FMA peak ----
mkdir -p "$ATTN_ROOT/bench/results/tmp"
RAW="${RAW:-$ATTN_ROOT/bench/results/tmp/train-raw-$(date -u +%Y%m%dT%H%M%S).txt}"
: > "$RAW"
log "measuring the FMA peak (threads ${THREAD_LIST[*]})"
PEAK_ARGS=(--threads "$THREADS")
[ "$QUICK" -eq 1 ] && PEAK_ARGS+=(--quick)
"$BUILD/bench/fma_peak" "${PEAK_ARGS[@]}" | tee -a "$RAW"

# ---- 3. the measurements ----
mem_available_kib() { sed -n 's/^MemAvailable:[[:space:]]*\([0-9]*\).*/\1/p' /proc/meminfo; }
# run_one impl threads B T D H causal: one fresh process, its result line appended to RAW.
run_one() {
  local impl="$1" t="$2" b="$3" tt="$4" d="$5" h="$6" c="$7"
  local wait="" cmd
  if [ "$impl" = attn ] || [ "$impl" = attn_bf16 ]; then
    wait="${ATTN_BENCH_ATTN_WAIT_POLICY-ACTIVE}"
    cmd=("$BUILD/bench/train_timer" "$b" "$tt" "$d" "$h" "$c" "$t" "$REPS"
         --max-seconds "$MAX_SECONDS" --warmup "$WARMUP")
    [ "$impl" = attn_bf16 ] && cmd+=(--bf16)
  else
    wait="${ATTN_BENCH_TORCH_WAIT_POLICY-}"
    # PyTorch keeps about five (B H, T, T) float tensors alive in its step.
    local need_kib=$(( 5 * b * h * tt * tt * 4 / 1024 ))
    if [ "$need_kib" -gt $(( $(mem_available_kib) * 8 / 10 )) ]; then
      echo "impl=pytorch B=$b T=$tt D=$d H=$h causal=$c threads=$t skipped=needs_$(( need_kib / 1048576 ))GiB" | tee -a "$RAW"
      return
    fi
    cmd=("$BENCH_PYTHON" "$ATTN_ROOT/scripts/bench/pytorch_train.py" "$b" "$tt" "$d" "$h" "$c"
         "$t" "$REPS" --max-seconds "$MAX_SECONDS" --warmup "$WARMUP")
  fi
  local vars
  mapfile -t vars < <(bench_env "$t" "$wait")
  env -u OMP_WAIT_POLICY -u OPENBLAS_CORETYPE -u GOMP_SPINCOUNT "${vars[@]}" "${cmd[@]}" \
    | grep '^impl=' | tee -a "$RAW" || echo "impl=$impl B=$b T=$tt D=$d H=$h causal=$c threads=$t failed=1" | tee -a "$RAW"
}

for round in $(seq 1 "$ROUNDS"); do
  for shape in "${SHAPES[@]}"; do
    for t in "${THREAD_LIST[@]}"; do
      log "round $round: B T D H causal = $shape, $t thread(s)"
      # shellcheck disable=SC2086
      impls=(attn)
      [ "$BF16" -eq 1 ] && impls+=(attn_bf16)
      [ "$PYTORCH" -eq 1 ] && impls+=(pytorch)
      if [ $(( round % 2 )) -eq 0 ]; then  # the other order
        for (( i = 0, j = ${#impls[@]} - 1; i < j; i++, j-- )); do
          tmp="${impls[i]}" impls[i]="${impls[j]}" impls[j]="$tmp"
        done
      fi
      for impl in "${impls[@]}"; do
        # shellcheck disable=SC2086
        run_one "$impl" "$t" $shape
      done
    done
  done
done

# ---- 4. the table and the summary line ----
"$BENCH_PYTHON" - "$RAW" <<'PY'
import re, statistics, sys
rows, peak = {}, {}
for line in open(sys.argv[1]):
    m = re.match(r"peak_t(\d+)_gflops=([\d.]+)", line)
    if m:
        peak[int(m.group(1))] = max(peak.get(int(m.group(1)), 0.0), float(m.group(2)))
    if not line.startswith("impl="):
        continue
    f = dict(kv.split("=", 1) for kv in line.split())
    key = (f["B"], f["T"], f["D"], f["H"], f["causal"], int(f["threads"]))
    r = rows.setdefault(key, {})
    impl = f["impl"]
    if "skipped" in f or "failed" in f:
        r.setdefault(impl + "_note", f.get("skipped", "failed"))
        continue
    r.setdefault(impl, []).append((float(f["median_ms"]), float(f["gflops"]),
                                   float(f["max_rss_mib"]), float(f.get("cpu_ms", "nan"))))
print(f"{'shape':28s} {'thr':>3s} {'attn ms':>9s} {'torch ms':>9s} {'speedup':>8s} "
      f"{'attn GF/s':>9s} {'% peak':>7s} {'attn MiB':>9s} {'torch MiB':>9s} "
      f"{'fp32 cpu':>9s} {'bf16 cpu':>9s} {'fp32/bf16':>9s} {'bf16 MiB':>9s}")
speedups, fractions, bf16_ratios = [], [], []
for key in sorted(rows, key=lambda k: (int(k[1]), k[5])):
    b, t, d, h, c, thr = key
    r = rows[key]
    name = f"B{b} T{t} D{d} H{h}" + (" causal" if c == "1" else "")
    def med(impl, i):
        return statistics.median(x[i] for x in r[impl]) if impl in r else float("nan")
    a_ms, p_ms = med("attn", 0), med("pytorch", 0)
    a_gf = med("attn", 1)
    frac = a_gf / peak[thr] if thr in peak and peak[thr] > 0 else float("nan")
    sp = p_ms / a_ms if "attn" in r and "pytorch" in r else float("nan")
    if sp == sp:
        speedups.append(sp)
    if frac == frac:
        fractions.append(frac)
    torch_ms = f"{p_ms:9.2f}" if "pytorch" in r else f"{r.get('pytorch_note', '-'):>9s}"
    a_cpu, b_cpu = med("attn", 3), med("attn_bf16", 3)
    ratio = a_cpu / b_cpu if "attn" in r and "attn_bf16" in r else float("nan")
    if ratio == ratio:
        bf16_ratios.append(ratio)
    print(f"{name:28s} {thr:3d} {a_ms:9.2f} {torch_ms} {sp:8.2f} {a_gf:9.1f} "
          f"{100 * frac:6.1f}% {med('attn', 2):9.1f} {med('pytorch', 2):9.1f} "
          f"{a_cpu:9.2f} {b_cpu:9.2f} {ratio:9.2f} {med('attn_bf16', 2):9.1f}")
print(f"FMA peak (GFLOP/s): {', '.join(f'{k} thread(s) {v:.1f}' for k, v in sorted(peak.items()))}")
print("train_summary: train_speedup_min=%.2f train_peak_fraction_best=%.2f "
      "bf16_train_vs_fp32_min=%.2f"
      % (min(speedups) if speedups else float("nan"),
         max(fractions) if fractions else float("nan"),
         min(bf16_ratios) if bf16_ratios else float("nan")))
PY
