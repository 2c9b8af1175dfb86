#!/usr/bin/env bash
# tests/golden/compare.sh: builds tests/golden/golden_outputs.cpp against the headers of BASE
# (a git revision) and of the working tree, runs both at 1 and 2 threads, and compares the
# outputs byte for byte (through their hashes). Prints the first differing outputs and exits
# 1 if any differ. Extra compiler flags for the base build: GOLDEN_BASE_FLAGS (e.g.
# -DGOLDEN_OLD_API for a95c852 and older).
#   tests/golden/compare.sh BASE
set -euo pipefail
base="${1:?usage: tests/golden/compare.sh BASE-REVISION}"
root="$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
work="$root/build/golden"
rm -rf "$work/base" && mkdir -p "$work/base"
git -C "$root" archive "$base" include | tar -x -C "$work/base"
flags=(-std=c++17 -O2 -march=native -fopenmp -isystem /usr/include/eigen3)
# shellcheck disable=SC2086
g++ "${flags[@]}" ${GOLDEN_BASE_FLAGS:-} -I "$work/base/include" "$root/tests/golden/golden_outputs.cpp" \
  -o "$work/golden_base" &
g++ "${flags[@]}" -I "$root/include" "$root/tests/golden/golden_outputs.cpp" -o "$work/golden_new"
wait
status=0
for threads in 1 2; do
  "$work/golden_base" "$work/base_t$threads.txt" "$threads"
  "$work/golden_new" "$work/new_t$threads.txt" "$threads"
  if cmp -s "$work/base_t$threads.txt" "$work/new_t$threads.txt"; then
    echo "threads=$threads: $(wc -l < "$work/new_t$threads.txt") outputs, identical"
  else
    echo "threads=$threads: outputs differ:"
    diff "$work/base_t$threads.txt" "$work/new_t$threads.txt" | head -20
    status=1
  fi
done
exit "$status"
