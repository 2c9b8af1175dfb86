#!/usr/bin/env bash
# The decode benchmarks, a section of scripts/bench_vs_pytorch.sh that
# also runs alone: one generation step of a Llama-3-8B-shaped attention layer (D 4096, H 32,
# H_kv 8, hd 128, RoPE, frozen float32 weights) after L cached tokens, attn
# (bench/decode_timer: MultiHeadAttention's incremental forward through a KVCache) against
# PyTorch 1.13 (scripts/bench/pytorch_decode.py: LlamaAttention by hand with its best cache,
# index_copy_ or torch.cat, grouped or repeat_kv), and against the machine's memory bandwidth
# (bench/stream_bandwidth, the 8-accumulator streaming read, median, per thread count).
#   1. builds decode_timer and stream_bandwidth (default flags, the consumer's build);
#   2. measures the bandwidth at 1 and 2 threads;
#   3. for op in decode (T_new = 1) and prefill (a 128-token chunk), B in 1 and 4, L in
#      512, 2048 and 8192 (--lengths; the 2026-11-25 run also had 1024 and 4096: two fewer
#      lengths shorten the whole command, which the bfloat16 rows had taken past an hour by
#      estimate) and threads 1 and 2: one attn process
#      and one PyTorch process each,
#      alternating who goes first, --rounds times, keeping each side's fastest median;
#   4. the attention of a decode step alone (decode_timer attend) per KV cache element type
#      (--kv-dtypes; KVCacheOptions::element), B in --kv-batches, L in --kv-lengths: its time,
#      the cache bytes per token, GB/s of the cache bytes read, its CPU time, the cache bytes
#      per CPU second as a fraction of the streaming read's (measured in the run, before each
#      configuration's rows: the in-run bandwidth) and the speedup over the f32 cache (CPU
#      times: on a shared machine the wall time also counts waits for a core) (written to
#      <out>/kv_cache.csv/.txt); with --paged-block S (default 16; 0: off) each of these runs
#      again beside it through a PagedKVCache of blocks of S tokens (decode_timer --paged
#      S --fill S --paired: the items appended S tokens at a time, side by side, as sequences
#      decoded together take their blocks; a contiguous and a paged cache holding the same
#      tokens timed alternately in one process, so that the machine's noise hits both alike),
#      and the table adds the paged CPU time and the median over rounds of contiguous / paged
#      CPU time; the types of a
#      configuration run adjacent, their order (and contiguous / paged) reversed every other
#      round; each row is the round with the median CPU time; one round (--kv-rounds) by
#      default: 36 processes of up to 4 s;
#      Step 3's decode steps at --bf16-threads (default 1) also run the bfloat16 module
#      (decode_timer --dtype bf16: MultiHeadAttention<bfloat16>, the float module's weights
#      rounded, with a KVCache<bfloat16>) in the first --bf16-rounds (2) rounds, its place in
#      the order rotating with the other two (--no-bf16: not run);
#   5. prints the table (step time, GB/s = bytes the step must read / time, that as a fraction
#      of the bandwidth, PyTorch's time and the speedup), the bfloat16 decode rows (CPU time
#      per step of the float and the bfloat16 module, median over the rounds, and their ratio)
#      and, last, one line:
#        summary: decode_bw_fraction_min=0.XX decode_speedup_min=X.XX prefill_chunk_speedup_min=X.XX
#                 paged_vs_contiguous_min=X.XX kv_int8_decode_vs_fp32_min=X.XX
#                 kv_int8_bw_fraction_min=0.XX kv_int4_decode_vs_fp32_min=X.XX
#                 kv_int4_bw_fraction_min=0.XX bf16_decode_vs_fp32_min=X.XX
#      decode_bw_fraction_min: the smallest bandwidth fraction of the B = 1 decode rows;
#      decode_speedup_min / prefill_chunk_speedup_min: the smallest PyTorch / attn time ratio
#      over the decode / prefill rows; paged_vs_contiguous_min: the smallest contiguous /
#      paged CPU time ratio over step 4's rows (1: paged as fast; below 1: slower);
#      kv_int8_decode_vs_fp32_min: the smallest f32 / int8 CPU time ratio of step 4's
#      contiguous rows at L >= 4096, and kv_int8_bw_fraction_min the smallest fraction of the
#      in-run bandwidth (at the row's thread count) those int8 rows read their cache bytes at
#      (per CPU second); kv_int4_*: the same for int4. --kv-only prints these too, on
#      kv_cache.txt's last lines. bf16_decode_vs_fp32_min: the smallest float / bfloat16 CPU
#      time ratio of a decode step over the bfloat16 rows at L >= 2048 (above 1: the bfloat16
#      module is faster; nan without them; the shorter rows are printed, not counted: there
#      the step is mostly the projections).
# Writes <out>/decode.csv (one row per configuration and implementation), <out>/decode.txt
# (what was printed) and <out>/decode_step_vs_length.png (gnuplot, when installed).
# Usage: scripts/bench/decode.sh [--quick] [--rounds N] [--reps N] [--threads 1,2]
#                                [--batches 1,4] [--lengths 512,...] [--out DIR]
#                                [--kv-dtypes f32,int8,...] [--kv-batches 1,8]
#                                [--kv-lengths 2048,...] [--kv-only] [--paged-block S]
#                                [--kv-rounds N] [--kv-threads 1] [--no-bf16]
#                                [--bf16-threads 1] [--bf16-rounds 2]
#   --quick    B 1, L 512 and 2048, 1 thread, one round of 3 reps (unless given): a smoke test
#   --kv-only  step 4 alone (no PyTorch)
#   --paged-block S  step 4's paged runs in blocks of S tokens (0: none)
#   --kv-rounds N, --kv-threads T  step 4's rounds (1) and thread counts (1)
#   --no-bf16  no bfloat16 decode rows; --bf16-threads L, --bf16-rounds N: their thread
#              counts (1) and rounds (the first 2)
# Settings: scripts/bench/env.sh's bench_env (threads for every layer, glibc malloc kept,
# OpenBLAS's kernels); attn gets OMP_WAIT_POLICY=ACTIVE, PyTorch the default, as in
# bench_vs_pytorch.sh. ATTN_BENCH_BUILD_DIR changes the build directory.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
source "$(dirname "$0")/env.sh"

