#!/usr/bin/env bash
# scripts/deps.sh [--bench] [--torch] - install what fabricoll needs to build and test, idempotently.
#
# Debian / Ubuntu only.  Packages already installed are left alone: apt-get (update + install)
# runs only when something is missing.  As root it calls apt-get directly, otherwise through
# sudo when sudo exists.
#   always:   build-essential pkg-config libfabric-dev libfabric-bin libclang-dev clang python3
#             iproute2 (ip netns, tc, ss) util-linux (unshare) procps (the emulated-hosts stage)
#             openmpi-bin (the launcher tests start ranks with Open MPI's mpirun)
#             libopenmpi-dev (the py-tests stage builds and runs the Open MPI baseline,
#             scripts/baselines/mpi_coll_bench.c, at 2 ranks)
#   --bench:  also mpich libmpich-dev (the MPICH baseline), iptables
#             and libnetfilter-queue-dev (the link delays of scripts/bench-multihost.sh)
#   --torch:  also python3-venv, then a cached virtual environment for the torch tests and
#             benchmark (scripts/torch-tests.sh, scripts/bench-torch.sh): torch, numpy and
#             expecttest (PyTorch's distributed tests import it) at the pinned versions below,
#             from PyPI, in $FABRICOLL_TORCH_VENV (default ~/.cache/fabricoll/torch-venv); an
#             existing one is reused when it imports them at those versions and its setuptools
#             builds wheels (the wheel test). FABRICOLL_TORCH_VERSION picks another torch for a
#             venv of its own (the other supported one: 2.11.0, with
#             FABRICOLL_TORCH_VENV=~/.cache/fabricoll/torch211-venv; several GB, not in CI)
# Then checks that cargo exists (rustup's ~/.cargo/bin is added to PATH when needed) and adds the
# rustfmt and clippy components with rustup when they are missing.  Failing to fetch those
# components is only a warning here; scripts/test.sh stops with a clear message if they are
# still missing when it needs them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

want_bench=0 want_torch=0
for arg in "$@"; do
  case "$arg" in
    --bench) want_bench=1 ;;
    --torch) want_torch=1 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "deps.sh: unknown argument: $arg (expected --bench or --torch)" >&2; exit 2 ;;
  esac
done

log() { echo "deps.sh: $*"; }

pkgs=(build-essential pkg-config libfabric-dev libfabric-bin libclang-dev clang python3
  iproute2 util-linux procps openmpi-bin libopenmpi-dev)
if [ "$want_bench" = 1 ]; then
  pkgs+=(mpich libmpich-dev iptables libnetfilter-queue-dev)
fi
if [ "$want_torch" = 1 ]; then
  pkgs+=(python3-venv)
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

# --- torch virtual environment (--torch) ----------------------------------------------------
# The versions the torch tests are written and measured against.
TORCH_VERSION=${FABRICOLL_TORCH_VERSION:-2.15.0} NUMPY_VERSION=2.4.6 EXPECTTEST_VERSION=0.3.0
torch_venv_ok() {
  "$1/bin/python" - "$TORCH_VERSION" "$NUMPY_VERSION" "$EXPECTTEST_VERSION" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
import numpy, torch, expecttest  # noqa: F401  (importable, not only installed)
import setuptools.command.bdist_wheel  # noqa: F401  (setuptools 70.1 or later)
want = dict(zip(("torch", "numpy", "expecttest"), sys.argv[1:]))
sys.exit(0 if all(version(k) == v for k, v in want.items()) else 1)
PY
}
if [ "$want_torch" = 1 ]; then
  venv=${FABRICOLL_TORCH_VENV:-$HOME/.cache/fabricoll/torch-venv}
  if [ -x "$venv/bin/python" ] && torch_venv_ok "$venv"; then
    log "torch venv $venv: torch $TORCH_VERSION, numpy $NUMPY_VERSION, expecttest $EXPECTTEST_VERSION"
  else
    log "making the torch venv $venv (torch $TORCH_VERSION: a few GB, about two minutes)"
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check \
      "torch==$TORCH_VERSION" "numpy==$NUMPY_VERSION" "expecttest==$EXPECTTEST_VERSION" \
      "setuptools>=70.1"
    torch_venv_ok "$venv" || {
      log "the torch venv $venv still lacks torch $TORCH_VERSION / numpy / expecttest" >&2
      exit 1
    }
    log "torch venv $venv ready"
  fi
fi
exit 0
