#!/usr/bin/env bash
# scripts/bench-multihost.sh - fabricoll against Open MPI on emulated hosts (network namespaces
# joined by a bridge, scripts/netns-cluster.sh), every link shaped to a rate (tbf) and a one-way
# delay (scripts/multihost/nfq-delay.c, an NFQUEUE delayer: this kernel has no netem).
#
#   scripts/bench-multihost.sh [--layouts 2x2,4x1,2x4] [--delays 0,100us,1ms] [--rate 1gbit]
#       [--colls allreduce,allgather,reducescatter] [--min 16] [--max 64M] [--factor 4]
#       [--seconds 0.3] [--reps 3] [--provider net] [--dir DIR]
#       [--algos ring,rdh] [--no-auto] [--no-ompi] [--calibrate] [--compress bf16,fp8e4m3,int8]
#
# Per layout (HOSTSxRANKS or N+N+...), delay and collective, each repetition runs, in a rotating
# order: auto, every algorithm that implements the collective (forced), auto over one fabric
# (FABRICOLL_INTRA_PROVIDER=same, at 2x2 only), and Open MPI (mpirun inside host 1 with
# scripts/netns-rsh.sh, btl self,vader,tcp, mpi_yield_when_idle 1). fabricoll-perf ranks run one
# process per rank with torchrun's variables. Each size is timed for about --seconds (3-200
# iterations). scripts/multihost/summary.py then prints, per size, auto / best forced, our busbw
# / Open MPI's and one fabric / two fabrics; the tables go to DIR/summary.txt.
# --algos keeps only the named forced algorithms, --no-auto leaves auto (and auto-same) out,
# --no-ompi Open MPI; --calibrate logs each layout's and delay's calibration line to
# DIR/calibrations.jsonl (short runs of auto with FABRICOLL_LOG=info; scripts/sim-validate.sh).
# --compress FMTS times, instead of the tools above, auto uncompressed against auto with
# `fabricoll-perf --compress FMT`, each format's pair back to back (no Open MPI), and prints
# scripts/multihost/compress_summary.py's tables (scripts/bench-compress.sh runs it).
#
# Open MPI's side is mpi_coll_bench: MPI_BENCH names the binary, else it is built with
# mpicc.openmpi from MPI_BENCH_SRC (default scripts/baselines/mpi_coll_bench.c) into
# target/multihost/; without either, no Open MPI rows.
# Needs root, and for delays iptables and libnetfilter-queue-dev (scripts/deps.sh --bench).
#
# The full run (defaults: 3 layouts x 3 delays x 3 collectives x 3 repetitions, about 28 tool
# runs of 16 B..64 MiB per layout and delay) takes an estimated 3 to 4 hours on 2 CPUs; a subset
#   scripts/bench-multihost.sh --layouts 2x2 --delays 0 --colls allreduce --max 64K --reps 1
# takes under a minute. Run it on an otherwise idle machine: the ranks share its CPUs.
# The caller's FABRICOLL_* variables reach fabricoll's ranks (FABRICOLL_LOG=info logs each
# compressed call's exchanges; FABRICOLL_ALGO=alltoall:pairwise sets their algorithm).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
target=${CARGO_TARGET_DIR:-target}
dir=""
args=()
delays="0,100us,1ms"
no_ompi=0
compress=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir=${2:?--dir needs a value}; shift 2 ;;
    --delays) delays=${2:?--delays needs a value}; args+=("$1" "$2"); shift 2 ;;
    --no-ompi) no_ompi=1; shift ;;
    --compress)
      compress=${2:?--compress needs a value}; no_ompi=1; args+=("$1" "$2"); shift 2 ;;
    --no-auto | --calibrate) args+=("$1"); shift ;;
    --layouts | --rate | --colls | --min | --max | --factor | --seconds | --reps | --provider | \
      --algos)
      [ $# -ge 2 ] || { echo "bench-multihost: $1 needs a value" >&2; exit 2; }
      args+=("$1" "$2"); shift 2 ;;
    -h | --help) sed -n '2,33p' "$0"; exit 0 ;;
    *) echo "bench-multihost: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
die() {
  echo "bench-multihost: $*" >&2
  exit 1
}
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
perf=${FABRICOLL_PERF:-$target/release/fabricoll-perf}
[ -x "$perf" ] || die "$perf not found: run scripts/build.sh (or set FABRICOLL_PERF)"
mkdir -p "$target/multihost"

# the link delayer, when a delay is asked for
if [ -n "$(tr ',' '\n' <<<"$delays" | grep -vx '0')" ] && [ -z "${FABRICOLL_NFQ_DELAY:-}" ]; then
  command -v iptables >/dev/null || die "delays need iptables: scripts/deps.sh --bench (or --delays 0)"
  if [ ! -x "$target/multihost/nfq-delay" ] ||
    [ scripts/multihost/nfq-delay.c -nt "$target/multihost/nfq-delay" ]; then
    gcc -O2 -Wall -o "$target/multihost/nfq-delay" scripts/multihost/nfq-delay.c \
      -lnetfilter_queue -lnfnetlink ||
      die "cannot build the delayer: scripts/deps.sh --bench installs libnetfilter-queue-dev"
  fi
fi

# Open MPI's benchmark
mpi_bench=${MPI_BENCH:-}
src=${MPI_BENCH_SRC:-scripts/baselines/mpi_coll_bench.c}
if [ "$no_ompi" = 1 ]; then
  mpi_bench=""
  echo "bench-multihost: --no-ompi: no Open MPI rows"
elif [ -z "$mpi_bench" ] && [ -f "$src" ] && command -v mpicc.openmpi >/dev/null; then
  mpi_bench=$target/multihost/mpi_coll_bench.openmpi
  if [ ! -x "$mpi_bench" ] || [ "$src" -nt "$mpi_bench" ]; then
    mpicc.openmpi -O2 -o "$mpi_bench" "$src" -lm || die "cannot build $src"
  fi
fi
if [ -n "$mpi_bench" ]; then
  mpi_bench=$(cd "$(dirname "$mpi_bench")" && pwd)/$(basename "$mpi_bench")
  [ -x "$mpi_bench" ] || die "MPI_BENCH=$mpi_bench is not executable"
elif [ "$no_ompi" = 0 ]; then
  echo "bench-multihost: no Open MPI benchmark (MPI_BENCH unset, $src or mpicc.openmpi missing): no Open MPI rows"
fi

dir=${dir:-$target/bench-multihost/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$dir" || die "cannot create $dir"
scripts/netns-cluster.sh down --stale
runner=""
cleanup() {
  [ -n "$runner" ] && kill -TERM "$runner" 2>/dev/null
  scripts/netns-cluster.sh down --owner $$
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

echo "bench-multihost: results in $dir ($(git rev-parse --short HEAD 2>/dev/null), $(nproc) CPUs)"
t0=$(date +%s)
python3 scripts/multihost/bench.py --dir "$dir" --perf "$perf" --mpi-bench "$mpi_bench" \
  --prefix "fcn$$" --owner $$ "${args[@]}" &
runner=$!
wait "$runner"
rc=$?
runner=""
if [ -n "$compress" ]; then
  python3 scripts/multihost/compress_summary.py "$dir/samples.jsonl" | tee "$dir/summary.txt"
else
  python3 scripts/multihost/summary.py "$dir/samples.jsonl" | tee "$dir/summary.txt"
fi
echo "bench-multihost: $(($(date +%s) - t0))s; tables in $dir/summary.txt"
exit "$rc"
