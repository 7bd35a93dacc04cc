#!/usr/bin/env bash
# scripts/demo.sh - install, build, and show fabricoll doing its main job.
#
# Until the collectives exist the main job is the NCCL net plugin: two local processes
# (plugin-tests/build/net_bench) move messages through libnccl-net-fabricoll.so the way NCCL's
# proxy does, over the libfabric shm provider and then tcp on the loopback interface.  Each run
# prints a table: size, ping-pong one-way latency, ping-pong MB/s, streaming MB/s.
#
# Environment (defaults in brackets):
#   DEMO_MIN_BYTES [8], DEMO_MAX_BYTES [64M]   sizes (suffixes K, M, G = powers of 1024)
#   DEMO_T [0.5]             target seconds per size (half ping-pong, half streaming)
#   DEMO_TIMEOUT [150]       seconds allowed to each provider's run
#   DEMO_PROVIDERS [shm tcp]
#   DEMO_BUILD [1]           run scripts/deps.sh and scripts/build.sh first (0: use what is built)
#   CARGO_TARGET_DIR [target]
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
t_size=${DEMO_T:-0.5}
run_timeout=${DEMO_TIMEOUT:-150}
providers=${DEMO_PROVIDERS:-shm tcp}
target_dir=${CARGO_TARGET_DIR:-target}
rel="$target_dir/release"
lib="$rel/libnccl-net-fabricoll.so"
net_bench=plugin-tests/build/net_bench

if [ "${DEMO_BUILD:-1}" != 0 ]; then
  scripts/deps.sh
  scripts/build.sh
fi
for f in "$lib" "$rel/fabricoll-info" "$net_bench"; do
  [ -e "$f" ] || { echo "demo.sh: $f not found: run scripts/build.sh" >&2; exit 1; }
done

echo
echo "==== fabricoll-info: devices, providers, configuration"
timeout 30 "$rel/fabricoll-info"

rc_all=0
for prov in $providers; do
  case "$prov" in
    shm) env_p=(FABRICOLL_PROVIDER=shm) title="libfabric shm provider (shared memory)" ;;
    tcp) env_p=(FABRICOLL_PROVIDER=tcp FABRICOLL_DOMAIN=lo) title="libfabric tcp provider on lo" ;;
    *) echo "demo.sh: unknown provider $prov (shm|tcp)" >&2; exit 2 ;;
  esac
  echo
  echo "==== NCCL net plugin, 2 processes, $title: ${env_p[*]}"
  rc=0
  env "${env_p[@]}" timeout --kill-after=10 "$run_timeout" "$net_bench" --lib "$lib" \
    -b "$min_b" -e "$max_b" -t "$t_size" || rc=$?
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "demo.sh: $prov run stopped after ${run_timeout}s (DEMO_TIMEOUT)" >&2
  elif [ "$rc" != 0 ]; then
    echo "demo.sh: $prov run failed (exit $rc)" >&2
  fi
  [ "$rc" = 0 ] || rc_all=1
done
echo
echo "pp = ping-pong, one message in flight: lat = half the round trip, MB/s = 2*size*iters/elapsed."
echo "stream = many messages in flight, one direction."
exit "$rc_all"