quick=0 rounds="" reps="" threads_list="" batches="" lengths="" out=""
kv_dtypes="" kv_batches="" kv_lengths="" kv_only=0 paged_block=16 kv_rounds="" kv_threads=""
bf16=1 bf16_threads=1 bf16_rounds=2
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --rounds) rounds="$2"; shift ;;
    --reps) reps="$2"; shift ;;
    --threads) threads_list="$2"; shift ;;
    --batches) batches="$2"; shift ;;
    --lengths) lengths="$2"; shift ;;
    --out) out="$2"; shift ;;
    --kv-dtypes) kv_dtypes="$2"; shift ;;
    --kv-batches) kv_batches="$2"; shift ;;
    --kv-lengths) kv_lengths="$2"; shift ;;
    --kv-only) kv_only=1 ;;
    --paged-block) paged_block="$2"; shift ;;
    --kv-rounds) kv_rounds="$2"; shift ;;
    --kv-threads) kv_threads="$2"; shift ;;
    --no-bf16) bf16=0 ;;
    --bf16-threads) bf16_threads="$2"; shift ;;
    --bf16-rounds) bf16_rounds="$2"; shift ;;
    -h|--help) sed -n '2,65p' "$0"; exit 0 ;;
    *) echo "decode.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$quick" = 1 ]; then  # defaults of a smoke run; options given still win
  rounds="${rounds:-1}" reps="${reps:-3}" threads_list="${threads_list:-1}" batches="${batches:-1}"
  lengths="${lengths:-512,2048}" out="${out:-$ATTN_ROOT/bench/results/tmp}"
fi
rounds="${rounds:-3}" reps="${reps:-10}" threads_list="${threads_list:-1,2}"
batches="${batches:-1,4}" lengths="${lengths:-512,2048,8192}"
out="${out:-$ATTN_ROOT/bench/results}"
kv_dtypes="${kv_dtypes:-f32,int8,int4}" kv_batches="${kv_batches:-1,8}"
kv_lengths="${kv_lengths:-$([ "$quick" = 1 ] && echo 2048 || echo 2048,8192,32768)}"
kv_rounds="${kv_rounds:-1}" kv_threads="${kv_threads:-1}"
max_seconds=$([ "$quick" = 1 ] && echo 1 || echo 4)
mkdir -p "$out"

if [ "$kv_only" = 1 ]; then
  ensure_packages "${ATTN_BASE_PACKAGES[@]}" python3
