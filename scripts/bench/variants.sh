#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scripts/bench/variants.sh: what each attention variant (softcap, learned sinks, ALiBi) costs
# over the plain kernel, scaled_dot_product_attention's streaming path in float:
#   1. installs what is missing and builds bench/kernel_bench with the project's default flags
#      (what a consumer gets; ATTN_BENCH_BUILD_DIR, default build/bench, with -default
#      appended as scripts/bench_vs_pytorch.sh does);
#   2. runs its BM_ScaledDotProduct_Variant rows (B8 T512 D512 H8 causal and not, B1 T8192
#      causal), OMP_NUM_THREADS=1, --reps repetitions: each iteration times one plain call and
#      one with the variant in alternating order, and a row's ratio is the median of its
#      per-iteration ratios; the table shows the median of the repetitions' ratios;
#   3. prints the table and, as the very last line,
#        variants_summary: variants_overhead_max=X.XXX
#      (the largest ratio - 1 over every variant and shape; the `plain` rows, plain against
#      plain, show the noise floor and are left out).
#   scripts/bench/variants.sh [--quick] [--reps N] [--json FILE]
#   --quick: one repetition, B8 T512 only (a smoke test of the script, not a figure).
# scripts/bench_vs_pytorch.sh runs it and appends its last line to its own summary.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
source "$(dirname "$0")/env.sh"

usage() {
  sed -n '3,19p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

QUICK=0 REPS=3 JSON=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; REPS=1 ;;
    --reps) REPS="$2"; shift ;;
    --json) JSON="$2"; shift ;;
    -h|--help) usage ;;
    *) echo "unknown argument '$1'" >&2; usage ;;
  esac
  shift
done

# ---- 1. packages and build ----
ensure_packages "${ATTN_BASE_PACKAGES[@]}"
BUILD="${ATTN_BENCH_BUILD_DIR:-$ATTN_ROOT/build/bench}-default"
log "building kernel_bench in ${BUILD#"$ATTN_ROOT"/} (Release, default flags)"
cmake -S "$ATTN_ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DATTN_BUILD_BENCHMARKS=ON \
  -DATTN_BUILD_TESTS=OFF -DATTN_BUILD_EXAMPLES=OFF -DATTN_INSTALL=OFF -DATTN_NATIVE=OFF >/dev/null
cmake --build "$BUILD" -j "$ATTN_JOBS" --target kernel_bench

# ---- 2. the measurements ----
mkdir -p "$ATTN_ROOT/bench/results/tmp"
JSON="${JSON:-$ATTN_ROOT/bench/results/tmp/variants-$(date -u +%Y%m%dT%H%M%S).json}"
FILTER='BM_ScaledDotProduct_Variant'
[ "$QUICK" -eq 1 ] && FILTER='BM_ScaledDotProduct_Variant/B:8/'
log "timing the variants ($REPS repetitions, 1 thread)"
mapfile -t vars < <(bench_env 1 "${ATTN_BENCH_ATTN_WAIT_POLICY-ACTIVE}")
env -u OMP_WAIT_POLICY -u OPENBLAS_CORETYPE -u GOMP_SPINCOUNT "${vars[@]}" \
  "$BUILD/bench/kernel_bench" --benchmark_filter="$FILTER" \
  --benchmark_repetitions="$REPS" --benchmark_format=json --benchmark_out="$JSON" \
  --benchmark_out_format=json >/dev/null

# ---- 3. the table and the summary line ----
"$BENCH_PYTHON" - "$JSON" <<'PY'
import json, statistics, sys
runs = json.load(open(sys.argv[1]))
print(f"kernel set: {runs['context'].get('attn_isa', '?')}")
rows = {}
for b in runs["benchmarks"]:
    if b.get("run_type") != "iteration":
        continue
    rows.setdefault(b["run_name"], []).append(b)
print(f"{'shape':28s} {'variant':8s} {'plain ms':>9s} {'variant ms':>10s} {'ratio':>7s} "
      f"{'min':>7s} {'max':>7s}")
overheads = []
for name, reps in rows.items():
    parts = dict(p.split(":") for p in name.split("/")[1:] if ":" in p)
    shape = f"B{parts['B']} T{parts['T']} D{parts['D']} H{parts['H']}" + (
        " causal" if parts["causal"] == "1" else "")
    variant = ["plain", "softcap", "sinks", "alibi"][int(parts["variant"])]
    ratios = [r["ratio"] for r in reps]
    ratio = statistics.median(ratios)
    if variant != "plain":
        overheads.append(ratio - 1)
    print(f"{shape:28s} {variant:8s} {statistics.median(r['plain_ms'] for r in reps):9.2f} "
          f"{statistics.median(r['variant_ms'] for r in reps):10.2f} {ratio:7.3f} "
          f"{min(ratios):7.3f} {max(ratios):7.3f}")
print("variants_summary: variants_overhead_max=%.3f"
      % (max(overheads) if overheads else float("nan")))
PY
