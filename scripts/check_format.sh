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
# clang-format --dry-run --Werror over batches of files, ATTN_JOBS at a time: it reports each
# difference as "<file>:<line>:<col>: error: code should be clang-formatted". (One process
# per file, its output compared with cmp, took 24 CPU s for the tree's 288 files; this 8.)
report="$(mktemp)"
trap 'rm -f "$report"' EXIT
rc=0
printf '%s\0' "${files[@]}" |
  xargs -0 -n 48 -P "$ATTN_JOBS" clang-format --style=file --dry-run --Werror \
    2>"$report" >/dev/null || rc=$?
difference='^[^:]*:[0-9]*:[0-9]*: error: code should be clang-formatted'
mapfile -t bad < <({ grep -o "$difference" "$report" || true; } | cut -d: -f1 | sort -u)
if [ "$rc" -ne 0 ] && [ "${#bad[@]}" -eq 0 ]; then  # failed for another reason
  cat "$report" >&2
  echo "[format] clang-format failed" >&2
  exit 1
fi
if [ "${#bad[@]}" -gt 0 ]; then
  printf '%s\n' "${bad[@]}" >&2
  echo "[format] ${#bad[@]} file(s) differ from clang-format $(clang-format --version | sed 's/.*version //') under .clang-format; run scripts/check_format.sh --fix" >&2
  exit 1
fi
log "[format] ${#files[@]} files match .clang-format"
