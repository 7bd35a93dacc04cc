#!/usr/bin/env bash
# scripts/demo.sh - install, build, and show fabricoll doing its main job: collectives.
#
# After fabricoll-info (devices, providers, configuration), fabricoll-perf runs the collective
# engines between DEMO_RANKS local processes, over the libfabric shm provider, then tcp
# (tcp;ofi_rxm) and, where libfabric has it (1.17), net (its native TCP RDM endpoint) on the
# loopback interface, and prints nccl-tests-style tables (size, count, type, op, the algorithm
# the cost model chose, time, algbw, busbw, #wrong: every element is checked):
#   - allreduce, float sum, DEMO_MIN_BYTES .. DEMO_MAX_BYTES (x2 per row);
#   - a short allgather and reducescatter table (64 B .. DEMO_SHORT_MAX_BYTES, x4 per row).
# Last, shorter section (DEMO_NET=0 skips it): the NCCL net plugin's own point-to-point table
# (plugin-tests/build/net_bench: two processes driving the plugin the way NCCL's proxy does).
#
# Environment (defaults in brackets):
#   DEMO_MIN_BYTES [8], DEMO_MAX_BYTES [64M]   allreduce sizes (K, M, G = powers of 1024)
#   DEMO_SHORT_MAX_BYTES [16M]  largest allgather / reducescatter size
#   DEMO_RANKS [4]           processes per collective run
#   DEMO_ALGO [auto]         fabricoll algorithm (auto: the cost model chooses per size)
#   DEMO_ITERS [10], DEMO_WARMUP [2]   timed and warm-up iterations per size
#   DEMO_TIMEOUT [180]       seconds allowed to each run
#   DEMO_PROVIDERS [shm tcp net] (net only where `fi_info -p net` finds it)
#   DEMO_NET [1]             also the net plugin table (2 processes, 8 B .. DEMO_NET_MAX_BYTES
#                            [4M], DEMO_T [0.2] target seconds per size)
#   DEMO_BUILD [1]           run scripts/deps.sh and scripts/build.sh first (0: use what is built)
#   CARGO_TARGET_DIR [target]
# Bounded: every run is under timeout (docs/performance.md gives the demo's usual duration).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

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

min_b=$(to_bytes "${DEMO_MIN_BYTES:-8}")
max_b=$(to_bytes "${DEMO_MAX_BYTES:-64M}")
short_max=$(to_bytes "${DEMO_SHORT_MAX_BYTES:-16M}")
nranks=${DEMO_RANKS:-4}
algo=${DEMO_ALGO:-auto}
iters=${DEMO_ITERS:-10}
warmup=${DEMO_WARMUP:-2}
run_timeout=${DEMO_TIMEOUT:-180}
demo_net=${DEMO_NET:-1}
net_max=$(to_bytes "${DEMO_NET_MAX_BYTES:-4M}")
t_size=${DEMO_T:-0.2}
target_dir=${CARGO_TARGET_DIR:-target}
rel="$target_dir/release"
lib="$rel/libnccl-net-fabricoll.so"
perf="$rel/fabricoll-perf"
net_bench=plugin-tests/build/net_bench

if [ "${DEMO_BUILD:-1}" != 0 ]; then
  scripts/deps.sh
  scripts/build.sh
fi
# Only now that deps.sh has installed libfabric's fi_info can it say which providers exist.
. scripts/providers.sh
providers=${DEMO_PROVIDERS:-$(with_net "shm tcp")}
need=("$lib" "$rel/fabricoll-info" "$perf")
[ "$demo_net" = 0 ] || need+=("$net_bench")
for f in "${need[@]}"; do
  [ -e "$f" ] || { echo "demo.sh: $f not found: run scripts/build.sh" >&2; exit 1; }
done

echo
echo "==== fabricoll-info: devices, providers, configuration"
timeout 30 "$rel/fabricoll-info"

provider_env() { # provider_env PROV: sets env_p and title
  case "$1" in
    shm) env_p=(FABRICOLL_PROVIDER=shm) title="libfabric shm provider (shared memory)" ;;
    tcp) env_p=(FABRICOLL_PROVIDER=tcp FABRICOLL_DOMAIN=lo FABRICOLL_INTRA_PROVIDER=same) title="libfabric tcp provider (tcp;ofi_rxm) on lo" ;;
    net) env_p=(FABRICOLL_PROVIDER=net FABRICOLL_DOMAIN=lo FABRICOLL_INTRA_PROVIDER=same) title="libfabric net provider (native TCP RDM) on lo" ;;
    *) echo "demo.sh: unknown provider $1 (shm|tcp|net)" >&2; exit 2 ;;
  esac
}

rc_all=0
# run_timed WHAT CMD...: run under DEMO_TIMEOUT, report a timeout or a failure, never stop
run_timed() {
  local what=$1 rc=0
  shift
  timeout --kill-after=10 "$run_timeout" "$@" || rc=$?
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "demo.sh: $what stopped after ${run_timeout}s (DEMO_TIMEOUT)" >&2
  elif [ "$rc" != 0 ]; then
    echo "demo.sh: $what failed (exit $rc)" >&2
  fi
  [ "$rc" = 0 ] || rc_all=1
}

for prov in $providers; do
  provider_env "$prov"
  echo
  echo "==== allreduce, $nranks processes, $title: ${env_p[*]}"
  run_timed "$prov allreduce" env -u FABRICOLL_DOMAIN "${env_p[@]}" "$perf" --ranks "$nranks" \
    --coll allreduce --algo "$algo" -b "$min_b" -e "$max_b" -f 2 -n "$iters" -w "$warmup" -c 1
done
for prov in $providers; do
  provider_env "$prov"
  for coll in allgather reducescatter; do
    echo
    echo "==== $coll, $nranks processes, $title: ${env_p[*]}"
    run_timed "$prov $coll" env -u FABRICOLL_DOMAIN "${env_p[@]}" "$perf" --ranks "$nranks" \
      --coll "$coll" --algo "$algo" -b 64 -e "$short_max" -f 4 -n "$iters" -w "$warmup" -c 1
  done
done
echo
echo "size: nccl-tests' definition (allgather: the gathered output, reducescatter: the input);"
echo "time: each rank's mean per iteration, averaged over ranks; busbw = algbw x 2(n-1)/n (allreduce),"
echo "x (n-1)/n (allgather, reducescatter); #wrong: elements that differ from the reference."

if [ "$demo_net" != 0 ]; then
  for prov in $providers; do
    provider_env "$prov"
    echo
    echo "==== NCCL net plugin, 2 processes, $title: ${env_p[*]}"
    run_timed "$prov net_bench" env -u FABRICOLL_DOMAIN "${env_p[@]}" "$net_bench" --lib "$lib" \
      -b 8 -e "$net_max" -t "$t_size"
  done
  echo
  echo "pp = ping-pong, one message in flight: lat = half the round trip, MB/s = 2*size*iters/elapsed."
  echo "stream = many messages in flight, one direction."
fi
exit "$rc_all"
