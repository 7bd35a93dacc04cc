#!/usr/bin/env bash
# scripts/bench-torch.sh [--quick] [OPTIONS] - the torch.distributed backend against gloo.
#
# dist.all_reduce, all_gather_into_tensor and reduce_scatter_tensor from 8 B to 64 MiB (x4
# steps; --step 8) at 2 and 4 ranks over shm and net (one host: net with
# FABRICOLL_INTRA_PROVIDER=same), fabricoll and gloo in the same job, alternating, medians of
# 5 runs (--reps, at least 3); nccl-tests style tables (time, algbw, busbw) with gloo's time
# over fabricoll's per size; then a DDP training step of a small MLP (median step time, ratio).
#   --quick     a smoke run (2 ranks over shm, three sizes, short timings): seconds, for CI
#   --overhead  instead: the per-op cost of an 8 B all_reduce on a 1-rank group (thread CPU)
#               against torch's dispatch of do-nothing C++ and Python backends, gloo and the C
#               call (scripts/torch/overhead.py; run it with FABRICOLL_TORCH_EXT=1 and 0)
# Other options (--colls, --ranks, --providers, --min-size, --max-size, --no-ddp, ...):
# scripts/torch/bench.py --help. The tables are saved in
# $CARGO_TARGET_DIR/bench-torch/<date>-<time>.txt (raw timings beside them, .json).
# Uses the torch venv of scripts/deps.sh --torch and the backend's compiled front
# (scripts/torch-ext.sh; FABRICOLL_TORCH_EXT=0: the Python backend alone, as the tables' header
# says); FABRICOLL_TEST_BACKEND=gloo benchmarks gloo against itself (a check of the harness).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/deps.sh --torch >/dev/null
py=${FABRICOLL_TORCH_VENV:-$HOME/.cache/fabricoll/torch-venv}/bin/python
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
scripts/torch-ext.sh
[ "${FABRICOLL_TORCH_EXT:-}" = 0 ] || export FABRICOLL_TORCH_EXT=1
if [ "${1:-}" = --overhead ]; then
  PYTHONPATH=$PWD/python exec "$py" scripts/torch/overhead.py
fi
exec "$py" scripts/torch/bench.py "$@"
