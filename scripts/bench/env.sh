# Shared by scripts/bench_vs_pytorch.sh and scripts/bench/profile_vs_ort.sh (source it after
# scripts/lib/common.sh): the environment of one measured process, ONNX Runtime's
# installation and where its graphs live.
# shellcheck shell=bash

ORT_VERSION=1.30.0
BENCH_PYTHON=/usr/bin/python3  # Debian's python3-torch; a pyenv python3 on PATH does not see it

# OPENBLAS_CORETYPE for PyTorch: its AVX-512 kernels where the CPU has them (the machine's own
# environment may pin Haswell). ATTN_BENCH_OPENBLAS_CORETYPE overrides (empty = unset).
if grep -qw avx512f /proc/cpuinfo; then BENCH_HAS_AVX512=yes; else BENCH_HAS_AVX512=no; fi
if [ "$BENCH_HAS_AVX512" = yes ]; then _coretype=SkylakeX; else _coretype=Haswell; fi
OPENBLAS_CORETYPE_SET="${ATTN_BENCH_OPENBLAS_CORETYPE-$_coretype}"

# bench_env threads wait_policy: the environment of one measured process, one NAME=value a
# line: thread counts for every threading layer, glibc malloc kept from returning memory
# (PyTorch loses 2-5x on big shapes otherwise), OpenBLAS's kernel choice, OMP_WAIT_POLICY if
# given. Run the command under `env -u OMP_WAIT_POLICY -u OPENBLAS_CORETYPE -u
# GOMP_SPINCOUNT` plus these, so nothing inherited leaks in.
bench_env() {
  local t="$1" wait="$2"
  local vars=(OMP_NUM_THREADS="$t" OPENBLAS_NUM_THREADS="$t" MKL_NUM_THREADS="$t"
              MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=268435456)
  [ -n "$OPENBLAS_CORETYPE_SET" ] && vars+=(OPENBLAS_CORETYPE="$OPENBLAS_CORETYPE_SET")
  [ -n "$wait" ] && vars+=(OMP_WAIT_POLICY="$wait")
  printf '%s\n' "${vars[@]}"
}

# ort_setup DIR: makes ONNX Runtime usable from DIR (python3-onnx for the graphs,
# onnxruntime-node@$ORT_VERSION from the npm registry into DIR/node_modules; never into the
# repository). Sets ORT_NOTE to why not, or to "" when it is ready.
ort_installed() {
  node -e "process.exit(require('$1/node_modules/onnxruntime-node/package.json').version === '$ORT_VERSION' ? 0 : 1)" 2>/dev/null
}
ort_setup() {
  local dir="$1"
  ORT_NOTE=""
  if ! { ensure_packages python3-onnx && "$BENCH_PYTHON" -c "import onnx"; } >/dev/null 2>&1; then
    ORT_NOTE="python3-onnx is missing and could not be installed, so there are no graphs"
  elif ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    ORT_NOTE="node and npm are not installed"
  elif ! ort_installed "$dir"; then
    log "installing onnxruntime-node@$ORT_VERSION from the npm registry into $dir"
    mkdir -p "$dir"
    # --ignore-scripts: the package's install script only downloads GPU providers; the CPU
    # library ships in the package itself.
    if ! npm install --prefix "$dir" --ignore-scripts --no-audit --no-fund \
         "onnxruntime-node@$ORT_VERSION" >"$dir/npm.log" 2>&1 || ! ort_installed "$dir"; then
      local why
      why="$(grep -m1 -E '^npm (error|ERR!) [A-Z]*Error|^npm (error|ERR!) code' "$dir/npm.log" || tail -n 1 "$dir/npm.log")"
      ORT_NOTE="npm install onnxruntime-node@$ORT_VERSION failed (${why#npm error }; log: $dir/npm.log)"
    fi
  fi
}

# graph_dir ORT_DIR B Tq Tk D H causal cross: where scripts/bench/ort_graphs.py puts a shape.
graph_dir() {
  echo "$1/graphs/b$2_tq$3_tk$4_d$5_h$6_c$7_x$8"
}

# shape_label B Tq Tk D H causal cross: the table's name of a shape.
shape_label() {
  local s
  if [ "$7" = 1 ]; then s="cross B$1 Tq$2 Tk$3 D$4 H$5"; else s="B$1 T$2 D$4 H$5"; fi
  [ "$6" = 1 ] && s="$s causal"
  echo "$s"
}
