#!/usr/bin/env bash
# scripts/bench-coll.sh - collective benchmark: fabricoll's engines next to Open MPI.
# A benchmark, not a test: it prints tables and never fails on a number.
#
# For each repetition, transport, rank count and collective it runs, alternating (which one goes
# first alternates with the repetition), each on an idle machine (wait-quiet.sh before each run):
#   ours  $TARGET/release/fabricoll-perf --ranks R --coll C --algo $ALGO -d float -o sum -c 0
#         -t $BENCH_T -w 5 -m 5 -n 1000 --bind rr  (BENCH_BIND below)
#   ompi  mpirun.openmpi ... mpi_coll_bench.openmpi -o C  (scripts/baselines/mpi_coll_bench.c:
#         MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block, float sum, out of place)
# with the same transport class:
#   shm   ours FABRICOLL_PROVIDER=shm          | Open MPI --mca pml ob1 --mca btl self,vader
#   tcp   ours FABRICOLL_PROVIDER=tcp, FABRICOLL_DOMAIN=lo (tcp;ofi_rxm)
#                                              | Open MPI --mca pml ob1 --mca btl self,tcp
#                                                         --mca btl_tcp_if_include lo
#   net   ours FABRICOLL_PROVIDER=net, FABRICOLL_DOMAIN=lo (libfabric 1.17's native TCP RDM
#         endpoint, named tcp from 1.18: our default TCP transport)
#                                              | Open MPI as for tcp, run again beside it
# (the mpirun flags of scripts/baselines/run-mpi.sh), then prints, per collective /
# ranks / transport, the per-size MEDIANS over the repetitions: busbw of both, ratio ours/OMPI
# (bw_x), the median of the ratios within each repetition (pair_x), time of both, and the median
# time at the smallest size both report (8 B, or 16 B for allgather and reducescatter at 4 ranks)
# with the time ratio (and its median within repetitions); then a "target[...]" line per table
# and a "# target, <transport>" total: the sizes from 64 KiB whose bw_x (as printed) is at least
# 1.00, and whether the smallest size's time ratio is within 1.5 (the small-message target: within 1.5x of the baseline), each also
# by the ratios within repetitions.
# pair_x because this machine drifts between fast and slow spells of a few runs each, in both
# tools alike, so the medians of each side alone can compare one tool's slow spell with the
# other's fast one (docs/performance.md has the runs that showed it).
# The spells come from the host moving the 2 vCPUs between sharing one L3 cache and not (and a
# third state, both on one core's two hardware threads), which a cache line's round trip
# between CPU 0 and CPU 1 (fabricoll-info --core-rtt 0 1) tells apart. So the script measures
# that round trip before and after every run. The measured round trips fall into
# classes: sorted, a value more than 1.5 times the one before starts a new class. A run whose
# two probes fall into one class ran in that mode; mode_x is the median of the ratios within
# repetitions whose two runs ran in one and the same mode (nm of them), so that no ratio
# compares one tool's fast spell with the other's slow one.
#
# Binding is alike (BENCH_BIND): by default both bind rank r to CPU r mod the CPU count, 4 ranks
# on 2 CPUs too (ours --bind rr, Open MPI --bind-to core:overload-allowed, which maps by core:
# mpirun --report-bindings). Unbound oversubscribed ranks migrate between the CPUs and each
# launch finds its own pattern, which spreads small-size times in both tools.
# BENCH_BIND=default keeps each tool's default instead: 2 ranks one per CPU, 4 ranks unbound
# (mpirun's default and fabricoll-perf's --bind core).
# Definitions (identical in both tools, nccl-tests conventions, checked in the sources):
#   size    allreduce: bytes of the buffer; allgather: bytes of the gathered OUTPUT (n x per-rank
#           send); reducescatter: bytes of the INPUT (n x per-rank receive). Both round the element
#           count down to a multiple of n for allgather / reducescatter, so the size columns match
#           row for row; a size below n x 4 B gives no row in either (fabricoll-perf prints a
#           size-0 row, which is ignored).
#   busbw   algbw x 2(n-1)/n (allreduce), x (n-1)/n (allgather, reducescatter); GB/s = 1e9 B/s.
#   time    per-iteration mean, averaged over ranks in both (nccl-tests' default; fabricoll-perf
#           -a 1).
#   iterations  the same rule in both: 5 warm-up iterations, whose time estimates one
#           iteration (the slowest rank's), then clamp(BENCH_T / estimate, 5, 1000) timed ones
#           per size (mpi_coll_bench -t, fabricoll-perf -t): a run with fewer iterations is
#           still warming up, in raw libfabric as much as in ours.
#
# Environment (defaults in brackets):
#   REPS [5]                     repetitions (ours and OMPI alternate inside each)
#   ALGO [auto]                  fabricoll algorithm (--algo)
#   BENCH_COLLS [allreduce allgather reducescatter]
#   BENCH_RANKS [2 4]            BENCH_TRANSPORTS [shm tcp net]
#   BENCH_BIND [rr]              rr: both bind rank r to CPU r mod n; default: each tool's own
#   BENCH_MIN_BYTES [8], BENCH_MAX_BYTES [64M]   sizes, powers of two (K, M, G = powers of 1024)
#   BENCH_T [0.2]                target seconds of timed iterations per size, both tools
#                                (scripts/baselines/run-mpi.sh's default)
#   QUIET [1]                    wait-quiet.sh before every run; QUIET_MAX [60] bounds each wait
#   BENCH_RUN_TIMEOUT [600]      seconds allowed to each run
#   BENCH_LIB_TIMEOUT_MS [60000] FABRICOLL_TIMEOUT_MS of our ranks: a rank that dies (or never
#                                starts) fails the others after this long instead of the
#                                library's default 10 minutes
#   BENCH_DEADLINE [3600]        no new repetition starts after this many seconds; the longest
#                                run is BENCH_DEADLINE + one repetition
#   BENCH_RESUMMARIZE [unset]    a .bench/coll-* directory: print its tables again, run nothing
#   BENCH_BUILD [1]              scripts/deps.sh --bench (Open MPI) and scripts/build.sh first,
#                                and scripts/baselines/build.sh when mpi_coll_bench is missing or
#                                older than its source
#   BASELINES [scripts/baselines]   BASELINE_BUILD [~/.cache/fabricoll-baselines]
#   CARGO_TARGET_DIR [target]
# docs/performance.md gives how long a repetition takes at the defaults.
# Raw logs go to .bench/coll-<date>/ (gitignored); the tables also go to summary.txt there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)

