#!/usr/bin/env bash
# scripts/bench-ab.sh A_PERF B_PERF [OUT_DIR] - compare two builds of fabricoll-perf side by side.
#
# For REPS repetitions (default 5), alternating which build goes first, runs both builds'
# fabricoll-perf over each transport (BENCH_TRANSPORTS, default "shm net"), rank count
# (BENCH_RANKS, default "2 4") and collective (BENCH_COLLS, default "allreduce allgather
# reducescatter") at the sizes BENCH_SIZES (default "8 65536 1048576 16777216" bytes), then
# prints per cell the median time of each build and the median of the per-repetition ratios
# B/A (below 1: B is faster; scripts/benchsum.py ab). Time is fabricoll-perf's: each rank's mean
# per iteration, averaged over ranks, over about 0.3 s per size. Raw rows go to OUT_DIR
# (default .bench/ab-<date>). Run it on a quiet machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ $# -ge 2 ] || { sed -n '2,10p' "$0"; exit 2; }
a=$1 b=$2
out=${3:-.bench/ab-$(date +%Y%m%d-%H%M%S)}
reps=${REPS:-5}
transports=${BENCH_TRANSPORTS:-shm net}
ranks=${BENCH_RANKS:-2 4}
colls=${BENCH_COLLS:-allreduce allgather reducescatter}
sizes=${BENCH_SIZES:-8 65536 1048576 16777216}
mkdir -p "$out"
echo "bench-ab: A=$a B=$b reps=$reps -> $out"
run() { # run BUILD_LABEL PERF TRANSPORT RANKS COLL REP
  local label=$1 perf=$2 tr=$3 r=$4 c=$5 rep=$6 env_p=(FABRICOLL_PROVIDER="$3") s
  # one host: "same" keeps its ranks on the IP provider instead of shm
  [ "$tr" = shm ] || env_p+=(FABRICOLL_DOMAIN=lo FABRICOLL_INTRA_PROVIDER=same)
  for s in $sizes; do
    env -u FABRICOLL_ALGO "${env_p[@]}" FABRICOLL_TIMEOUT_MS=60000 timeout 120 \
      "$perf" --ranks "$r" --coll "$c" -b "$s" -e "$s" -t 0.3 -w 5 -m 5 -n 1000 -d float -o sum -c 0 2>&1 |
      awk -v l="$label" -v tr="$tr" -v r="$r" -v c="$c" -v rep="$rep" \
        '$1 ~ /^[0-9]+$/ && $1 > 0 && NF >= 7 { print l, tr, r, c, $1, rep, $6 }' >>"$out/rows.txt"
  done
}
for rep in $(seq 1 "$reps"); do
  for tr in $transports; do for r in $ranks; do for c in $colls; do
    if [ $((rep % 2)) -eq 1 ]; then
      run A "$a" "$tr" "$r" "$c" "$rep"; run B "$b" "$tr" "$r" "$c" "$rep"
    else
      run B "$b" "$tr" "$r" "$c" "$rep"; run A "$a" "$tr" "$r" "$c" "$rep"
    fi
  done; done; done
  echo "bench-ab: repetition $rep of $reps done"
done
python3 scripts/benchsum.py ab "$out/rows.txt" | tee "$out/summary.txt"
