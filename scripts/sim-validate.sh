#!/usr/bin/env bash
# scripts/sim-validate.sh - the simulator (fabricoll-sim) against the emulated hosts: measure
# every forced algorithm on network namespaces shaped to a link rate and delay
# (scripts/bench-multihost.sh), simulate the same layouts, collectives and sizes with the
# parameters of that emulated machine, and print the prediction error per algorithm and size as a
# Markdown table (scripts/multihost/simval.py, whose docstring says where each parameter comes
# from).
#
#   scripts/sim-validate.sh [--layouts 2x2,4x1,2x4,4x2] [--rates 1gbit,10gbit] [--delays 0,1ms]
#       [--colls allreduce,allgather,reducescatter] [--algos ring,rdh,...] [--min 16] [--max 64M]
#       [--factor 4] [--seconds 0.3] [--reps 3] [--dir DIR] [--payload-fraction F]
#       [--compare-only]
#
# Per rate, one scripts/bench-multihost.sh run into DIR/<rate>/ (--no-ompi --no-auto
# --calibrate: forced algorithms only, every one that implements the collective unless --algos
# names some, and per layout, delay and repetition a short run of auto with FABRICOLL_LOG=info
# whose calibration line gives the simulator its per-message costs, intra-host figures and
# reduction speed). Then simval.py compares: the report goes to DIR/simval.md and stdout.
# --compare-only skips the measurements and compares what DIR already holds (a new simulator on
# old measurements). The defaults are hours of measurement on 2 CPUs (4 layouts x 2 rates x 2
# delays x 3 collectives x about 10 algorithms x 3 repetitions); a reduced run:
#   scripts/sim-validate.sh --layouts 2x2,4x1 --rates 1gbit --delays 0,1ms --colls allreduce \
#       --algos ring,rdh,mesh,bidir_ring,swizzle --min 64K --max 16M --reps 2
# Needs root, and for delays iptables and libnetfilter-queue-dev (scripts/deps.sh --bench); the
# binaries fabricoll-perf, fabricoll-info and fabricoll-sim (scripts/build.sh).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
target=${CARGO_TARGET_DIR:-target}
layouts=2x2,4x1,2x4,4x2 rates=1gbit,10gbit delays=0,1ms colls=allreduce,allgather,reducescatter
algos="" min=16 max=64M factor=4 seconds=0.3 reps=3 dir="" payload="" compare_only=0
die() {
  echo "sim-validate: $*" >&2
  exit 1
}
while [ $# -gt 0 ]; do
  case "$1" in
    --compare-only) compare_only=1; shift ;;
    --layouts | --rates | --delays | --colls | --algos | --min | --max | --factor | --seconds | \
      --reps | --dir | --payload-fraction)
      [ $# -ge 2 ] || die "$1 needs a value"
      v=$2
      case "$1" in
        --layouts) layouts=$v ;; --rates) rates=$v ;; --delays) delays=$v ;; --colls) colls=$v ;;
        --algos) algos=$v ;; --min) min=$v ;; --max) max=$v ;; --factor) factor=$v ;;
        --seconds) seconds=$v ;; --reps) reps=$v ;; --dir) dir=$v ;; --payload-fraction) payload=$v ;;
      esac
      shift 2 ;;
    -h | --help) sed -n '2,25p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
sim=${FABRICOLL_SIM:-$target/release/fabricoll-sim}
[ -x "$sim" ] || die "$sim not found: run scripts/build.sh (or set FABRICOLL_SIM)"
if [ "$compare_only" = 1 ]; then
  [ -n "$dir" ] || die "--compare-only needs --dir (an earlier run's directory)"
else
  dir=${dir:-$target/sim-validate/$(date +%Y%m%d-%H%M%S)}
fi
mkdir -p "$dir" || die "cannot create $dir"

rc=0
if [ "$compare_only" = 0 ]; then
  echo "sim-validate: results in $dir ($(git rev-parse --short HEAD 2>/dev/null), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg))"
  t0=$(date +%s)
  extra=()
  [ -n "$algos" ] && extra+=(--algos "$algos")
  for rate in ${rates//,/ }; do
    # one folder per rate: simval.py reads DIR/<rate>/samples.jsonl and calibrations.jsonl
    scripts/bench-multihost.sh --dir "$dir/$rate" --rate "$rate" --layouts "$layouts" \
      --delays "$delays" --colls "$colls" --min "$min" --max "$max" --factor "$factor" \
      --seconds "$seconds" --reps "$reps" --no-ompi --no-auto --calibrate "${extra[@]}" ||
      { rc=$?; echo "sim-validate: bench-multihost.sh at $rate failed (status $rc): comparing what was measured"; }
  done
  echo "sim-validate: measured in $(($(date +%s) - t0))s"
fi
pargs=(--dir "$dir" --sim "$sim" --out "$dir/simval.md")
[ -n "$payload" ] && pargs+=(--payload-fraction "$payload")
python3 scripts/multihost/simval.py "${pargs[@]}" || rc=$?
echo "sim-validate: report in $dir/simval.md"
exit "$rc"
