#!/usr/bin/env bash
# plugin-tests/run.sh: build the C harness and run every scenario against the fabricoll plugin,
# over FABRICOLL_PROVIDER=tcp (loopback only: FABRICOLL_DOMAIN=lo) and shm, each with the normal
# and the AddressSanitizer build. Prints "plugin-tests: N passed, M failed" (scenario counts over
# all four runs) and exits non-zero on any failure.
#
#   FABRICOLL_LIB   the plugin (default: <repo>/target/release/libnccl-net-fabricoll.so)
#   PROVIDERS       providers to run (default: "tcp shm")
#   BUILDS          builds to run: "normal asan" (default)
#   HARNESS_ARGS    extra net_harness arguments, e.g. "--scenario xfer,group" or "--cycles 200"
#   RUN_TIMEOUT     seconds allowed per harness run (default 1800); the harness also has its own
#                   per-scenario deadlines, this is the outer bound
# Logs: plugin-tests/build/logs/<provider>-<build>.log (stderr of the run).
set -u

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
LIB=${FABRICOLL_LIB:-$ROOT/target/release/libnccl-net-fabricoll.so}
case "$LIB" in /*) ;; *) LIB="$PWD/$LIB" ;; esac
PROVIDERS=${PROVIDERS:-"tcp shm"}
BUILDS=${BUILDS:-"normal asan"}
RUN_TIMEOUT=${RUN_TIMEOUT:-1800}

if ! timeout 300 make -C "$HERE" all >/dev/null; then
  echo "plugin-tests: build failed" >&2
  echo "plugin-tests: 0 passed, 1 failed"
  exit 1
fi
if [ ! -f "$LIB" ]; then
  echo "plugin-tests: plugin library not found: $LIB (build it first, or set FABRICOLL_LIB)" >&2
  echo "plugin-tests: 0 passed, 1 failed"
  exit 1
fi

LOGDIR="$HERE/build/logs"
mkdir -p "$LOGDIR"
total_pass=0
total_fail=0
summary=""

for build in $BUILDS; do
  case "$build" in
    normal) exe="$HERE/build/net_harness" ;;
    asan) exe="$HERE/build/net_harness_asan" ;;
    *) echo "plugin-tests: unknown build '$build'" >&2; exit 2 ;;
  esac
  for prov in $PROVIDERS; do
    log="$LOGDIR/$prov-$build.log"
    echo "== provider $prov, $build build ($exe) =="
    envs=(FABRICOLL_PROVIDER="$prov")
    if [ "$prov" = tcp ]; then
      envs+=(FABRICOLL_DOMAIN=lo) # loopback only: never send traffic off the host
    fi
    if [ "$build" = asan ]; then
      # detect_leaks=0: LeakSanitizer would report memory owned by the dlopened plugin and by
      # libfabric (uninstrumented, process-lifetime globals, provider caches) that the harness
      # cannot free; the harness's own errors (overflows, use-after-free) are still detected.
      envs+=(ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:print_summary=1")
    fi
    # The kill and badinput ranks run with FABRICOLL_TIMEOUT_MS=3000 (--kill-timeout-ms), so a dead
    # peer must be reported within 3 s (+5 s slack); the other scenarios use the plugin's default.
    out=$(timeout --kill-after=15 "$RUN_TIMEOUT" env -u FABRICOLL_DOMAIN "${envs[@]}" "$exe" --lib "$LIB" \
      --scenario all --kill-timeout-ms 3000 ${HARNESS_ARGS:-} 2>"$log")
    rc=$?
    printf '%s\n' "$out"
    line=$(printf '%s\n' "$out" | grep -E '^net_harness: [0-9]+ passed, [0-9]+ failed$' | tail -1)
    if [ -n "$line" ]; then
      p=$(echo "$line" | sed -E 's/^net_harness: ([0-9]+) passed, ([0-9]+) failed$/\1/')
      f=$(echo "$line" | sed -E 's/^net_harness: ([0-9]+) passed, ([0-9]+) failed$/\2/')
    else
      # no summary: the harness itself died or was killed by timeout
      echo "FAIL harness-run: $prov/$build exited with $rc without a summary (timeout is $RUN_TIMEOUT s); see $log"
      p=0
      f=1
    fi
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
      echo "FAIL harness-run: $prov/$build exited with $rc although no scenario failed; see $log"
      f=1
    fi
    total_pass=$((total_pass + p))
    total_fail=$((total_fail + f))
    summary="$summary  $prov/$build: $p passed, $f failed (log: $log)\n"
  done
done

printf '%b' "$summary"
echo "plugin-tests: $total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
