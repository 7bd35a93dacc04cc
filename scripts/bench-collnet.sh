#!/usr/bin/env bash
# scripts/bench-collnet.sh - the NCCL CollNet path next to the native API path, AllReduce.
# A benchmark, not a test: it prints tables and never fails on a number.
#
# For each repetition, transport and rank count it runs, alternating (which one goes first
# alternates with the repetition), each on an idle machine (wait-quiet.sh before each run):
#   collnet  plugin-tests/build/collnet_harness --lib $TARGET/release/libnccl-net-fabricoll.so
#              --bench --ranks R -b MIN -e MAX -f 2 -n ITERS -w WARMUP
#            (forked ranks, each dlopens the plugin, connects ncclCollNetPlugin_v$CN_VERSION and
#            times iallreduce + test() polling, float sum, out of place, registered buffers)
#   native   $TARGET/release/fabricoll-perf --ranks R --coll allreduce -d float -o sum
#              -b MIN -e MAX -f 2 -n ITERS -w WARMUP -c 0        (the C/Rust API path)
# over   shm   FABRICOLL_PROVIDER=shm
#        tcp   FABRICOLL_PROVIDER=tcp FABRICOLL_DOMAIN=lo FABRICOLL_INTRA_PROVIDER=same (the native
#              side over tcp too; by default its ranks on one host would meet over shm)
# then prints per rank count / transport the per-size MEDIANS over the repetitions: time of both,
# the ratio CollNet time / native time (target: <= 1.1 from 64 KiB up; rows above it are marked
# "over"), and busbw of both.
#
# Waiting: the CollNet side polls test() as NCCL's proxy thread does (spinning, sched_yield()
# after 64 unsuccessful polls); fabricoll-perf waits as the API does (spins FABRICOLL_POLL_US,
# then blocks on the completion queue for up to 1 ms at a time).
# Definitions (the same in both tools): time = the SLOWEST rank's mean time per call; busbw =
# 2(n-1)/n x bytes / time (GB/s = 1e9 B/s). Both tools run the same iterations per size, in
# fabricoll-perf's bands (below 128 KiB: 500 + 50 warm-up; below 4 MiB: 50 + 5; above: 10 + 2)
# unless BENCH_ITERS is set.
#
# Environment (defaults in brackets):
#   REPS [5]                     repetitions (collnet and native alternate inside each)
#   BENCH_RANKS [2 4]            BENCH_TRANSPORTS [shm tcp]
#   BENCH_MIN_BYTES [64K], BENCH_MAX_BYTES [64M]   sizes, powers of two (K, M, G = powers of 1024)
#   BENCH_ITERS ["band"]         or "N W": N timed + W warm-up iterations for every size
#   CN_VERSION [12]              the ncclCollNetPlugin_vN table the CollNet side uses
#   BENCH_CHUNK [0]              CollNet side only: cut each size into calls of this many bytes
#                                with BENCH_INFLIGHT [8] in flight, as NCCL's proxy hands CollNet
#                                its chunks (0: one call per size)
#   QUIET [1]                    wait-quiet.sh before every run; QUIET_MAX [60] bounds each wait
#   BENCH_RUN_TIMEOUT [600]      seconds allowed to each run
#   BENCH_DEADLINE [3600]        no new repetition starts after this many seconds
#   BENCH_BUILD [1]              scripts/build.sh first (library, fabricoll-perf, C harness)
#   BASELINES [scripts/baselines]   (for wait-quiet.sh)
#   CARGO_TARGET_DIR [target]
# The 64 MiB size at 4 ranks over tcp dominates a repetition's time (docs/performance.md).
# Raw logs go to .bench/collnet-<date>/ (gitignored); the tables also go to summary.txt there.
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
ranks_list=${BENCH_RANKS:-2 4}
transports=${BENCH_TRANSPORTS:-shm tcp}
min_b=$(to_bytes "${BENCH_MIN_BYTES:-64K}")
max_b=$(to_bytes "${BENCH_MAX_BYTES:-64M}")
iters=${BENCH_ITERS:-band}
cn_version=${CN_VERSION:-12}
chunk=$(to_bytes "${BENCH_CHUNK:-0}")
inflight=${BENCH_INFLIGHT:-8}
quiet=${QUIET:-1}
quiet_max=${QUIET_MAX:-60}
run_timeout=${BENCH_RUN_TIMEOUT:-600}
deadline=${BENCH_DEADLINE:-3600}
baselines=${BASELINES:-$root/scripts/baselines}
target_dir=${CARGO_TARGET_DIR:-target}
perf="$target_dir/release/fabricoll-perf"
lib="$target_dir/release/libnccl-net-fabricoll.so"
harness="plugin-tests/build/collnet_harness"
wait_quiet="$baselines/wait-quiet.sh"

