#!/usr/bin/env bash
# Fails on any #include in include/attn/ that climbs a layer: each header may include headers
# of its own layer and of the layers below it, never above. The layers, bottom to top, are
# listed in docs/design.md; this table is their one definition.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
cd "$ATTN_ROOT/include"

# layer_of <path under include/>: the layer's rank (0 = ground floor), or nothing if unknown.
layer_of() {
  case "$1" in
    attn/config.hpp | attn/error.hpp | attn/version.hpp | attn/detail/*) echo 0 ;;
    attn/types/*) echo 1 ;;
    attn/memory.hpp | attn/isa.hpp | attn/parallel.hpp | attn/workspace.hpp) echo 2 ;;
    attn/tensor/*) echo 3 ;;
    attn/kernels/*) echo 4 ;;
    attn/ops/*) echo 5 ;;
    attn/nn/* | attn/optim/*) echo 6 ;;
    attn/attention/*) echo 7 ;;
    attn/io/*) echo 8 ;;
    attn/attn.hpp) echo 9 ;;
  esac
}

bad=0
while IFS= read -r file; do
  own="$(layer_of "$file")"
  if [ -z "$own" ]; then
    echo "[layers] $file: not in any layer (add its folder to scripts/check_layers.sh)" >&2
    bad=1
    continue
  fi
  while IFS= read -r target; do
    theirs="$(layer_of "$target")"
    if [ -z "$theirs" ]; then
      echo "[layers] $file includes $target, which is in no layer" >&2
      bad=1
    elif [ "$theirs" -gt "$own" ]; then
      echo "[layers] $file (layer $own) includes $target (layer $theirs): an include that climbs" >&2
      bad=1
    fi
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\(attn\/[^"]*\)".*/\1/p' "$file")
done < <(find attn -type f \( -name '*.hpp' -o -name '*.inl' \) | sort)
if [ "$bad" -ne 0 ]; then
  echo "[layers] includes climb a layer (see docs/design.md for the layers)" >&2
  exit 1
fi
log "[layers] every include in include/attn/ stays in its layer or goes down"