else
  ensure_packages "${ATTN_BASE_PACKAGES[@]}" python3-torch python3-numpy libopenblas0-pthread
fi
# The default-flags build tree bench_vs_pytorch.sh and train.sh use (same cache variables).
build="${ATTN_BENCH_BUILD_DIR:-$ATTN_ROOT/build/bench}-default"
log "building decode_timer and stream_bandwidth in ${build#"$ATTN_ROOT"/}"
cmake -S "$ATTN_ROOT" -B "$build" -DCMAKE_BUILD_TYPE=Release -DATTN_BUILD_BENCHMARKS=ON \
  -DATTN_BUILD_TESTS=OFF -DATTN_BUILD_EXAMPLES=OFF -DATTN_INSTALL=OFF -DATTN_NATIVE=OFF >/dev/null
cmake --build "$build" --target decode_timer stream_bandwidth -j "$ATTN_JOBS" >/dev/null

raw="$out/decode.raw"
: >"$raw"
run_env() {  # run_env threads wait_policy command...: one measured process
  local t="$1" wait="$2"
  shift 2
  mapfile -t vars < <(bench_env "$t" "$wait")
  env -u OMP_WAIT_POLICY -u OPENBLAS_CORETYPE -u GOMP_SPINCOUNT "${vars[@]}" "$@"
}