if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi

to_bytes() { # 64M -> 67108864 (K/M/G are powers of 1024; a trailing B or iB is ignored)
  local v=${1%B}
  v=${v%i}
  case "$v" in
    *[kK]) echo $((${v%?} << 10)) ;;
    *[mM]) echo $((${v%?} << 20)) ;;
    *[gG]) echo $((${v%?} << 30)) ;;
    *) echo $((v)) ;;
  esac
}

reps=${REPS:-5}
algo=${ALGO:-auto}
colls=${BENCH_COLLS:-allreduce allgather reducescatter}
ranks_list=${BENCH_RANKS:-2 4}
transports=${BENCH_TRANSPORTS:-shm tcp net}
min_b=$(to_bytes "${BENCH_MIN_BYTES:-8}")
max_b=$(to_bytes "${BENCH_MAX_BYTES:-64M}")
t_size=${BENCH_T:-0.2}
bind=${BENCH_BIND:-rr}
case "$bind" in
  rr) our_bind=(--bind rr) ompi_bind=(--bind-to core:overload-allowed) ;;
  default) our_bind=(--bind core) ompi_bind=() ;;
  *) echo "bench-coll.sh: BENCH_BIND=$bind is not rr or default" >&2; exit 2 ;;
esac
quiet=${QUIET:-1}
quiet_max=${QUIET_MAX:-60}
run_timeout=${BENCH_RUN_TIMEOUT:-600}
lib_timeout_ms=${BENCH_LIB_TIMEOUT_MS:-60000}
deadline=${BENCH_DEADLINE:-3600}
baselines=${BASELINES:-$root/scripts/baselines}
mpi_build=${BASELINE_BUILD:-${XDG_CACHE_HOME:-$HOME/.cache}/fabricoll-baselines}
target_dir=${CARGO_TARGET_DIR:-target}
perf="$target_dir/release/fabricoll-perf"
info="$target_dir/release/fabricoll-info"
mpi_bench="$mpi_build/mpi_coll_bench.openmpi"
wait_quiet="$baselines/wait-quiet.sh"

for c in $colls; do
  case "$c" in allreduce | allgather | reducescatter) ;;
    *) echo "bench-coll.sh: BENCH_COLLS: $c has no Open MPI counterpart here (allreduce allgather reducescatter)" >&2; exit 2 ;;
  esac
