# Shared by the scripts in scripts/: package installation and build helpers.
# shellcheck shell=bash

ATTN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ATTN_JOBS="${ATTN_JOBS:-$(nproc 2>/dev/null || echo 2)}"

log() { printf '\n==> %s\n' "$*"; }

# ensure_packages pkg...: apt-get installs the Debian packages that are not installed yet.
ensure_packages() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq || true
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
  choose_generator
}

# The packages every build needs.
ATTN_BASE_PACKAGES=(cmake g++ make ninja-build libeigen3-dev libgtest-dev libgmock-dev
                    libbenchmark-dev nlohmann-json3-dev)  # nlohmann: attn::io and its tests

# New build trees use Ninja where it is installed (ensure_packages installs it with the base
# packages): on these 2-core machines the Makefile generator kept one core idle for much of
# the test build (the release tree took 1393 s with it, 700 s with Ninja, for the same 1375
# CPU seconds). A tree keeps the generator it was configured with; CMAKE_GENERATOR set by the
# caller wins.
choose_generator() {
  if [ -z "${CMAKE_GENERATOR:-}" ] && command -v ninja >/dev/null 2>&1; then
    export CMAKE_GENERATOR=Ninja
  fi
}
choose_generator

# The kernel sets, widest first (attn/kernels/dispatch.hpp's order).
ATTN_KERNEL_SETS=(avx512 avx2 sse2 scalar)

# kernel_sets_above <set>: the kernel sets wider than <set>, which a CPU whose best set is
# <set> cannot run, as a CMake list (the value of ATTN_UNRUN_KERNEL_SETS).
kernel_sets_above() {
  local set out=()
  for set in "${ATTN_KERNEL_SETS[@]}"; do
    [ "$set" = "$1" ] && break
    out+=("$set")
  done
  (IFS=';'; echo "${out[*]}")
}

# kernel_sets_except <set>: every kernel set but <set>, as a CMake list.
kernel_sets_except() {
  local set out=()
  for set in "${ATTN_KERNEL_SETS[@]}"; do
    [ "$set" != "$1" ] && out+=("$set")
  done
  (IFS=';'; echo "${out[*]}")
}

# kernel_sets_below <set>: the kernel sets narrower than <set>, one per line (a CPU whose
# best set is <set> runs each of them too).
kernel_sets_below() {
  local set seen=0
  for set in "${ATTN_KERNEL_SETS[@]}"; do
    [ "$seen" = 1 ] && echo "$set"
    [ "$set" = "$1" ] && seen=1
  done
  return 0
}
