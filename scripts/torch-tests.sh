#!/usr/bin/env bash
# scripts/torch-tests.sh [--full] [ARGS...] - the torch.distributed backend's tests.
#
# Makes (or reuses) the torch venv (scripts/deps.sh --torch), builds the backend's compiled front
# (fabricoll._c10d, python/fabricoll/csrc; about a minute) in place, then runs python/tests
# (tests.run) with it required (FABRICOLL_TORCH_EXT=1; tests.test_ops.PythonOnly runs the Python
# backend alone):
# every operation against gloo in the same job, DDP and FSDP2 training, error paths, at 2 and 4
# ranks over shm and net, then PyTorch's own distributed tests (a CI subset). Last line:
# `torch-tests: N passed, M failed, K skipped`. ARGS go to tests.run (e.g. unittest names such as
# tests.test_ops.ReduceOps.test_shm_2, or --no-suite).
#   --full   instead: PyTorch's whole backend-generic suite, with fabricoll and with gloo
#            (world size 3), and the comparison of the two (python/tests/suite_compare.py);
#            results in $CARGO_TARGET_DIR/torch-tests/suite-*.json. The ranks are forked
#            (minutes); TORCH_SUITE_START=spawn spawns them as PyTorch's CI does (an hour).
# Environment: FABRICOLL_TORCH_VENV (the venv), FABRICOLL_TORCH_VERSION (its torch: default the
# pinned 2.15.0; 2.11.0 is the other supported one, in a venv of its own), FABRICOLL_TEST_BACKEND
# (default fabricoll; gloo runs the harness gloo against gloo), FABRICOLL_TEST_STRICT,
# TORCH_TESTS_SUITE_TIMEOUT.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/deps.sh --torch
py=${FABRICOLL_TORCH_VENV:-$HOME/.cache/fabricoll/torch-venv}/bin/python
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
# The compiled front: required here unless the caller chose (FABRICOLL_TORCH_EXT=0 or 1).
scripts/torch-ext.sh
[ "${FABRICOLL_TORCH_EXT:-}" = 0 ] || export FABRICOLL_TORCH_EXT=${FABRICOLL_TORCH_EXT:-1}
if [ "${1:-}" = --full ]; then
  shift
  out=$CARGO_TARGET_DIR/torch-tests
  mkdir -p "$out"
  rc=0
  for backend in fabricoll gloo; do
    (cd python && TORCH_TESTS_SUITE_TIMEOUT=${TORCH_TESTS_SUITE_TIMEOUT:-7200} timeout 7500 \
      "$py" -m tests.torch_suite --backend "$backend" --select all \
      --start "${TORCH_SUITE_START:-fork}" \
      --json "$out/suite-$backend-all.json" "$@" >"$out/suite-$backend-all.log" 2>&1) || rc=1
    tail -1 "$out/suite-$backend-all.log"
  done
  (cd python && "$py" -m tests.suite_compare "$out/suite-fabricoll-all.json" \
    "$out/suite-gloo-all.json")
  exit $rc
fi
cd python
exec "$py" -m tests.run "$@"
