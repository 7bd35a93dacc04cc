#!/usr/bin/env bash
# scripts/bench-p2p.sh - point-to-point benchmark: the fabricoll net plugin against raw libfabric
# and against plain TCP streams (the CPU proxy of NCCL's Socket transport).
# A benchmark, not a test: it prints tables and never fails on a number.
#
# For each provider (tcp = libfabric 'tcp;ofi_rxm' RDM on lo, shm = libfabric shm RDM) and each
# of REPS repetitions, it runs, alternating, on an idle machine (wait-quiet.sh before each run):
#   raw     scripts/baselines/fi-pingpong-sweep.sh  (libfabric's fi_pingpong, one size per run)
#   plugin  plugin-tests/build/net_bench --lib $TARGET/release/libnccl-net-fabricoll.so
#           (two local processes driving the plugin the way NCCL's proxy does)
#   streams plugin-tests/build/tcp_streams -k K, for each K of BENCH_STREAMS (tcp and net only):
#           K plain TCP sockets on lo, one thread each, a message split as NCCL's Socket
#           transport splits it (a CPU proxy for NCCL's Socket transport: the plugin's
#           streaming bandwidth against K streams; the table reports plugin / best K and
#           plugin / 1 stream)
# over BENCH_MIN_BYTES..BENCH_MAX_BYTES (powers of two), then prints one table per provider with
# the per-size MEDIANS over the repetitions.
# Neuron part (the Neuron plugin's RMA; BENCH_NEURON): in the same alternation, also
#   rmaraw  plugin-tests/build/rma_raw    (libfabric fi_write / fi_read directly; providers
#           whose RDM endpoint offers FI_RMA only, as `rma_raw --probe` says; writes complete
#           on delivery on tcp and net, as the plugin's iwrite does: rma_raw -c auto)
#   neuron  plugin-tests/build/neuron_bench --lib $FABRICOLL_NEURON_LIB  (the Neuron build's
#           ncclNetPlugin_v6: isend/irecv, iwrite, iread, iwriteInline)
# and after the NCCL tables one Neuron table per provider (scripts/benchsum_neuron.py): send/recv
# against fi_pingpong, RMA against rma_raw, with the targets (>= 0.9x raw from 1 MiB,
# 8 B within 1.2x raw). Even repetitions run the kinds in reverse order.
#
# Environment (defaults in brackets):
#   REPS [5]                 repetitions; raw and plugin alternate inside each one
#   BENCH_RAW [1]            0: no fi_pingpong runs (plugin against TCP streams only)
#   BENCH_STREAMS [1 2 4]    socket counts of the tcp_streams baseline on tcp and net; empty: none
#   BENCH_NET_STREAMS []     FABRICOLL_NET_STREAMS values to run the plugin with on tcp and net,
#                            each as one more kind in the alternation (plugsN in the streams
#                            table); empty: the plugin's default only
#   BENCH_PROVIDERS [tcp shm]  (net: libfabric 1.17's native TCP RDM endpoint, on request)
#   BENCH_MIN_BYTES [8], BENCH_MAX_BYTES [64M]   sizes (suffixes K, M, G = powers of 1024)
#   BENCH_T [0.5]            target seconds per size for each run
#   QUIET [1]                wait for an idle machine (wait-quiet.sh) before every run;
#                            QUIET_MAX [60] bounds each wait, in seconds; 0 disables
#   BENCH_PORT [20000]       first control port; ports used stay below 32768
#   BENCH_RUN_TIMEOUT [300]  seconds allowed to each sweep / net_bench run
#   BENCH_DEADLINE [2400]    no new repetition starts after this many seconds
# The longest possible run is BENCH_DEADLINE + one repetition with every run at
# BENCH_RUN_TIMEOUT (docs/performance.md gives the usual duration).
#   BENCH_BUILD [1]          run scripts/deps.sh and scripts/build.sh first (0: use what is built)
#   BENCH_NEURON [auto]      auto: the Neuron part when the Neuron library exists; 1: required;
#                            only: the Neuron part and its fi_pingpong baseline, no net_bench; 0: off
#   FABRICOLL_NEURON_LIB [$CARGO_TARGET_DIR/release/libnccom-net.so]   the Neuron library
#   BASELINES [scripts/baselines]   where fi-pingpong-sweep.sh and wait-quiet.sh live
#   CARGO_TARGET_DIR [target]
# Raw logs go to .bench/p2p-<date>/ (gitignored); the tables also go to summary.txt there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)

if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi

