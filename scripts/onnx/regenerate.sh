#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scripts/onnx/regenerate.sh: makes the ONNX `Attention` fixtures in tests/fixtures/onnx again
# from nothing: installs what is missing, draws the cases, runs them through ONNX Runtime
# 1.30 (CPU), computes the operator's definition in float64, compares the two, reads every
# file back and prints the summary. The same files come out on every run (fixed seed; ONNX
# Runtime runs on one thread); the test suite itself needs none of this.
#
# Usage: scripts/onnx/regenerate.sh
# Environment:
#   ATTN_ORT_DIR    where onnxruntime-node 1.30.0 is (or gets) installed, outside the repository
#                   (default ${XDG_CACHE_HOME:-$HOME/.cache}/attn/onnxruntime-node-1.30.0)
#   ATTN_ONNX_WORK  scratch directory for the models and ONNX Runtime's status
#                   (default build/onnx_fixtures in the repository; build/ is ignored by git)
# Installs when missing: Debian's python3-numpy, python3-onnx, nodejs, npm (apt-get, as root or
# through sudo) and the npm package onnxruntime-node@1.30.0 (npm install --ignore-scripts: its
# install script only fetches GPU libraries; the CPU library ships inside the package).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
ort_version=1.30.0
ort_dir=${ATTN_ORT_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/attn/onnxruntime-node-$ort_version}
work=${ATTN_ONNX_WORK:-$repo/build/onnx_fixtures}
out=tests/fixtures/onnx
py=/usr/bin/python3  # Debian's python, which sees python3-onnx and python3-numpy

# 1. Debian packages.
missing=()
[ -x "$py" ] || missing+=(python3)
if [ -x "$py" ]; then
  "$py" -c 'import numpy' 2>/dev/null || missing+=(python3-numpy)
  "$py" -c 'import onnx' 2>/dev/null || missing+=(python3-onnx)
fi
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "regenerate.sh: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q "${missing[@]}"
fi

# 2. ONNX Runtime from the npm registry, outside the repository.
pkg="$ort_dir/node_modules/onnxruntime-node/package.json"
have=""
[ -f "$pkg" ] && have=$(node -p "require('$pkg').version")
if [ "$have" != "$ort_version" ]; then
  echo "regenerate.sh: installing onnxruntime-node@$ort_version into $ort_dir"
  mkdir -p "$ort_dir"
  npm install --ignore-scripts --no-audit --no-fund --loglevel=error --prefix "$ort_dir" \
    "onnxruntime-node@$ort_version"
fi

# 3. Cases, ONNX Runtime, definition, comparison, read-back.
"$py" scripts/onnx/make_cases.py make --out "$out" --work "$work"
node scripts/onnx/run_ort.js --ort "$ort_dir" --cases "$out" --work "$work"
status=0
"$py" scripts/onnx/make_cases.py finish --out "$out" --work "$work" | tee "$work/summary.txt" || status=1
"$py" scripts/onnx/check_fixtures.py "$out" || status=1
echo "regenerate.sh: summary in $work/summary.txt"
exit $status