done
for t in $transports; do
  case "$t" in shm | tcp | net) ;; *) echo "bench-coll.sh: BENCH_TRANSPORTS: unknown $t (shm tcp net)" >&2; exit 2 ;; esac
done

# BENCH_RESUMMARIZE=DIR: no runs, only the tables again, from the samples and modes of an
# earlier run's directory (give the BENCH_* settings of that run).
again=${BENCH_RESUMMARIZE:-}
if [ -z "$again" ]; then # the runs, down to "end of the runs"

if [ "${BENCH_BUILD:-1}" != 0 ]; then
  scripts/deps.sh --bench
  scripts/build.sh
fi
[ -x "$perf" ] || { echo "bench-coll.sh: $perf not found: run scripts/build.sh" >&2; exit 1; }
[ -x "$wait_quiet" ] || { echo "bench-coll.sh: $wait_quiet not found (set BASELINES=dir)" >&2; exit 1; }
command -v mpirun.openmpi >/dev/null 2>&1 ||
  { echo "bench-coll.sh: mpirun.openmpi not found: run scripts/deps.sh --bench" >&2; exit 1; }
if [ ! -x "$mpi_bench" ] || [ "$baselines/mpi_coll_bench.c" -nt "$mpi_bench" ]; then
  # build.sh also builds the MPICH binary where MPICH is installed: only the Open MPI binary
  # matters here, so compile it directly if build.sh stops early
  BASELINE_BUILD="$mpi_build" "$baselines/build.sh" >/dev/null 2>&1 || true
  if [ ! -x "$mpi_bench" ] || [ "$baselines/mpi_coll_bench.c" -nt "$mpi_bench" ]; then
    mkdir -p "$mpi_build"
    mpicc.openmpi -O2 -Wall -o "$mpi_bench" "$baselines/mpi_coll_bench.c" -lm
  fi
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ompi=(mpirun.openmpi --oversubscribe --allow-run-as-root --mca oob_tcp_if_include lo)

out=".bench/coll-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
{
  echo "# bench-coll: $(nproc) cpus, REPS=$reps, ALGO=$algo, sizes $min_b..$max_b B, colls: $colls," \
    "ranks: $ranks_list, transports: $transports, binding: $bind; logs in $out/"
  echo "# $(mpirun.openmpi --version 2>/dev/null | head -1); $(fi_info --version 2>/dev/null | head -1 || true);" \
    "git $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo '+dirty')"
} | tee "$out/header.txt"

quiet_gate() { # quiet_gate WHAT: wait (bounded) for an idle machine; fails if it never was
  [ "$quiet" != 0 ] || return 0
  local rc=0
  "$wait_quiet" "$quiet_max" 15 3 2>"$out/wait-quiet.tmp" || rc=$?
  sed "s/^/#   [$1] /" "$out/wait-quiet.tmp"
  rm -f "$out/wait-quiet.tmp"
  return "$rc"
}

core_rtt() { # the cache-line round trip between CPUs 0 and 1 in ns, "-" where it cannot tell
  local v
  v=$("$info" --core-rtt 0 1 2>/dev/null | awk '$1 == "core-rtt" { print $4 }') || true
  echo "${v:--}"
}

run_ours() { # run_ours TRANSPORT RANKS COLL FILE
  local tr=$1 r=$2 c=$3 f=$4 env_p
  case "$tr" in
    shm) env_p=(FABRICOLL_PROVIDER=shm) ;;
    tcp | net) env_p=(FABRICOLL_PROVIDER="$tr" FABRICOLL_DOMAIN=lo FABRICOLL_INTRA_PROVIDER=same) ;;
  esac
  env_p+=(FABRICOLL_TIMEOUT_MS="$lib_timeout_ms")
  local cmd=("$perf" --ranks "$r" --coll "$c" --algo "$algo" -b "$min_b" -e "$max_b" -f 2
    -t "$t_size" -w 5 -m 5 -n 1000 -d float -o sum -c 0 "${our_bind[@]}")
  echo "# cmd: ${env_p[*]} ${cmd[*]}" >"$f"
  env -u FABRICOLL_DOMAIN -u FABRICOLL_ALGO "${env_p[@]}" timeout --kill-after=10 "$run_timeout" \
    "${cmd[@]}" >>"$f" 2>&1
}

