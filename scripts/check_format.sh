#!/usr/bin/env bash
# Fails when a tracked C++ file differs from what clang-format makes of it under the repo's
# .clang-format. Skipped, with a message, where clang-format is not installed.
# Usage: scripts/check_format.sh [--fix]   (--fix rewrites the files in place)
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
cd "$ATTN_ROOT"

if ! command -v clang-format >/dev/null 2>&1; then
  log "[format] clang-format is not installed: format check skipped"
  exit 0
fi
mapfile -t files < <(git ls-files '*.hpp' '*.cpp' '*.inl' '*.h' 2>/dev/null || true)
if [ "${#files[@]}" -eq 0 ]; then  # not a git checkout: every source file under the tree
  mapfile -t files < <(find include tests examples bench tools fuzz \
                         \( -name '*.hpp' -o -name '*.cpp' -o -name '*.inl' -o -name '*.h' \) | sort)
fi
if [ "${1:-}" = "--fix" ]; then
  clang-format -i --style=file "${files[@]}"
  exit 0
fi
# One clang-format per file, ATTN_JOBS at a time; each prints its file's name if it differs.
mapfile -t bad < <(printf '%s\0' "${files[@]}" | xargs -0 -n 8 -P "$ATTN_JOBS" sh -c '
  for f; do clang-format --style=file "$f" | cmp -s - "$f" || printf "%s\n" "$f"; done' sh | sort)
if [ "${#bad[@]}" -gt 0 ]; then
  printf '%s\n' "${bad[@]}" >&2
  echo "[format] ${#bad[@]} file(s) differ from clang-format $(clang-format --version | sed 's/.*version //') under .clang-format; run scripts/check_format.sh --fix" >&2
  exit 1
fi
log "[format] ${#files[@]} files match .clang-format"
