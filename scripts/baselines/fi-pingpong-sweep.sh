#!/usr/bin/env bash
# scripts/baselines/fi-pingpong-sweep.sh - the raw fabric's ceiling for scripts/bench-p2p.sh:
# libfabric's own fi_pingpong (package libfabric-bin), one server/client pair per size and
# repetition, over a sweep of sizes, printed as one table.
#
#   fi-pingpong-sweep.sh -p PROVIDER -e rdm|msg [-d DOMAIN] [-a SERVER_ADDR] [-b MIN_BYTES]
#                        [-m MAX_BYTES] [-t SECONDS_PER_SIZE] [-P FIRST_PORT] [-r REPS] [-o LOG]
#   e.g. -p 'tcp;ofi_rxm' -e rdm -d lo;  -p net -e rdm -d lo;  -p shm -e rdm
#
# Columns: size, iterations, seconds, one-way latency in us (fi_pingpong's usec/xfer: half a
# round trip; the best of the repetitions), ping-pong MB/s (fi_pingpong's MB/sec, 1e6 B: one
# message in flight, not a streaming bandwidth; the best), the median latency, and how many
# repetitions succeeded. A size whose every run failed prints FAIL. Iterations per size aim at
# SECONDS_PER_SIZE from the previous size's time per iteration (10 to 100000). Every
# fi_pingpong runs under `timeout`; each pair uses a fresh control port (from FIRST_PORT). With
# QUIET=1 (default) each size first waits for an idle machine (wait-quiet.sh, at most QUIET_MAX
# seconds) and is marked "(busy)" when it did not get one. fi_pingpong's output goes to LOG.
set -u
here=$(cd "$(dirname "$0")" && pwd)
prov="" ep="" dom="" addr=127.0.0.1 min=1 max=$((64 << 20)) secs=1 port=20000 reps=1 log=""
while [ $# -gt 0 ]; do
  case "$1" in
    -p) prov=$2 ;; -e) ep=$2 ;; -d) dom=$2 ;; -a) addr=$2 ;; -b) min=$2 ;; -m) max=$2 ;;
    -t) secs=$2 ;; -P) port=$2 ;; -r) reps=$2 ;; -o) log=$2 ;;
    -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "fi-pingpong-sweep.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
[ -n "$prov" ] && [ -n "$ep" ] || { echo "fi-pingpong-sweep.sh: -p and -e are required" >&2; exit 2; }
command -v fi_pingpong >/dev/null || { echo "fi-pingpong-sweep.sh: fi_pingpong not found (libfabric-bin)" >&2; exit 2; }
[ -n "$log" ] || log=$(mktemp -t fi-pingpong.XXXXXX)
: >"$log"
opts=(-p "$prov" -e "$ep")
[ -n "$dom" ] && opts+=(-d "$dom")
per_run_limit=120

# pair SIZE ITERS: one server and one client on $port; prints the client's result row (bytes #sent #ack
# total time MB/sec usec/xfer Mxfers/sec) or nothing. The client retries while the server
# is not yet listening.
pair() {
  local out
  timeout "$per_run_limit" fi_pingpong "${opts[@]}" -B "$port" -S "$1" -I "$2" >>"$log" 2>&1 &
  local server=$!
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    sleep 0.2
    out=$(timeout "$per_run_limit" fi_pingpong "${opts[@]}" -P "$port" -S "$1" -I "$2" "$addr" 2>&1)
    printf '## size %s iters %s port %s\n%s\n' "$1" "$2" "$port" "$out" >>"$log"
    case "$out" in *"failed to connect"* | *"Connection refused"*) continue ;; esac
    break
  done
  kill "$server" 2>/dev/null
  wait "$server" 2>/dev/null
  printf '%s\n' "$out" | awk '$3 ~ /^=/ && $1 ~ /^[0-9]/ { row = $0 } END { if (row != "") print row }'
}

echo "# fi_pingpong sweep: provider $prov, endpoint $ep, domain ${dom:-any}, ${secs}s per size, $reps repetition(s)"
echo "# $(nproc) CPUs, load average at start $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%12s %8s %10s %12s %12s %12s %5s\n' "size(B)" iters "time(s)" "lat(us,1way)" "MB/s(pp)" lat_median reps
per_iter=0 # seconds per iteration at the previous size
size=$min
while [ "$size" -le "$max" ]; do
  if [ "$per_iter" = 0 ]; then iters=1000; else
    iters=$(awk -v s="$secs" -v t="$per_iter" 'BEGIN { n = int(s / (2 * t)); print (n < 10 ? 10 : n > 100000 ? 100000 : n) }')
  fi
  mark=""
  if [ "${QUIET:-1}" != 0 ]; then "$here/wait-quiet.sh" "${QUIET_MAX:-30}" 15 2 2>/dev/null || mark=" (busy)"; fi
  lats=() bws=() total=0
  for _ in $(seq 1 "$reps"); do
    row=$(pair "$size" "$iters")
    port=$((port + 1)) # (pair runs in a subshell)
    [ -n "$row" ] || continue
    set -- $row
    lats+=("$7") bws+=("$6")
    total=$(awk -v a="$total" -v b="${5%s}" 'BEGIN { print a + b }')
  done
  if [ "${#lats[@]}" = 0 ]; then
    printf '%12d %8d %10s %12s %12s\n' "$size" "$iters" FAIL - -
  else
    best=$(printf '%s\n' "${lats[@]}" | sort -g | head -1)
    median=$(printf '%s\n' "${lats[@]}" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
    bw=$(printf '%s\n' "${bws[@]}" | sort -g | tail -1)
    printf '%12d %8d %10.2f %12s %12s %12s %5d%s\n' "$size" "$iters" "$total" "$best" "$bw" "$median" "${#lats[@]}" "$mark"
    # the next size's estimate: twice the bytes, at worst twice the time
    per_iter=$(awk -v l="$median" 'BEGIN { print 2 * 2 * l / 1e6 }')
  fi
  size=$((size * 2))
done
echo "# fi_pingpong output: $log"
