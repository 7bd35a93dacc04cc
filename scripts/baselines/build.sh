#!/usr/bin/env bash
# scripts/baselines/build.sh - build the MPI baseline (mpi_coll_bench.c) for Open MPI, and for
# MPICH where its compiler is installed, into BASELINE_BUILD (default
# ~/.cache/fabricoll-baselines). Needs openmpi-bin and libopenmpi-dev (scripts/deps.sh), and
# mpich and libmpich-dev for the MPICH binary (scripts/deps.sh --bench).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${BASELINE_BUILD:-${XDG_CACHE_HOME:-$HOME/.cache}/fabricoll-baselines}
mkdir -p "$out"
mpicc.openmpi -O2 -Wall -o "$out/mpi_coll_bench.openmpi" "$here/mpi_coll_bench.c" -lm
if command -v mpicc.mpich >/dev/null; then
  mpicc.mpich -O2 -Wall -o "$out/mpi_coll_bench.mpich" "$here/mpi_coll_bench.c" -lm
fi
ls -l "$out"
