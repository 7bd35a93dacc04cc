#!/usr/bin/env bash
# scripts/coll-tests.sh - multi-process test of the collective engines through fabricoll-perf.
#
# For each rank count, algorithm (ring bidir_ring mesh mesh1 rdh rd tree dbtree bruck pairwise
# hier auto) and collective (allreduce allgather reducescatter broadcast reduce alltoall), runs
#   fabricoll-perf --ranks R --coll C --algo A -b 4 -e 64K -f 8 -n 2 -w 1 -c 1 [variant options]
# over libfabric tcp and net (FABRICOLL_DOMAIN=lo: loopback only) and shm. fabricoll-perf forks the
# ranks, checks every element of every size against its own reference and exits non-zero on a
# wrong element or a failed rank. Sizes 4 B .. 16-64 KiB: counts below the rank count, uneven
# chunks (every third run uses -f 7: 4, 28, 196, ... bytes) and several slices.
#
# Variants rotate over the runs: data types and ops (float sum, double max, int32 sum,
# bfloat16 sum, half avg, int64 prod, uint8 min, fp8_e4m3 sum), --inplace on every fourth run,
# root = run index mod R for broadcast and reduce, `-t 0.0001 -m 1 -n 3` (iterations from a time
# target, agreed by the ranks) on every fifth, FABRICOLL_SHM_FASTBOX=0 on every seventh over shm;
# one run per algorithm at 4 ranks goes to 1 MiB.
# hier runs with FABRICOLL_LOCAL_RANKS=2, so only at even rank counts (SKIP otherwise).
#
# An algorithm that does not implement a collective makes fabricoll-perf fail with "does not
# implement": that pair is SKIP (not a failure), and is remembered (support depends on the
# algorithm and the collective only), so it is tried once.
#
# Matrix (about 6 minutes on an idle 2-core machine): every pair at 4 and 3 ranks over every
# provider; at 2, 5 and 8 ranks every pair over one provider, in rotation (each pair meets every
# provider across those rank counts). COLL_FULL=1: every rank count over every provider.
#
# Output: one line per run (PASS / FAIL / SKIP, with the command's variant and seconds); a FAIL
# prints the command line to reproduce it and the tail of its output. Last line:
#   coll-tests: N passed, M failed, K skipped
# Exit status non-zero on any failure.
#
# Environment (defaults in brackets):
#   COLL_PROVIDERS [tcp shm net] (net where fi_info finds it)   COLL_RANKS [4 3 2 5 8]
#   COLL_ALGOS [ring bidir_ring mesh mesh1 rdh rd tree dbtree bruck pairwise hier auto]
#   COLL_COLLS [allreduce allgather reducescatter broadcast reduce alltoall]
#   COLL_FULL [0]              1: every rank count over every provider
#   COLL_RUN_TIMEOUT [90]      seconds per fabricoll-perf run (wrapped in timeout)
#   COLL_LIB_TIMEOUT_MS [20000] FABRICOLL_TIMEOUT_MS of the ranks (a lost peer becomes an error)
#   COLL_DEADLINE [0]          if > 0: runs not started after this many seconds are NOT RUN
#                              (counted as failed, so an incomplete run never passes)
#   FABRICOLL_PERF [$CARGO_TARGET_DIR/release/fabricoll-perf]
#   COLL_LOGDIR [$CARGO_TARGET_DIR/coll-tests/<date>-<pid>]   where the run logs go
# Logs: one directory per run (so concurrent runs never touch each other's files), with one
# <provider>-r<R>-<algo>-<coll>.log per run of fabricoll-perf; directories older than a day
# are removed; $CARGO_TARGET_DIR/coll-tests/latest points to the newest.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."

target_dir=${CARGO_TARGET_DIR:-target}
perf=${FABRICOLL_PERF:-$target_dir/release/fabricoll-perf}
. scripts/providers.sh
providers=${COLL_PROVIDERS:-$(with_net "tcp shm")}
ranks_list=${COLL_RANKS:-4 3 2 5 8}
algos=${COLL_ALGOS:-ring bidir_ring mesh mesh1 rdh rd tree dbtree bruck pairwise hier auto}
colls=${COLL_COLLS:-allreduce allgather reducescatter broadcast reduce alltoall}
full=${COLL_FULL:-0}
run_timeout=${COLL_RUN_TIMEOUT:-90}
lib_timeout_ms=${COLL_LIB_TIMEOUT_MS:-20000}
deadline=${COLL_DEADLINE:-0}
logroot="$target_dir/coll-tests"
logdir=${COLL_LOGDIR:-$logroot/$(date +%Y%m%d-%H%M%S)-$$}

if [ ! -x "$perf" ]; then
  echo "coll-tests: $perf not found: run scripts/build.sh (or set FABRICOLL_PERF)" >&2
  echo "coll-tests: 0 passed, 1 failed, 0 skipped"
  exit 1
fi
mkdir -p "$logdir"
if [ -z "${COLL_LOGDIR:-}" ]; then
  find "$logroot" -mindepth 1 -maxdepth 1 -type d -mmin +1440 -exec rm -rf {} + 2>/dev/null || true
  find "$logroot" -maxdepth 1 -type f -name '*.log' -mmin +60 -delete 2>/dev/null || true # old layout
  ln -sfn "${logdir##*/}" "$logroot/latest" 2>/dev/null || true
fi

dtypes=("float sum" "double max" "int32 sum" "bfloat16 sum" "half avg" "int64 prod" "uint8 min"
  "fp8_e4m3 sum")

pass=0 fail=0 skip=0 run_i=0
declare -A unsupported=() big_done=()
failed_list=()
t_start=$(date +%s)