run_ompi() { # run_ompi TRANSPORT RANKS COLL FILE
  local tr=$1 r=$2 c=$3 f=$4 btl
  case "$tr" in
    shm) btl=(--mca pml ob1 --mca btl self,vader) ;;
    tcp | net) btl=(--mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo) ;;
  esac
  local cmd=("${ompi[@]}" "${ompi_bind[@]}" -np "$r" "${btl[@]}" "$mpi_bench" -o "$c" -b "$min_b" -e "$max_b"
    -t "$t_size" -w 5 -m 5 -n 1000 -r 1 -c 0)
  echo "# cmd: ${cmd[*]}" >"$f"
  timeout --kill-after=10 "$run_timeout" "${cmd[@]}" >>"$f" 2>&1
}

# Long-format samples: "COLL RANKS TRANSPORT SIZE WHO METRIC VALUE REP" (WHO = ours | ompi)
collect_ours() { # collect_ours COLL RANKS TRANSPORT FILE REP; fabricoll-perf rows: size count
  # type redop algo time algbw busbw #wrong
  awk -v k="$1 $2 $3" -v rep="$5" '/^ *[0-9]+ / && NF >= 9 && $1 + 0 > 0 && $6 + 0 > 0 {
         print k, $1, "ours", "time", $6, rep; print k, $1, "ours", "busbw", $8, rep
         print k, $1, "algo", $5, 0, rep }' "$4"
}
collect_ompi() { # collect_ompi COLL RANKS TRANSPORT FILE REP; mpi_coll_bench rows: size count
  # type redop iters time tmin algbw busbw #wrong
  awk -v k="$1 $2 $3" -v rep="$5" '/^# op=/ { ok = ($2 == "op='"$1"'") }
       ok && /^ *[0-9]+ / && NF >= 10 && $1 + 0 > 0 && $6 + 0 > 0 {
         print k, $1, "ompi", "time", $6, rep; print k, $1, "ompi", "busbw", $9, rep }' "$4"
}

t0=$(date +%s)
done_reps=0
samples="$out/samples.txt"
: >"$samples"
# One line per run: "COLL RANKS TRANSPORT WHO REP RTT_BEFORE RTT_AFTER" (core_rtt, ns)
modes="$out/modes.txt"
: >"$modes"
for rep in $(seq 1 "$reps"); do
  if [ $(($(date +%s) - t0)) -ge "$deadline" ]; then
    echo "# BENCH_DEADLINE=${deadline}s reached: stopping after $done_reps repetition(s)"
    break
  fi
  if [ $((rep % 2)) = 1 ]; then order="ours ompi"; else order="ompi ours"; fi
  for tr in $transports; do
    for r in $ranks_list; do
      for c in $colls; do
        for who in $order; do
          f="$out/$c-np$r-$tr-$who-$rep.txt"
          quiet_gate "$c np$r $tr $who $rep" || echo "$c np$r $tr $who $rep" >>"$out/busy.txt"
          rtt0=$(core_rtt)
          ts=$(date +%s)
          rc=0
          if [ "$who" = ours ]; then
            run_ours "$tr" "$r" "$c" "$f" || rc=$?
            collect_ours "$c" "$r" "$tr" "$f" "$rep" >>"$samples"
          else
            run_ompi "$tr" "$r" "$c" "$f" || rc=$?
            collect_ompi "$c" "$r" "$tr" "$f" "$rep" >>"$samples"
          fi
          rtt1=$(core_rtt)
          echo "$c $r $tr $who $rep $rtt0 $rtt1" >>"$modes"
          echo "# rep $rep/$reps $c np$r $tr $who: $(($(date +%s) - ts)) s, exit $rc, core rtt $rtt0 -> $rtt1 ns"
          if [ "$rc" != 0 ]; then
            grep -v '^#' "$f" | tail -5 | sed 's/^/#     /'
          fi
        done
      done
    done
  done
  done_reps=$rep
done
reps_arg=(--reps "$done_reps")

else # BENCH_RESUMMARIZE
  out=${again%/}
  samples="$out/samples.txt"
  [ -s "$samples" ] || { echo "bench-coll.sh: BENCH_RESUMMARIZE: no $samples" >&2; exit 1; }
  reps_arg=() # benchsum.py counts the repetitions in the samples
  t0=$(date +%s)
fi # end of the runs

# The tables: scripts/benchsum.py (medians, pairs within repetitions, cache modes, targets).
python3 scripts/benchsum.py coll "$out" --algo "$algo" --colls "$colls" --ranks "$ranks_list" \
  --transports "$transports" --t0 "$t0" "${reps_arg[@]}" | tee "$out/summary.txt"