# to_bytes 64M -> 67108864 (K/M/G are powers of 1024; a trailing B or iB is ignored)
to_bytes() {
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
providers=${BENCH_PROVIDERS:-tcp shm}
min_b=$(to_bytes "${BENCH_MIN_BYTES:-8}")
max_b=$(to_bytes "${BENCH_MAX_BYTES:-64M}")
t_size=${BENCH_T:-0.5}
quiet=${QUIET:-1}
quiet_max=${QUIET_MAX:-60}
port0=${BENCH_PORT:-20000}
run_timeout=${BENCH_RUN_TIMEOUT:-300}
deadline=${BENCH_DEADLINE:-2400}
baselines=${BASELINES:-$root/scripts/baselines}
target_dir=${CARGO_TARGET_DIR:-target}
lib="$target_dir/release/libnccl-net-fabricoll.so"
net_bench=plugin-tests/build/net_bench
tcp_streams=plugin-tests/build/tcp_streams
streams=${BENCH_STREAMS-1 2 4}
bench_raw=${BENCH_RAW:-1}
net_streams=${BENCH_NET_STREAMS:-}
for k in $net_streams; do
  case "$k" in
    [1-9] | 1[0-6]) ;;
    *) echo "bench-p2p.sh: BENCH_NET_STREAMS=\"$net_streams\": $k is not a stream count 1..16" >&2; exit 1 ;;
  esac
done
for k in $streams; do
  case "$k" in
    [1-9] | 1[0-6]) ;;
    *) echo "bench-p2p.sh: BENCH_STREAMS=\"$streams\": $k is not a socket count 1..16" >&2; exit 1 ;;
  esac
done
neuron_mode=${BENCH_NEURON:-auto}
neuron_lib=${FABRICOLL_NEURON_LIB:-$target_dir/release/libnccom-net.so}
rma_raw=plugin-tests/build/rma_raw
neuron_bench=plugin-tests/build/neuron_bench
case "$neuron_mode" in
  auto | 0 | 1 | only) ;;
  *) echo "bench-p2p.sh: BENCH_NEURON=$neuron_mode: expected auto, 0, 1 or only" >&2; exit 1 ;;
esac

sweep="$baselines/fi-pingpong-sweep.sh"
wait_quiet="$baselines/wait-quiet.sh"
for f in "$wait_quiet" $([ "$bench_raw" = 0 ] || echo "$sweep"); do
  [ -x "$f" ] || { echo "bench-p2p.sh: $f not found (set BASELINES=dir)" >&2; exit 1; }
done
[ "$bench_raw" = 0 ] || command -v fi_pingpong >/dev/null 2>&1 ||
  { echo "bench-p2p.sh: fi_pingpong not found (apt-get install libfabric-bin)" >&2; exit 1; }
# every (repetition, provider) gets a block of 100 control ports
nprov=$(wc -w <<<"$providers")
if [ $((port0 + reps * nprov * 100)) -ge 32768 ]; then
  echo "bench-p2p.sh: BENCH_PORT=$port0 with REPS=$reps would reach port 32768; lower them" >&2
  exit 1
fi

if [ "${BENCH_BUILD:-1}" != 0 ]; then
  scripts/deps.sh
  scripts/build.sh
fi
have_plugin=1
if [ "$neuron_mode" = only ]; then
  have_plugin=0
elif [ ! -x "$net_bench" ] || [ ! -f "$lib" ]; then
  echo "bench-p2p.sh: WARNING: $net_bench or $lib missing: raw libfabric only" >&2
  have_plugin=0
fi
if [ -n "$streams" ] && ! make -s -C plugin-tests tcpstreams >/dev/null; then
  echo "bench-p2p.sh: 'make -C plugin-tests tcpstreams' failed: no TCP streams baseline" >&2
  streams=""
fi
have_neuron=0
if [ "$neuron_mode" != 0 ]; then
  if [ -f "$neuron_lib" ] && make -s -C plugin-tests nbench >/dev/null; then
    have_neuron=1
  elif [ "$neuron_mode" != auto ]; then
    echo "bench-p2p.sh: BENCH_NEURON=$neuron_mode but $neuron_lib is missing or" \
      "'make -C plugin-tests nbench' failed (set FABRICOLL_NEURON_LIB)" >&2
    exit 1
  fi
fi

out=".bench/p2p-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
echo "# bench-p2p: $(nproc) cpus, REPS=$reps, sizes $min_b..$max_b B, ${t_size}s/size, logs in $out/"
echo "# $(fi_info --version 2>/dev/null | head -1 || true); git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
[ "$have_neuron" = 1 ] && echo "# Neuron part: $neuron_lib"

