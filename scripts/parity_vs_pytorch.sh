#!/usr/bin/env bash
# End-to-end parity of tools/attn_run with PyTorch: installs what is missing (Debian's
# python3-torch 1.13, numpy), builds attn_run, runs scripts/parity_vs_pytorch.py (random
# nn.MultiheadAttention forward cases, Llama cases against scripts/llama_reference.py, and
# backward cases against PyTorch autograd) and writes docs/parity.md.
#   scripts/parity_vs_pytorch.sh                  # report to docs/parity.md
#   scripts/parity_vs_pytorch.sh --fixtures tests/fixtures/io   # also regenerate fixtures
#   scripts/parity_vs_pytorch.sh --only bf16 --fixtures tests/fixtures/io   # the bf16 group only
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"

ensure_packages "${ATTN_BASE_PACKAGES[@]}" python3-torch python3-numpy libopenblas0-pthread

build="$ATTN_ROOT/build/parity"
log "building attn_run in $build"
cmake -S "$ATTN_ROOT" -B "$build" -DCMAKE_BUILD_TYPE=Release -DATTN_BUILD_EXAMPLES=ON \
  -DATTN_BUILD_TESTS=OFF -DATTN_BUILD_BENCHMARKS=OFF -DATTN_BUILD_IO=ON >/dev/null
cmake --build "$build" --target attn_run -j "$ATTN_JOBS"

log "comparing with PyTorch"
# Debian's torch is only visible to the system interpreter, /usr/bin/python3 (a python3 from
# pyenv or a venv earlier on PATH does not see it).
/usr/bin/python3 "$ATTN_ROOT/scripts/parity_vs_pytorch.py" \
  --attn-run "$build/tools/attn_run" --report "$ATTN_ROOT/docs/parity.md" "$@"
