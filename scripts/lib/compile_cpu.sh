#!/usr/bin/env bash
# The compiler launcher of `ATTN_COMPILE_CPU=1 ./scripts/run_tests.sh`: runs one compile and
# appends "<user + sys CPU seconds> <object file>" to compile-cpu.txt in the build tree (the
# directory Ninja or Make runs it from). CPU time, not wall time: the sanitizer tree builds at
# nice 19 beside the release stages, so its units' wall times in .ninja_log say little.
out="" prev=""
for arg in "$@"; do
  if [ "$prev" = "-o" ]; then out="$arg"; fi
  prev="$arg"
done
rc=0
"$@" || rc=$?
# `times` in this shell (a pipeline or $(...) would run it in a subshell, which has no children).
times_file="$(mktemp)"
times >"$times_file"
cpu="$(awk 'NR == 2 { split($1, u, /[ms]/); split($2, s, /[ms]/)
                      printf "%.1f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$times_file")"
rm -f "$times_file"
echo "$cpu $out" >>compile-cpu.txt
exit "$rc"