quiet_gate() { # quiet_gate WHAT: wait (bounded) for an idle machine; fails if it never was
  [ "$quiet" != 0 ] || return 0
  local rc=0
  "$wait_quiet" "$quiet_max" 15 3 2> "$out/wait-quiet.tmp" || rc=$?
  sed "s/^/#   [$1] /" "$out/wait-quiet.tmp"
  rm -f "$out/wait-quiet.tmp"
  return "$rc"
}

run_raw() { # run_raw PROV REP PORT
  local prov=$1 rep=$2 port=$3 args
  case "$prov" in
    tcp) args=(-p 'tcp;ofi_rxm' -e rdm -d lo) ;;
    net) args=(-p net -e rdm -d lo) ;;
    shm) args=(-p shm -e rdm) ;;
    *) echo "bench-p2p.sh: unknown provider $prov (tcp|net|shm)" >&2; return 1 ;;
  esac
  # QUIET=0 inside: the gate runs once per run here, for raw and plugin alike
  QUIET=0 timeout --kill-after=10 "$run_timeout" "$sweep" "${args[@]}" -b "$min_b" -m "$max_b" \
    -t "$t_size" -P "$port" -r 1 -o "$out/$prov-raw-$rep.log" > "$out/$prov-raw-$rep.txt" 2>&1
}

run_streams() { # run_streams PROV REP K
  timeout --kill-after=10 "$run_timeout" "$tcp_streams" -k "$3" -b "$min_b" -e "$max_b" \
    -t "$(awk -v t="$t_size" 'BEGIN { print 2 * t }')" > "$out/$1-streams$3-$2.txt" 2>&1
}

run_plugin() { # run_plugin PROV REP [STREAMS]  (net_bench needs no port: its ranks meet in shared memory)
  local prov=$1 rep=$2 env_p name=plugin
  case "$prov" in
    tcp | net) env_p=(FABRICOLL_PROVIDER="$prov" FABRICOLL_DOMAIN=lo) ;;
    shm) env_p=(FABRICOLL_PROVIDER=shm) ;;
  esac
  if [ -n "${3:-}" ]; then
    env_p+=(FABRICOLL_NET_STREAMS="$3")
    name=plugins$3
  fi
  # net_bench -t is split between its ping-pong and streaming phases
  env "${env_p[@]}" timeout --kill-after=10 "$run_timeout" "$net_bench" --lib "$lib" \
    -b "$min_b" -e "$max_b" -t "$(awk -v t="$t_size" 'BEGIN { print 2 * t }')" \
    > "$out/$prov-$name-$rep.txt" 2>&1
}

# The Neuron part's runs: same sizes; -t doubled as for net_bench, since send splits it between
# ping-pong and streaming and each RMA op gets the whole of it, split between latency and
# bandwidth (bench_core.h).
neuron_env() { # neuron_env PROV -> the plugin's provider variables
  case "$1" in
    tcp | net) echo "FABRICOLL_PROVIDER=$1 FABRICOLL_DOMAIN=lo" ;;
    *) echo "FABRICOLL_PROVIDER=$1" ;;
  esac
}

run_rmaraw() { # run_rmaraw PROV REP
  timeout --kill-after=10 "$run_timeout" "$rma_raw" -p "$1" -b "$min_b" -e "$max_b" \
    -t "$(awk -v t="$t_size" 'BEGIN { print 2 * t }')" > "$out/$1-rmaraw-$2.txt" 2>&1
}

run_neuron() { # run_neuron PROV REP
  # shellcheck disable=SC2046 # neuron_env prints NAME=VALUE words for env
  env $(neuron_env "$1") timeout --kill-after=10 "$run_timeout" "$neuron_bench" --lib "$neuron_lib" \
    -b "$min_b" -e "$max_b" -t "$(awk -v t="$t_size" 'BEGIN { print 2 * t }')" > "$out/$1-neuron-$2.txt" 2>&1
}