log "memory bandwidth (bench/stream_bandwidth)"
for t in ${threads_list//,/ }; do
  run_env "$t" ACTIVE "$build/bench/stream_bandwidth" --threads "$t" \
    --runs "$([ "$quick" = 1 ] && echo 3 || echo 10)" | tee -a "$raw"
done

log "decode attention per KV cache element type (bench/decode_timer attend)"
# Per round and configuration (B, L, threads): the streaming read (its CPU-time figure, the
# in-run bandwidth), then every element type, contiguous and paged, adjacent; the order of the
# types and of contiguous / paged reversed every other round.
kv_raw="$out/kv_cache.raw"
: >"$kv_raw"
read -r -a dtypes <<<"${kv_dtypes//,/ }"
for ((r = 0; r < kv_rounds; ++r)); do
  order=("${dtypes[@]}")
  if ((r % 2 == 1)); then
    order=()
    for ((i = ${#dtypes[@]} - 1; i >= 0; --i)); do order+=("${dtypes[$i]}"); done
  fi
  pagings=(0)
  if [ "$paged_block" != 0 ]; then
    pagings=(0 "$paged_block")
    ((r % 2 == 1)) && pagings=("$paged_block" 0)
  fi
  for b in ${kv_batches//,/ }; do
    for l in ${kv_lengths//,/ }; do
      for t in ${kv_threads//,/ }; do
        run_env "$t" ACTIVE "$build/bench/stream_bandwidth" --threads "$t" --runs 3 \
          | sed 's/^stream /stream_in_run /' | tee -a "$kv_raw"
        for dtype in "${order[@]}"; do
          for paged in "${pagings[@]}"; do
            if [ "$paged" = 0 ]; then
              run_env "$t" ACTIVE "$build/bench/decode_timer" attend "$b" "$l" "$t" "$reps" \
                --max-seconds "$max_seconds" --kv-dtype "$dtype" | tee -a "$kv_raw"
            else
              run_env "$t" ACTIVE "$build/bench/decode_timer" attend "$b" "$l" "$t" "$reps" \
                --kv-dtype "$dtype" --paged "$paged" --fill "$paged" --paired | tee -a "$kv_raw"
            fi
          done
        done
      done
    done
  done
done
grep '^stream' "$raw" >>"$kv_raw"
"$BENCH_PYTHON" - "$kv_raw" "$out" <<'PY' | tee "$out/kv_cache.txt"
import csv, os, statistics, sys
raw, out = sys.argv[1], sys.argv[2]
in_run, runs, paired = {}, {}, {}
for line in open(raw):
    f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
    if line.startswith("stream_in_run") and f.get("kernel") == "read":
        in_run.setdefault(int(f["threads"]), []).append(float(f["median_cpu_gbps"]))
    elif line.startswith("impl=") and "paged_speed" in f:  # a paired contiguous / paged run
        paired.setdefault((f["kv_dtype"], int(f["B"]), int(f["L"]), int(f["threads"])),
                          []).append(f)
    elif line.startswith("impl="):
        f.setdefault("median_cpu_ms", f["median_ms"])
        key = (f["kv_dtype"], int(f["B"]), int(f["L"]), int(f["threads"]), int(f.get("paged", 0)))
        runs.setdefault(key, []).append(f)
# Each configuration: the round whose CPU time is the median (the lower one of an even count).
rows = {k: sorted(v, key=lambda f: float(f["median_cpu_ms"]))[(len(v) - 1) // 2]
        for k, v in runs.items()}
pages = {k: sorted(v, key=lambda f: float(f["paged_speed"]))[(len(v) - 1) // 2]
         for k, v in paired.items()}
# The bandwidth: the streaming read's bytes per CPU second, median over the run's measures.
bw = {t: statistics.median(v) for t, v in in_run.items()}
cpu = lambda f: float(f["median_cpu_ms"])
cpu_gbps = lambda f: int(f["B"]) * int(f["L"]) * int(f["token_bytes"]) / cpu(f) * 1e-6
print("streaming read in the run (bytes per CPU second, median): "
      + ", ".join(f"{t} thread(s) {g:.2f} GB/s" for t, g in sorted(bw.items())))
print("decode attention alone (H 32, H_kv 8, hd 128, one query per head) per cache type; "
      "ratios of CPU times")
print(f"{'dtype':9s}{'B':>3s}{'L':>7s}{'thr':>4s}{'B/token':>9s}{'ms':>9s}{'GB/s':>8s}"
      f"{'cpu ms':>9s}{'GB/s cpu':>9s}{'of bw':>7s}{'vs f32':>8s}{'paged cpu':>11s}{'vs paged':>9s}")
ratios = []
with open(os.path.join(out, "kv_cache.csv"), "w", newline="") as fcsv:
    w = csv.writer(fcsv)
    w.writerow(["kv_dtype", "B", "L", "threads", "paged", "token_bytes", "median_ms", "min_ms",
                "median_cpu_ms", "gbps", "bw_fraction", "speedup_vs_f32", "contiguous_vs_paged"])
    for key in sorted(rows, key=lambda k: (k[1], k[2], k[3], k[0], k[4])):
        f, f32 = rows[key], rows.get(("f32",) + key[1:4] + (0,))
        frac = cpu_gbps(f) / bw[key[3]] if key[3] in bw else float("nan")
        speed = cpu(f32) / cpu(f) if f32 else float("nan")
        w.writerow([key[0], key[1], key[2], key[3], key[4], f["token_bytes"], f["median_ms"],
                    f["min_ms"], f["median_cpu_ms"], f["gbps"], f"{frac:.3f}", f"{speed:.2f}", ""])
        p = pages.get(key[:4])
        p_cpu = float(p["paged_cpu_ms"]) if p else float("nan")
        r = float(p["paged_speed"]) if p else float("nan")
        if p:
            ratios.append(r)
            w.writerow([key[0], key[1], key[2], key[3], p["paged"], f["token_bytes"], "", "",
                        p["paged_cpu_ms"], "", "", "", p["paged_speed"]])
        print(f"{key[0]:9s}{key[1]:3d}{key[2]:7d}{key[3]:4d}{int(f['token_bytes']):9d}"
              f"{float(f['median_ms']):9.2f}{float(f['gbps']):8.2f}{cpu(f):9.2f}"
              f"{cpu_gbps(f):9.2f}{frac:7.2f}{speed:8.2f}{p_cpu:11.2f}{r:9.2f}")
print(f"paged: paged_vs_contiguous_min={min(ratios) if ratios else float('nan'):.2f} "
      f"(contiguous / paged CPU time, paired in one process: the smallest over the rows)")
# int8 and int4 against f32 at L >= 4096 (contiguous rows): speedup and bandwidth fraction.
fmin = lambda v: min(v) if v else float("nan")
for kind in ("int8", "int4"):
    sel = [(k, rows[k]) for k in rows if k[0] == kind and k[2] >= 4096 and k[4] == 0]
    speeds = [cpu(rows[("f32",) + k[1:]]) / cpu(f) for k, f in sel if ("f32",) + k[1:] in rows]
    fracs = [cpu_gbps(f) / bw[k[3]] for k, f in sel if k[3] in bw]
    print(f"{kind}: kv_{kind}_decode_vs_fp32_min={fmin(speeds):.2f} "
          f"kv_{kind}_bw_fraction_min={fmin(fracs):.2f} (f32 / {kind} CPU time and {kind} "
          f"bytes read per CPU second / the streaming read's, L >= 4096, the smallest)")
PY
rm -f "$kv_raw"
paged_min=$(grep -o 'paged_vs_contiguous_min=[^ ]*' "$out/kv_cache.txt" || echo paged_vs_contiguous_min=nan)
int8_min=""
for field in kv_int8_decode_vs_fp32_min kv_int8_bw_fraction_min kv_int4_decode_vs_fp32_min \
  kv_int4_bw_fraction_min; do
  int8_min+="${int8_min:+ }$(grep -o "$field=[^ ]*" "$out/kv_cache.txt" || echo "$field=nan")"
done
if [ "$kv_only" = 1 ]; then
  rm -f "$raw"
  exit 0
fi

log "decode steps and 128-token chunks (attn vs PyTorch, $rounds round(s))"
for op in decode prefill; do
  for b in ${batches//,/ }; do
    for l in ${lengths//,/ }; do
      for t in ${threads_list//,/ }; do
        for ((r = 0; r < rounds; ++r)); do
          attn_cmd=(run_env "$t" ACTIVE "$build/bench/decode_timer" "$op" "$b" "$l" "$t" "$reps"
                    --max-seconds "$max_seconds")
          torch_cmd=(run_env "$t" "" "$BENCH_PYTHON" "$ATTN_ROOT/scripts/bench/pytorch_decode.py"
                     "$op" "$b" "$l" "$t" "$reps" --max-seconds "$max_seconds")
          sides=(attn torch)
          if [ "$bf16" = 1 ] && [ "$op" = decode ] && ((r < bf16_rounds)) &&
             [[ ",$bf16_threads," == *",$t,"* ]]; then
            sides=(attn torch bf16)
          fi
          k=$((r % ${#sides[@]}))  # rotate who goes first
          for side in "${sides[@]:k}" "${sides[@]:0:k}"; do
            case "$side" in
              attn) "${attn_cmd[@]}" | tee -a "$raw" ;;
              torch) "${torch_cmd[@]}" | grep '^impl=' | tee -a "$raw" ;;
              bf16) "${attn_cmd[@]}" --dtype bf16 | tee -a "$raw" ;;
            esac
          done
        done
      done
    done
  done
done

log "report"
bf16_note=""
[ "$bf16" = 1 ] || bf16_note="left out by --no-bf16"
"$BENCH_PYTHON" - "$raw" "$out" "$paged_min" "$int8_min" "$bf16_note" <<'PY' | tee "$out/decode.txt"
import csv, os, statistics, sys
raw, out, paged_min, int8_min, bf16_note = sys.argv[1:6]
bw, rows, cpu_runs = {}, {}, {}
for line in open(raw):
    f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
    if line.startswith("stream") and f.get("kernel") == "read":
        bw[int(f["threads"])] = float(f["median_gbps"])
    elif line.startswith("impl="):
        key = (f["op"], int(f["B"]), int(f["L"]), int(f["threads"]), f["impl"])
        if "median_cpu_ms" in f:  # attn's (float and bfloat16 module): CPU time per step
            cpu_runs.setdefault(key, []).append(float(f["median_cpu_ms"]))
        best = rows.get(key)
        if best is None or float(f["median_ms"]) < float(best["median_ms"]):
            rows[key] = f  # the fastest median over the rounds
configs = sorted({k[:4] for k in rows})
print(f"bandwidth (streaming read, median GB/s): "
      + ", ".join(f"{t} thread(s) {g:.1f}" for t, g in sorted(bw.items())))
print(f"{'op':8s}{'B':>3s}{'L':>6s}{'thr':>4s}{'attn ms':>10s}{'GB/s':>8s}{'of bw':>7s}"
      f"{'torch ms':>10s}{'speedup':>9s}  torch variant")
fractions, decode_speedups, prefill_speedups = [], [], []
with open(os.path.join(out, "decode.csv"), "w", newline="") as fcsv:
    w = csv.writer(fcsv)
    w.writerow(["op", "B", "L", "threads", "impl", "median_ms", "min_ms", "bytes", "gbps",
                "bw_fraction", "variant"])
    for c in configs:
        a, p, a16 = rows.get(c + ("attn",)), rows.get(c + ("pytorch",)), rows.get(c + ("attn_bf16",))
        frac = float(a["gbps"]) / bw[c[3]] if a and c[3] in bw else float("nan")
        speed = float(p["median_ms"]) / float(a["median_ms"]) if a and p else float("nan")
        if a and c[0] == "decode" and c[1] == 1:
            fractions.append(frac)
        if a and p:
            (decode_speedups if c[0] == "decode" else prefill_speedups).append(speed)
        for r in (a, p, a16):
            if r:
                f_r = float(r["gbps"]) / bw[c[3]] if r is not p and c[3] in bw else None
                w.writerow([c[0], c[1], c[2], c[3], r["impl"], r["median_ms"], r["min_ms"],
                            r["bytes"], r["gbps"], f"{f_r:.3f}" if f_r is not None else "",
                            r.get("variant", "")])
        print(f"{c[0]:8s}{c[1]:3d}{c[2]:6d}{c[3]:4d}"
              f"{float(a['median_ms']) if a else float('nan'):10.2f}"
              f"{float(a['gbps']) if a else float('nan'):8.2f}{frac:7.2f}"
              f"{float(p['median_ms']) if p else float('nan'):10.2f}{speed:9.2f}  "
              f"{p.get('variant', '') if p else ''}")
fmin = lambda v: min(v) if v else float("nan")
# The bfloat16 module's decode step against the float one's, from the same rounds: CPU time
# per step (all threads), median over the rounds of each process's median.
bf16_ratios = []
bf16_configs = [c for c in configs if c + ("attn_bf16",) in cpu_runs]
if bf16_configs:
    print("bfloat16 module (bfloat16 weights and KV cache) vs float, decode step, CPU ms per "
          "step (median over rounds):")
    print(f"{'op':8s}{'B':>3s}{'L':>6s}{'thr':>4s}{'fp32 cpu':>10s}{'bf16 cpu':>10s}"
          f"{'fp32/bf16':>10s}{'bf16 ms':>9s}{'bf16 GB/s':>10s}")
else:
    print("bfloat16 decode rows: none, so bf16_decode_vs_fp32_min=nan ("
          + (bf16_note or "they run at --bf16-threads, none of which is in --threads") + ")")
for c in bf16_configs:
    a16 = rows[c + ("attn_bf16",)]
    f32_cpu = statistics.median(cpu_runs[c + ("attn",)]) if c + ("attn",) in cpu_runs else float("nan")
    b16_cpu = statistics.median(cpu_runs[c + ("attn_bf16",)])
    if f32_cpu == f32_cpu and c[2] >= 2048:  # the field covers L >= 2048 (long contexts)
        bf16_ratios.append(f32_cpu / b16_cpu)
    print(f"{c[0]:8s}{c[1]:3d}{c[2]:6d}{c[3]:4d}{f32_cpu:10.2f}{b16_cpu:10.2f}"
          f"{f32_cpu / b16_cpu:10.2f}{float(a16['median_ms']):9.2f}{float(a16['gbps']):10.2f}")
print(f"summary: decode_bw_fraction_min={fmin(fractions):.2f} "
      f"decode_speedup_min={fmin(decode_speedups):.2f} "
      f"prefill_chunk_speedup_min={fmin(prefill_speedups):.2f} {paged_min} {int8_min} "
      f"bf16_decode_vs_fp32_min={fmin(bf16_ratios):.2f}")
PY

if command -v gnuplot >/dev/null; then
  plot_data="$out/decode_plot.dat"
  awk -F, 'NR > 1 && $1 == "decode" { print $5 "_B" $2 "_t" $4, $3, $6 }' "$out/decode.csv" \
    | sort -k1,1 -k2,2n >"$plot_data"
  series=$(cut -d' ' -f1 "$plot_data" | sort -u)
  plot=""
  for s in $series; do
    plot+="${plot:+, }'< grep \"^$s \" $plot_data' using 2:3 with linespoints title '${s//_/ }'"
  done
  gnuplot -e "set terminal png size 900,560; set output '$out/decode_step_vs_length.png';
    set title 'Decode step of a Llama-3-8B-shaped layer (frozen float32)';
    set xlabel 'cache length L (tokens)'; set ylabel 'step time (ms)'; set logscale x 2;
    set key top left; set grid; plot $plot" && echo "plot: ${out#"$ATTN_ROOT"/}/decode_step_vs_length.png"
fi
rm -f "$raw"