# providers for (ranks, algo index, coll index)
providers_for() {
  local r=$1 ai=$2 ci=$3 list
  if [ "$full" = 1 ] || [ "$r" = 3 ] || [ "$r" = 4 ]; then
    echo "$providers"
    return
  fi
  read -r -a list <<<"$providers"
  # rotate over (algo, coll); the phase differs per rank count
  case "$r" in 2) ph=0 ;; 5) ph=1 ;; *) ph=$((r % 2 + 2)) ;; esac
  echo "${list[$(((ai + ci + ph) % ${#list[@]}))]}"
}

for r in $ranks_list; do
  ai=-1
  for algo in $algos; do
    ai=$((ai + 1))
    ci=-1
    for coll in $colls; do
      ci=$((ci + 1))
      for prov in $(providers_for "$r" "$ai" "$ci"); do
        tag="$prov r=$r $algo/$coll"
        if [ -n "${unsupported[$algo/$coll]:-}" ]; then
          printf 'SKIP %-34s %s does not implement %s\n' "$tag" "$algo" "$coll"
          skip=$((skip + 1))
          continue
        fi
        envs=(FABRICOLL_PROVIDER="$prov" FABRICOLL_TIMEOUT_MS="$lib_timeout_ms")
        is_ip "$prov" && envs+=(FABRICOLL_DOMAIN=lo)
        if [ "$algo" = hier ]; then
          if [ $((r % 2)) -ne 0 ]; then
            printf 'SKIP %-34s hier with FABRICOLL_LOCAL_RANKS=2 needs an even rank count\n' "$tag"
            skip=$((skip + 1))
            continue
          fi
          envs+=(FABRICOLL_LOCAL_RANKS=2)
        fi
        if [ "$deadline" -gt 0 ] && [ $(($(date +%s) - t_start)) -ge "$deadline" ]; then
          printf 'FAIL %-34s NOT RUN: COLL_DEADLINE=%ss reached\n' "$tag" "$deadline"
          fail=$((fail + 1))
          failed_list+=("$tag (not run)")
          continue
        fi
        # the variant of this run
        v=${dtypes[$((run_i % ${#dtypes[@]}))]}
        dt=${v% *} op=${v#* }
        f=8
        [ $((run_i % 3)) -eq 1 ] && f=7
        e=64K
        if [ "$r" = 4 ] && [ -z "${big_done[$prov/$algo]:-}" ]; then
          e=1M # one larger size per algorithm (its first collective) at 4 ranks
        fi
        args=(--ranks "$r" --coll "$coll" --algo "$algo" -b 4 -e "$e" -f "$f" -n 2 -w 1 -c 1 -d "$dt" -o "$op")
        desc="$dt/$op -f $f -e $e"
        if [ $((run_i % 4)) -eq 3 ]; then
          args+=(--inplace)
          desc="$desc inplace"
        fi
        if [ $((run_i % 5)) -eq 2 ]; then
          # iterations per size from a time target: the ranks must agree on the count
          args+=(-t 0.0001 -m 1 -n 3)
          desc="$desc -t"
        fi
        if [ "$prov" = shm ] && [ $((run_i % 7)) -eq 5 ]; then
          # shm's provider path for small messages (pool receives matched in software)
          envs+=(FABRICOLL_SHM_FASTBOX=0)
          desc="$desc no-fastbox"
        fi
        case "$coll" in
          broadcast | reduce)
            root=$((run_i % r))
            args+=(-r "$root")
            desc="$desc root $root"
            ;;
        esac
        run_i=$((run_i + 1))
        log="$logdir/$prov-r$r-$algo-$coll.log"
        t0=$(date +%s.%N)
        {
          echo "# env: ${envs[*]}"
          echo "# cmd: $perf ${args[*]}"
        } >"$log"
        timeout --kill-after=5 "$run_timeout" env -u FABRICOLL_DOMAIN -u FABRICOLL_LOCAL_RANKS -u FABRICOLL_SHM_FASTBOX \
          -u FABRICOLL_ALGO "${envs[@]}" "$perf" "${args[@]}" >>"$log" 2>&1
        rc=$?
        dt_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
        if [ "$rc" -ne 0 ] && grep -q "does not implement" "$log"; then
          unsupported[$algo/$coll]=1
          printf 'SKIP %-34s %s does not implement %s\n' "$tag" "$algo" "$coll"
          skip=$((skip + 1))
          continue
        fi
        [ "$e" = 1M ] && big_done[$prov/$algo]=1
        if [ "$rc" -eq 0 ] && grep -q '^# Out of bounds values : 0 OK' "$log"; then
          printf 'PASS %-34s %-40s %5ss\n' "$tag" "$desc" "$dt_s"
          pass=$((pass + 1))
        else
          why="exit $rc"
          [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && why="TIMEOUT after ${run_timeout}s"
          grep -q '^# Out of bounds values : [1-9]' "$log" && why="$why, wrong elements"
          printf 'FAIL %-34s %-40s %5ss  (%s)\n' "$tag" "$desc" "$dt_s" "$why"
          echo "     reproduce: env ${envs[*]} $perf ${args[*]}"
          [ -f "$log" ] || echo "     | (the log is gone: was $logdir removed by someone else?)"
          grep -vE '^#|^ *$' "$log" 2>/dev/null | grep -vE ' 0$' | tail -12 | sed 's/^/     | /'
          echo "     log: $log"
          fail=$((fail + 1))
          failed_list+=("$tag ($desc): $why")
        fi
      done
    done
  done
done

elapsed=$(($(date +%s) - t_start))
if [ "${#failed_list[@]}" -gt 0 ]; then
  echo
  echo "failed runs:"
  printf '  %s\n' "${failed_list[@]}"
fi
echo "coll-tests: elapsed ${elapsed}s; logs in $logdir"
echo "coll-tests: $pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