# Neuron samples, one file per provider (<prov>.nsamples): "SIZE WHO_OP_KIND VALUE"
# (scripts/benchsum_neuron.py): fi_pingpong's as fp_send_lat (us) and fp_send_pp (GB/s);
# rma_raw / neuron_bench rows "SIZE OP LAT_US GBPS" as rr_/nb_ OP_lat and OP_bw, plus nb_send_pp
# = size / one-way latency, the ping-pong bandwidth fi_pingpong reports.
collect_neuron_raw() { # collect_neuron_raw SAMPLES_OF_ONE_RUN -> fp samples
  awk '$2 == "raw_lat" { print $1, "fp_send_lat", $3 } $2 == "raw_pp" { print $1, "fp_send_pp", $3 / 1000 }' "$1"
}
collect_bench() { # collect_bench WHO FILE -> samples
  awk -v who="$1" '/^ *[0-9]+ +[a-z]+ / && NF >= 4 && $3 + 0 > 0 {
         print $1, who "_" $2 "_lat", $3; print $1, who "_" $2 "_bw", $4
         if (who == "nb" && $2 == "send") print $1, "nb_send_pp", $1 / $3 / 1000 }' "$2"
}

# Long-format samples, one file per provider: "SIZE METRIC VALUE"
#   raw_lat   fi_pingpong usec/xfer, one-way = elapsed_us / (2*iters)
#   raw_pp    fi_pingpong MB/sec = 2*size*iters / elapsed_us  (= size / one-way latency)
#   plug_lat  net_bench pp_lat_us = elapsed_us / (2*iters)  (plugin-tests/net_bench.c)
#   plug_pp   net_bench pp_MBps = size / pp_lat_us = 2*size*iters / elapsed_us: the same
#             definition as fi_pingpong's, so no conversion is needed
#   plug_st   net_bench stream_MBps = size*n / elapsed_us, WINDOW messages in flight
# Both print MB/s with 1-2 decimals, too coarse at small sizes (0.01 MB/s at 8 B), so below
# 100 MB/s the ping-pong figure is recomputed as size / one-way latency, which is the same
# quantity with more significant digits.
collect_raw() { # collect_raw FILE -> samples
  awk '/^ *[0-9]+ / && $3 != "FAIL" && $4 + 0 > 0 {
         print $1, "raw_lat", $4; print $1, "raw_pp", ($5 >= 100 ? $5 : $1 / $4) }' "$1"
}
collect_streams() { # collect_streams K FILE -> samples tcpK_lat, tcpK_pp, tcpK_st
  awk -v k="$1" '/^ *[0-9]+ / && NF >= 4 && $2 + 0 > 0 {
         print $1, "tcp" k "_lat", $2; print $1, "tcp" k "_pp", $3; print $1, "tcp" k "_st", $4 }' "$2"
}
collect_plugin() { # collect_plugin FILE -> samples
  awk '/^ *[0-9]+ / && NF >= 4 && $2 ~ /^[0-9.]+$/ && $2 + 0 > 0 {
         print $1, "plug_lat", $2; print $1, "plug_pp", ($3 >= 100 ? $3 : $1 / $2)
         print $1, "plug_st", $4 }' "$1"
}

t0=$(date +%s)
done_reps=0
for rep in $(seq 1 "$reps"); do
  if [ $(($(date +%s) - t0)) -ge "$deadline" ]; then
    echo "# BENCH_DEADLINE=${deadline}s reached: stopping after $done_reps repetition(s)"
    break
  fi
  pi=0
  for prov in $providers; do
    port=$((port0 + ((rep - 1) * nprov + pi) * 100))
    pi=$((pi + 1))
    kinds="plugin"
    [ "$bench_raw" = 0 ] || kinds="raw $kinds"
    case "$prov" in
      tcp | net)
        for k in $net_streams; do kinds="$kinds plugins$k"; done
        for k in $streams; do kinds="$kinds streams$k"; done
        ;;
    esac
    if [ "$have_neuron" = 1 ]; then
      if "$rma_raw" -p "$prov" --probe > "$out/$prov-probe.txt" 2>&1; then kinds="$kinds rmaraw"; fi
      kinds="$kinds neuron"
    fi
    # alternate which one goes first, so neither always runs right after the other
    if [ $((rep % 2)) = 0 ]; then kinds=$(tr ' ' '\n' <<<"$kinds" | tac | tr '\n' ' '); fi
    for kind in $kinds; do
      case "$kind" in plugin*) [ "$have_plugin" = 0 ] && continue ;; esac
      quiet_gate "$prov $kind $rep" || echo "$kind $rep" >> "$out/$prov.busy"
      ts=$(date +%s)
      rc=0
      case "$kind" in
        raw)
          run_raw "$prov" "$rep" "$port" || rc=$?
          collect_raw "$out/$prov-raw-$rep.txt" > "$out/$prov-raw-$rep.samples"
          cat "$out/$prov-raw-$rep.samples" >> "$out/$prov.samples"
          collect_neuron_raw "$out/$prov-raw-$rep.samples" >> "$out/$prov.nsamples"
          ;;
        streams*)
          run_streams "$prov" "$rep" "${kind#streams}" || rc=$?
          collect_streams "${kind#streams}" "$out/$prov-$kind-$rep.txt" >> "$out/$prov.samples"
          ;;
        plugins*)
          run_plugin "$prov" "$rep" "${kind#plugins}" || rc=$?
          collect_plugin "$out/$prov-$kind-$rep.txt" | sed "s/ plug_/ plugs${kind#plugins}_/" >> "$out/$prov.samples"
          ;;
        plugin)
          run_plugin "$prov" "$rep" || rc=$?
          collect_plugin "$out/$prov-plugin-$rep.txt" >> "$out/$prov.samples"
          ;;
        rmaraw)
          run_rmaraw "$prov" "$rep" || rc=$?
          collect_bench rr "$out/$prov-rmaraw-$rep.txt" >> "$out/$prov.nsamples"
          ;;
        neuron)
          run_neuron "$prov" "$rep" || rc=$?
          collect_bench nb "$out/$prov-neuron-$rep.txt" >> "$out/$prov.nsamples"
          ;;
      esac
      echo "# rep $rep/$reps $prov $kind: $(($(date +%s) - ts)) s, exit $rc"
      if [ "$rc" != 0 ]; then
        tail -5 "$out/$prov-$kind-$rep.txt" | sed 's/^/#     /'
      fi
    done
  done
  done_reps=$rep
