#!/usr/bin/env bash
# scripts/bench-compress.sh - the compressed collectives (docs/compression.md) against the same
# calls uncompressed, on emulated hosts: scripts/bench-multihost.sh --compress, twice into one
# result directory:
#   2x2 and 4x1 at 1 Gbit/s, no delay, sizes --min..--max;
#   4x1 at 100 Mbit/s with 1 ms delay, --slow-colls, sizes --min..--slow-max (each byte costs
#   10 times more there).
#
#   scripts/bench-compress.sh [--formats bf16,fp8e4m3,int8] [--colls allreduce,reducescatter,allgather]
#       [--slow-colls allreduce] [--min 1M] [--max 64M] [--slow-max 16M] [--factor 4]
#       [--seconds 0.3] [--reps 3] [--only fast|slow] [--dir DIR] [--no-build]
#
# Each repetition runs, per format, auto uncompressed ("off") and auto with `fabricoll-perf
# --compress FMT` back to back (one process per rank, net between hosts, shm within), the pair's
# order and the formats' order turning from one repetition to the next. The tables
# (scripts/multihost/compress_summary.py, into DIR/summary.txt) give per size the median time
# and bus bandwidth (nccl-tests' busbw, counted on the uncompressed size) of the uncompressed
# call and of each format, and x: the median over repetitions of the format's busbw over its
# paired uncompressed run's; the last lines count the points from 1 MiB that meet the targets
# (x >= 1.8 for bf16, 3.0 for fp8 and int8) and give each format's largest error.
#
# It first builds the tree (NEURON=0 scripts/build.sh; --no-build, or FABRICOLL_PERF naming
# a built fabricoll-perf, skips that). Needs root, iptables and libnetfilter-queue-dev
# (scripts/deps.sh --bench). The defaults (AllReduce, ReduceScatter and AllGather, 3
# repetitions) take about 17 minutes on 2 CPUs; run it on an otherwise idle machine.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
target=${CARGO_TARGET_DIR:-target}
formats="bf16,fp8e4m3,int8"
colls="allreduce,reducescatter,allgather"
slow_colls=allreduce
min=1M max=64M slow_max=16M factor=4 seconds=0.3 reps=3 only="" dir="" build=1
die() {
  echo "bench-compress: $*" >&2
  exit 1
}
while [ $# -gt 0 ]; do
  case "$1" in
    --formats | --colls | --slow-colls | --min | --max | --slow-max | --factor | --seconds | --reps | --only | \
      --dir)
      [ $# -ge 2 ] || { echo "bench-compress: $1 needs a value" >&2; exit 2; }
      case "$1" in
        --formats) formats=$2 ;;
        --colls) colls=$2 ;;
        --slow-colls) slow_colls=$2 ;;
        --min) min=$2 ;;
        --max) max=$2 ;;
        --slow-max) slow_max=$2 ;;
        --factor) factor=$2 ;;
        --seconds) seconds=$2 ;;
        --reps) reps=$2 ;;
        --only) only=$2 ;;
        --dir) dir=$2 ;;
      esac
      shift 2 ;;
    --no-build) build=0; shift ;;
    -h | --help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "bench-compress: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$only" in
  "" | fast | slow) ;;
  *) echo "bench-compress: --only: '$only' is not fast or slow" >&2; exit 2 ;;
esac
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
if [ "$build" = 1 ] && [ -z "${FABRICOLL_PERF:-}" ]; then
  NEURON=0 scripts/build.sh || die "scripts/build.sh failed"
fi
dir=${dir:-$target/bench-compress/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$dir" || die "cannot create $dir"
common=(--compress "$formats" --min "$min" --factor "$factor"
  --seconds "$seconds" --reps "$reps" --dir "$dir")
rc=0
if [ "$only" != slow ]; then
  scripts/bench-multihost.sh "${common[@]}" --colls "$colls" --layouts 2x2,4x1 --rate 1gbit \
    --delays 0 --max "$max" || rc=1
fi
if [ "$only" != fast ]; then
  scripts/bench-multihost.sh "${common[@]}" --colls "$slow_colls" --layouts 4x1 \
    --rate 100mbit --delays 1ms --max "$slow_max" || rc=1
fi
echo "bench-compress: $(git rev-parse --short HEAD 2>/dev/null), $(nproc) CPUs; tables in $dir/summary.txt"
exit "$rc"