for t in $transports; do
  case "$t" in shm | tcp) ;; *) echo "bench-collnet.sh: BENCH_TRANSPORTS: unknown $t (shm tcp)" >&2; exit 2 ;; esac
done
if [ "$min_b" -lt 4 ] || [ "$max_b" -lt "$min_b" ]; then
  echo "bench-collnet.sh: bad sizes $min_b..$max_b" >&2
  exit 2
fi
if [ "$iters" != band ] && ! [[ $iters =~ ^[0-9]+\ [0-9]+$ ]]; then
  echo "bench-collnet.sh: BENCH_ITERS must be \"band\" or \"N W\"" >&2
  exit 2
fi

if [ "${BENCH_BUILD:-1}" != 0 ]; then
  scripts/build.sh
fi
[ -x "$perf" ] || { echo "bench-collnet.sh: $perf not found: run scripts/build.sh" >&2; exit 1; }
[ -f "$lib" ] || { echo "bench-collnet.sh: $lib not found: run scripts/build.sh" >&2; exit 1; }
if [ ! -x "$harness" ]; then
  make -C plugin-tests build/collnet_harness >/dev/null ||
    { echo "bench-collnet.sh: cannot build $harness" >&2; exit 1; }
fi
if [ "$quiet" != 0 ] && [ ! -x "$wait_quiet" ]; then
  echo "bench-collnet.sh: $wait_quiet not found (set BASELINES=dir, or QUIET=0)" >&2
  exit 1
fi

out=".bench/collnet-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
{
  echo "# bench-collnet: $(nproc) cpus, REPS=$reps, sizes $min_b..$max_b B, ranks: $ranks_list," \
    "transports: $transports, iterations: $iters, CollNet table v$cn_version," \
    "CollNet chunks: $([ "$chunk" = 0 ] && echo 'whole sizes' || echo "$chunk B, $inflight in flight"); logs in $out/"
  echo "# $(fi_info --version 2>/dev/null | head -1 || true); git $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(
    git diff --quiet 2>/dev/null || echo '+dirty')"
} | tee "$out/header.txt"

quiet_gate() { # quiet_gate WHAT: wait (bounded) for an idle machine; fails if it never was
  [ "$quiet" != 0 ] || return 0
  local rc=0
  "$wait_quiet" "$quiet_max" 15 3 2>"$out/wait-quiet.tmp" || rc=$?
  sed "s/^/#   [$1] /" "$out/wait-quiet.tmp"
  rm -f "$out/wait-quiet.tmp"
  return "$rc"
}

# "lo hi iters warmup" lines: consecutive sizes that run the same iterations
bands() {
  local s=$min_b lo=0 hi=0 it cur=""
  while [ "$s" -le "$max_b" ]; do
    if [ "$iters" != band ]; then
      it=$iters
    elif [ "$s" -lt $((128 << 10)) ]; then it="500 50"; elif [ "$s" -lt $((4 << 20)) ]; then it="50 5"; else it="10 2"; fi
    if [ "$it" != "$cur" ]; then
      [ -n "$cur" ] && echo "$lo $hi $cur"
      cur=$it lo=$s
    fi
    hi=$s
    s=$((s * 2))
  done
  [ -n "$cur" ] && echo "$lo $hi $cur"
}

provider_env() { # provider_env TRANSPORT: the env assignments
  case "$1" in
    shm) echo "FABRICOLL_PROVIDER=shm" ;;
    # one fabric: the engines would otherwise reach ranks of this host over shm
    tcp) echo "FABRICOLL_PROVIDER=tcp FABRICOLL_DOMAIN=lo FABRICOLL_INTRA_PROVIDER=same" ;;
  esac
}