done

summarize() { # summarize PROV : the table of medians
  local prov=$1
  echo
  echo "## $prov: medians over $done_reps repetition(s); raw = fi_pingpong ($(
    case "$prov" in tcp) echo "-p 'tcp;ofi_rxm' -e rdm -d lo" ;; net) echo "-p net -e rdm -d lo" ;;
      *) echo "-p shm -e rdm" ;; esac)), plugin = net_bench"
  echo "## lat = one-way latency (half a round trip); pp MB/s = 2*size*iters/elapsed (fi_pingpong's"
  echo "## definition, MB = 1e6 B, one message in flight); stream = plugin with many messages in flight."
  echo "## pp_x = plugin pp / raw pp (like for like); st_x = plugin stream / raw pp; lat_x = plugin / raw"
  echo "## streams table (tcp, net): tcpK = tcp_streams -k K stream MB/s; x_best = plugin stream / best K,"
  echo "## x_1 = plugin stream / 1 stream (NCCL's Socket transport's proxy)"
  if [ -s "$out/$prov.busy" ]; then
    echo "## WARNING: $(wc -l < "$out/$prov.busy") run(s) started on a busy machine (wait-quiet gave up):" \
      "$(tr '\n' ' ' < "$out/$prov.busy")"
  fi
  [ -s "$out/$prov.samples" ] || { echo "## (no samples)"; return 0; }
  python3 scripts/benchsum.py p2p "$out/$prov.samples"
}

summarize_neuron() { # summarize_neuron PROV : the Neuron table of medians
  local prov=$1
  echo
  echo "## $prov, Neuron: medians over $done_reps repetition(s); send = neuron_bench isend/irecv against"
  echo "## fi_pingpong (as above), write/read = iwrite/iread against rma_raw's fi_write/fi_read, inline ="
  echo "## iwriteInline against fi_write. lat: one-way (send) or one op in flight (RMA); bw: ping-pong (send),"
  echo "## streaming (send_st, against fi_pingpong's ping-pong), WINDOW ops in flight (RMA); GB = 1e9 B."
  echo "## lat_x = neuron / raw, bw_x = neuron / raw"
  # (|| true: a provider may lack either file, and the caller runs under errexit and pipefail)
  sed 's/^# /## /' "$out/$prov-probe.txt" 2>/dev/null | head -4 || true
  grep -h '^# \(neuron_bench\|speed\|rma_supported\)' "$out/$prov"-neuron-*.txt 2>/dev/null | sort -u |
    sed 's/^# /## /' || true
  if [ -s "$out/$prov.busy" ]; then
    echo "## WARNING: run(s) started on a busy machine: $(tr '\n' ' ' < "$out/$prov.busy")"
  fi
  python3 scripts/benchsum_neuron.py "$out/$prov.nsamples"
}

{
  for prov in $providers; do summarize "$prov"; done
  if [ "$have_neuron" = 1 ]; then
    for prov in $providers; do summarize_neuron "$prov"; done
  fi
  echo
  echo "# total $(($(date +%s) - t0)) s; raw logs: $out/"
} | tee "$out/summary.txt"
