#!/usr/bin/env bash
# scripts/deps.sh [--bench] - install what fabricoll needs to build and test, idempotently.
#
# Debian / Ubuntu only.  Packages already installed are left alone: apt-get (update + install)
# runs only when something is missing.  As root it calls apt-get directly, otherwise through
# sudo when sudo exists.
#   always:   build-essential pkg-config libfabric-dev libfabric-bin libclang-dev clang python3
#             iproute2 (ip netns, tc, ss) util-linux (unshare) procps (the emulated-hosts stage)
#   --bench:  also openmpi-bin libopenmpi-dev mpich libmpich-dev (the MPI baselines), iptables
#             and libnetfilter-queue-dev (the link delays of scripts/bench-multihost.sh)
# Then checks that cargo exists (rustup's ~/.cargo/bin is added to PATH when needed) and adds the
# rustfmt and clippy components with rustup when they are missing.  Failing to fetch those
# components is only a warning here; scripts/test.sh stops with a clear message if they are
# still missing when it needs them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

want_bench=0
for arg in "$@"; do
  case "$arg" in
    --bench) want_bench=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "deps.sh: unknown argument: $arg (expected --bench)" >&2; exit 2 ;;
  esac
done

log() { echo "deps.sh: $*"; }

pkgs=(build-essential pkg-config libfabric-dev libfabric-bin libclang-dev clang python3
  iproute2 util-linux procps)
if [ "$want_bench" = 1 ]; then
  pkgs+=(openmpi-bin libopenmpi-dev mpich libmpich-dev iptables libnetfilter-queue-dev)
fi

# --- Debian packages ------------------------------------------------------------------------
is_installed() {
  local status
  status=$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null) || return 1
  [ "$status" = installed ]
}

if ! command -v dpkg-query >/dev/null 2>&1; then
  log "dpkg-query not found: not a Debian-like system; install these yourself: ${pkgs[*]}" >&2
  exit 1
fi

missing=()
for p in "${pkgs[@]}"; do
  is_installed "$p" || missing+=("$p")
done

if [ "${#missing[@]}" -eq 0 ]; then
  log "all ${#pkgs[@]} packages present"
else
  log "installing: ${missing[*]}"
  if [ "$(id -u)" -eq 0 ]; then
    as_root=()
  elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
  else
    log "not root and no sudo: cannot install ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${missing[@]}"
  still=()
  for p in "${missing[@]}"; do is_installed "$p" || still+=("$p"); done
  if [ "${#still[@]}" -ne 0 ]; then
    log "still missing after apt-get install: ${still[*]}" >&2
    exit 1
  fi
  log "installed ${#missing[@]} package(s)"
fi

# --- Rust toolchain -------------------------------------------------------------------------
if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
  log "cargo not found (not on PATH, not in ~/.cargo/bin); install Rust with rustup:" >&2
  log "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y" >&2
  exit 1
fi
log "$(cargo --version)"

if command -v rustup >/dev/null 2>&1; then
  installed=$(rustup component list --installed 2>/dev/null || true)
  comps=()
  for c in rustfmt clippy; do
    grep -q "^$c" <<<"$installed" || comps+=("$c")
  done
  if [ "${#comps[@]}" -ne 0 ]; then
    log "adding rustup components: ${comps[*]}"
    rustup component add "${comps[@]}" ||
      log "WARNING: could not add ${comps[*]} (offline?); scripts/test.sh needs them" >&2
  fi
else
  log "rustup not found: not checking the rustfmt / clippy components"
fi
exit 0
