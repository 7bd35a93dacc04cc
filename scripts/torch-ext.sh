#!/usr/bin/env bash
# scripts/torch-ext.sh - build the torch backend's compiled front (fabricoll._c10d, from
# python/fabricoll/csrc) in place in python/fabricoll/, for the torch of scripts/deps.sh --torch.
# About a minute on two cores; the log goes to $CARGO_TARGET_DIR/torch-ext-build.log. Needs the
# library built (target/release). Used by scripts/torch-tests.sh and scripts/bench-torch.sh;
# FABRICOLL_TORCH_EXT=0 skips the build (the backend then runs in Python alone).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ "${FABRICOLL_TORCH_EXT:-}" = 0 ] && exit 0
py=${FABRICOLL_TORCH_VENV:-$HOME/.cache/fabricoll/torch-venv}/bin/python
log=${CARGO_TARGET_DIR:-$PWD/target}/torch-ext-build.log
mkdir -p "$(dirname "$log")"
if ! (cd python && "$py" setup.py -q build_ext --inplace -j 2) >"$log" 2>&1; then
  tail -n 30 "$log"
  echo "FAIL building fabricoll._c10d (log: $log)" >&2
  exit 1
fi
