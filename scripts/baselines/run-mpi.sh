#!/usr/bin/env bash
# scripts/baselines/run-mpi.sh - the MPI baselines on their own: mpi_coll_bench's tables for
# each configuration and rank count, one file each in OUT (default ./baseline-out/mpi).
# scripts/bench-coll.sh runs the Open MPI shared-memory and TCP configurations alternating with
# fabricoll-perf; this runs more of them, for reference.
#
#   CONFIGS  [ompi-vader ompi-tcp ompi-ofi-tcp mpich]   NPS [2 4]   REPS [3]   T [0.2] (s per size)
#   MIN_BYTES [8]  MAX_BYTES [64M]  FACTOR [2]  (sizes, as mpi_coll_bench's -b -e -f)
#   QUIET [1]  0: no wait for an idle machine   RUN_TIMEOUT [1200] seconds allowed to each run
#   ompi-vader    Open MPI, shared memory (btl self,vader)
#   ompi-tcp      Open MPI, TCP on lo (btl self,tcp; Open MPI ignores lo unless told)
#   ompi-ofi-tcp  Open MPI over libfabric's tcp;ofi_rxm (pml cm, mtl ofi)
#   mpich         MPICH with its defaults (where build.sh built its binary)
# Each run waits for an idle machine first (wait-quiet.sh, unless QUIET=0) and runs under
# `timeout`; the exit status is 1 if any run failed (or reported a wrong element: -c 1).
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=${BASELINE_BUILD:-${XDG_CACHE_HOME:-$HOME/.cache}/fabricoll-baselines}
out=${OUT:-./baseline-out/mpi}
configs=${CONFIGS:-ompi-vader ompi-tcp ompi-ofi-tcp mpich}
mkdir -p "$out"
# (re)build when the binary is missing or older than its source
if [ ! -x "$build/mpi_coll_bench.openmpi" ] || [ "$here/mpi_coll_bench.c" -nt "$build/mpi_coll_bench.openmpi" ]; then
  BASELINE_BUILD="$build" "$here/build.sh" >/dev/null || { echo "run-mpi.sh: build.sh failed" >&2; exit 1; }
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ompi=(mpirun.openmpi --oversubscribe --allow-run-as-root --mca oob_tcp_if_include lo)
args=(-b "${MIN_BYTES:-8}" -e "${MAX_BYTES:-64M}" -f "${FACTOR:-2}" -t "${T:-0.2}" -w 5 -m 5 -n 1000
  -r "${REPS:-3}" -c 1)
rc=0
for np in ${NPS:-2 4}; do
  for cfg in $configs; do
    case $cfg in
      ompi-vader) cmd=("${ompi[@]}" -np "$np" --mca pml ob1 --mca btl self,vader "$build/mpi_coll_bench.openmpi") ;;
      ompi-tcp) cmd=("${ompi[@]}" -np "$np" --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo "$build/mpi_coll_bench.openmpi") ;;
      ompi-ofi-tcp) cmd=("${ompi[@]}" -np "$np" --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include "tcp;ofi_rxm" -x FI_TCP_IFACE=lo "$build/mpi_coll_bench.openmpi") ;;
      mpich)
        [ -x "$build/mpi_coll_bench.mpich" ] || { echo "run-mpi.sh: no MPICH build, $cfg skipped" >&2; continue; }
        cmd=(mpirun.mpich -np "$np" "$build/mpi_coll_bench.mpich") ;;
      *) echo "run-mpi.sh: unknown configuration $cfg" >&2; rc=2; continue ;;
    esac
    f="$out/${cfg}_np$np.txt"
    [ "${QUIET:-1}" = 0 ] || "$here/wait-quiet.sh" 30 15 2
    { echo "# cmd: ${cmd[*]} ${args[*]}"; echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"; } >"$f"
    timeout --kill-after=10 "${RUN_TIMEOUT:-1200}" "${cmd[@]}" "${args[@]}" >>"$f" 2>&1 || { echo "run-mpi.sh: $cfg np=$np failed (see $f)" >&2; rc=1; }
    echo "$cfg np=$np: $f"
  done
done
exit "$rc"
