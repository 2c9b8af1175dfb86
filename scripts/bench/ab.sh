#!/usr/bin/env bash
# attn against attn: the benchmark rows of scripts/bench_vs_pytorch.sh (the forward of
# MultiHeadAttention, a decode step and a prefill chunk through a KV cache, a training step)
# timed at two commits in one run, to show that a change costs no speed.
#
#   scripts/bench/ab.sh BASE [HEAD] [--rounds N] [--threads T] [--quick] [--kv] [--rows REGEX]
#
# BASE and HEAD are commits (HEAD: the working tree's HEAD). Each is checked out into
# build/ab/<commit> (a detached git worktree) and built there with the default flags (Release
# -O2, no -march: what users get); then, for every row, fresh processes of the two builds
# alternate, BASE first in odd rounds and HEAD first in even ones, and the row's figure is the
# median over the rounds of each process's median. Prints one line per row with both medians
# and HEAD / BASE (time ratio: below 1 is faster), and as the last line
#   ab: rows=N ratio_max=X.XX ratio_median=X.XX
# Settings as the side-by-side benchmark's: OMP_NUM_THREADS = threads, OMP_PROC_BIND=close,
# OMP_WAIT_POLICY=PASSIVE. On a shared machine, run it when nothing else builds: the
# alternation cancels slow drifts, not another process on the same core. --rows keeps the rows
# whose command matches an extended regular expression (for example --rows 'train_timer 8 |8
# 128 512 512': the B8 training step and the cross-attention row), to time a few rows at many
# commits. --kv times the attention of a decode step over each KV cache element type instead
# (decode_timer attend: in cache at B 1 L 2048, from memory at B 8 L 8192, over a paged
# cache whose items took their blocks 16 tokens at a time, side by side, and over a pool
# fragmented so that no two of an item's blocks are neighbours), by CPU time: the
# rows a change to the decode kernels must not slow. On a shared machine a row's processes
# can land in two speed modes a third apart: take 8 rounds or more.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

base="" head="" rounds=5 threads=1 quick=0 kv=0 row_filter=
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --quick) quick=1; shift ;;
    --kv) kv=1; shift ;;
    --rows) row_filter="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) if [ -z "$base" ]; then base="$1"; elif [ -z "$head" ]; then head="$1"; else
         echo "too many commits" >&2; exit 2; fi; shift ;;
  esac
done
[ -n "$base" ] || { sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 2; }
head="${head:-HEAD}"
ensure_packages "${ATTN_BASE_PACKAGES[@]}"

# build_at COMMIT: prints the build directory of COMMIT's timers (built once, reused).
build_at() {
  local sha dir
  sha="$(git -C "$ATTN_ROOT" rev-parse --short=12 "$1^{commit}")"
  dir="$ATTN_ROOT/build/ab/$sha"
  if [ ! -d "$dir/src" ]; then
    git -C "$ATTN_ROOT" worktree add --detach "$dir/src" "$sha" >/dev/null 2>&1
  fi
  cmake -S "$dir/src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" -DATTN_BUILD_BENCHMARKS=ON -DATTN_BUILD_TESTS=OFF \
    -DATTN_BUILD_EXAMPLES=OFF -DATTN_NATIVE=OFF >/dev/null
  cmake --build "$dir/build" -j "$ATTN_JOBS" --target mha_timer decode_timer train_timer >&2
  echo "$dir/build/bench"
}
log "building the timers at $base and $head"
base_bin="$(build_at "$base")"
head_bin="$(build_at "$head")"

export OMP_NUM_THREADS="$threads" OMP_PROC_BIND=close OMP_WAIT_POLICY=PASSIVE
# Rows: timer and arguments (the thread count goes where each timer takes it).
rows=(
  "mha_timer 1 128 128 512 8 0 0 $threads 50"
  "mha_timer 8 512 512 512 8 0 0 $threads 20"
  "mha_timer 1 2048 2048 768 12 0 0 $threads 10"
  "mha_timer 1 8192 8192 512 8 1 0 $threads 5"
  "mha_timer 8 128 512 512 8 0 1 $threads 20"
  "decode_timer decode 1 4096 $threads 50"
  "decode_timer prefill 1 4096 $threads 10"
  "train_timer 8 512 512 8 0 $threads 10"
  "train_timer 1 2048 512 8 1 $threads 5"
)
if [ "$quick" = 1 ]; then
  rows=("mha_timer 1 128 128 512 8 0 0 $threads 20" "decode_timer decode 1 1024 $threads 20"
        "train_timer 2 128 256 4 1 $threads 5")
  rounds=1
fi
if [ "$kv" = 1 ]; then
  rows=()
  for t in f32 int8 int4; do rows+=("decode_timer attend 1 2048 $threads 2000 --kv-dtype $t"); done
  for t in f32 bf16 int8 int4; do rows+=("decode_timer attend 8 8192 $threads 30 --kv-dtype $t"); done
  for t in f32 int8 int4; do
    rows+=("decode_timer attend 8 8192 $threads 30 --kv-dtype $t --paged 16 --fill 16")
  done
  for t in int8 int4; do
    rows+=("decode_timer attend 8 4096 $threads 30 --kv-dtype $t --paged 16 --fill 16 --scatter")
  done
fi
if [ -n "$row_filter" ]; then
  kept=()
  for row in "${rows[@]}"; do
    if [[ "$row" =~ $row_filter ]]; then kept+=("$row"); fi
  done
  [ "${#kept[@]}" -gt 0 ] || { echo "no row matches --rows '$row_filter'" >&2; exit 2; }
  rows=("${kept[@]}")
fi

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
run_one() {  # run_one BIN_DIR ROW: prints the process's median_ms (--kv: median_cpu_ms)
  local row=($2) key=median_ms
  [ "$kv" = 1 ] && key=median_cpu_ms
  "$1/${row[0]}" "${row[@]:1}" --max-seconds 3 | sed -n "s/.*$key=\([0-9.]*\).*/\1/p"
}

log "$rounds rounds, $threads thread(s): $base (${base_bin#"$ATTN_ROOT"/}) against $head (${head_bin#"$ATTN_ROOT"/})"
printf '%-44s %12s %12s %10s\n' "row" "base ms" "head ms" "head/base"
ratios=()
for row in "${rows[@]}"; do
  b_times=() h_times=()
  for ((r = 1; r <= rounds; ++r)); do
    if (( r % 2 )); then
      b_times+=("$(run_one "$base_bin" "$row")"); h_times+=("$(run_one "$head_bin" "$row")")
    else
      h_times+=("$(run_one "$head_bin" "$row")"); b_times+=("$(run_one "$base_bin" "$row")")
    fi
  done
  b="$(printf '%s\n' "${b_times[@]}" | median)"
  h="$(printf '%s\n' "${h_times[@]}" | median)"
  ratio="$(awk -v h="$h" -v b="$b" 'BEGIN { printf "%.3f", h / b }')"
  ratios+=("$ratio")
  printf '%-44s %12.3f %12.3f %10s\n' "$row" "$b" "$h" "$ratio"
done
max="$(printf '%s\n' "${ratios[@]}" | sort -g | tail -n 1)"
med="$(printf '%s\n' "${ratios[@]}" | median)"
printf 'ab: rows=%d ratio_max=%.3f ratio_median=%.3f\n' "${#ratios[@]}" "$max" "$med"