run_one() { # run_one WHO TRANSPORT RANKS FILE
  local who=$1 tr=$2 r=$3 f=$4 lo hi it w rc=0
  local env_p
  read -r -a env_p <<<"$(provider_env "$tr")"
  : >"$f"
  while read -r lo hi it w; do
    local cmd
    if [ "$who" = collnet ]; then
      cmd=("$harness" --lib "$lib" --bench --version "$cn_version" --ranks "$r" -b "$lo" -e "$hi" -f 2 -n "$it"
        -w "$w" -c 1)
      [ "$chunk" = 0 ] || cmd+=(--chunk "$chunk" --inflight "$inflight")
    else
      cmd=("$perf" --ranks "$r" --coll allreduce -d float -o sum -b "$lo" -e "$hi" -f 2 -n "$it" -w "$w" -c 0 -a 3)
    fi
    echo "# cmd: ${env_p[*]} ${cmd[*]}" >>"$f"
    env -u FABRICOLL_DOMAIN -u FABRICOLL_ALGO "${env_p[@]}" HARNESS_NO_STACKS=1 timeout --kill-after=10 \
      "$run_timeout" "${cmd[@]}" >>"$f" 2>&1 || rc=$?
  done < <(bands)
  return "$rc"
}

# Long-format samples: "RANKS TRANSPORT SIZE WHO METRIC VALUE"
collect() { # collect WHO RANKS TRANSPORT FILE
  if [ "$1" = collnet ]; then # collnet_harness rows: size time_us busbw_GBps #wrong
    awk -v k="$2 $3" '/^ *[0-9]+ / && NF >= 4 && $1 + 0 > 0 && $2 + 0 > 0 {
           print k, $1, "collnet", "time", $2; print k, $1, "collnet", "busbw", $3
           if ($4 != "N/A" && $4 + 0 != 0) print k, $1, "collnet", "wrong", $4 }' "$4"
  else # fabricoll-perf rows: size count type redop algo time algbw busbw #wrong
    awk -v k="$2 $3" '/^ *[0-9]+ / && NF >= 9 && $1 + 0 > 0 && $6 + 0 > 0 {
           print k, $1, "native", "time", $6; print k, $1, "native", "busbw", $8; print k, $1, "algo", $5, 0 }' "$4"
  fi
}

t0=$(date +%s)
done_reps=0
samples="$out/samples.txt"
: >"$samples"
for rep in $(seq 1 "$reps"); do
  if [ $(($(date +%s) - t0)) -ge "$deadline" ]; then
    echo "# BENCH_DEADLINE=${deadline}s reached: stopping after $done_reps repetition(s)"
    break
  fi
  if [ $((rep % 2)) = 1 ]; then order="collnet native"; else order="native collnet"; fi
  for tr in $transports; do
    for r in $ranks_list; do
      for who in $order; do
        f="$out/np$r-$tr-$who-$rep.txt"
        quiet_gate "np$r $tr $who $rep" || echo "np$r $tr $who $rep" >>"$out/busy.txt"
        ts=$(date +%s)
        rc=0
        run_one "$who" "$tr" "$r" "$f" || rc=$?
        collect "$who" "$r" "$tr" "$f" >>"$samples"
        echo "# rep $rep/$reps np$r $tr $who: $(($(date +%s) - ts)) s, exit $rc"
        if [ "$rc" != 0 ]; then
          grep -v '^#' "$f" | tail -5 | sed 's/^/#     /'
          grep '^# FAIL' "$f" | tail -2 | sed 's/^/#     /'
        fi
      done
    done
  done
  done_reps=$rep
done

summarize() { # summarize RANKS TRANSPORT: the table of medians
  local r=$1 tr=$2
  echo
  echo "## allreduce float sum, $r ranks, $(provider_env "$tr"):" \
    "medians over $done_reps repetition(s); collnet = ncclCollNetPlugin_v$cn_version iallreduce + test," \
    "native = fabricoll-perf"
  python3 scripts/benchsum.py collnet "$samples" --ranks "$r" --transport "$tr"
}

{
  echo
  echo "# time: lower is better; t_ratio = CollNet time / native time (<= 1.1 is the target from 64 KiB up)."
  echo "# time = the slowest rank's per-call mean in both tools."
  if [ -s "$out/busy.txt" ]; then
    echo "# WARNING: $(wc -l <"$out/busy.txt") run(s) started on a busy machine (wait-quiet gave up); see $out/busy.txt"
  fi
  for tr in $transports; do
    for r in $ranks_list; do summarize "$r" "$tr"; done
  done
  echo
  echo "# total $(($(date +%s) - t0)) s; raw logs: $out/"
} | tee "$out/summary.txt"
