#!/usr/bin/env bash
# README command 1: installs what is missing, builds every example and runs it.
# Each example prints what its notebook prints and exits non-zero on a mismatch.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"

ensure_packages "${ATTN_BASE_PACKAGES[@]}"

build="$ATTN_ROOT/build/examples"
log "configuring build/examples"
cmake -S "$ATTN_ROOT" -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DATTN_BUILD_TESTS=OFF -DATTN_BUILD_BENCHMARKS=OFF -DATTN_BUILD_EXAMPLES=ON >/dev/null
log "building the examples"
cmake --build "$build" -j "$ATTN_JOBS"

status=0
for exe in $(find "$build/examples" -maxdepth 1 -type f -perm -u+x -name '[0-9]*' | sort); do
  log "running examples/$(basename "$exe")"
  if ! "$exe"; then
    echo "FAILED: $(basename "$exe")"
    status=1
  fi
done
if [ "$status" -eq 0 ]; then
  log "all examples passed"
else
  log "some examples FAILED"
fi
exit "$status"
