#!/usr/bin/env bash
# plugin-tests/tuner_run.sh: build tuner_harness (make tuner) and play NCCL's tuner loader
# against the library's ncclTunerPlugin_v2..v6: the normal and the AddressSanitizer build with
# the tuner on (FABRICOLL_TUNER unset, the engines' model over tcp on loopback, and over shm),
# and the normal build under FABRICOLL_TUNER=0 (--off: every cell and chunk stays NCCL's).
# Prints "tuner-tests: N passed, M failed" (checks over all runs) and exits non-zero on any
# failure.
#
#   FABRICOLL_LIB   the library (default: <repo>/target/release/libnccl-net-fabricoll.so)
#   BUILDS          builds to run with the tuner on: "normal asan" (default)
#   RUN_TIMEOUT     seconds allowed per harness run (default 300)
# Logs: plugin-tests/build/logs/tuner-<run>.log (the run's output).
set -u

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
LIB=${FABRICOLL_LIB:-$ROOT/target/release/libnccl-net-fabricoll.so}
case "$LIB" in /*) ;; *) LIB="$PWD/$LIB" ;; esac
BUILDS=${BUILDS:-"normal asan"}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
ASAN="detect_leaks=0:abort_on_error=0:print_summary=1:quarantine_size_mb=4"

if ! timeout 300 make -C "$HERE" tuner >/dev/null; then
  echo "tuner-tests: build failed" >&2
  echo "tuner-tests: 0 passed, 1 failed"
  exit 1
fi
if [ ! -f "$LIB" ]; then
  echo "tuner-tests: $LIB not found: build the library first (scripts/build.sh)" >&2
  echo "tuner-tests: 0 passed, 1 failed"
  exit 1
fi
logs="$HERE/build/logs"
mkdir -p "$logs"
passed=0
failed=0

# run NAME EXE [ARGS...]: one harness run, in the environment of RUN_ENV (VAR=value words).
run() {
  local name=$1 exe=$2 log="$logs/tuner-$1.log"
  shift 2
  env -u FABRICOLL_TUNER "${RUN_ENV[@]}" timeout "$RUN_TIMEOUT" "$exe" --lib "$LIB" "$@" \
    >"$log" 2>&1
  local rc=$?
  local line p f
  line=$(grep -E '^tuner-harness: [0-9]+ passed, [0-9]+ failed' "$log" | tail -1)
  if [ -z "$line" ]; then
    echo "tuner-tests: $name: no result (exit $rc); see $log" >&2
    failed=$((failed + 1))
    return
  fi
  p=$(echo "$line" | sed -E 's/^tuner-harness: ([0-9]+) passed.*/\1/')
  f=$(echo "$line" | sed -E 's/^tuner-harness: [0-9]+ passed, ([0-9]+) failed.*/\1/')
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    f=1 # a crash or a sanitizer report after the summary line
  fi
  passed=$((passed + p))
  failed=$((failed + f))
  echo "tuner-tests: $name: $p passed, $f failed ($log)" >&2
  if [ "$f" -ne 0 ]; then grep -E '^FAIL|ERROR: AddressSanitizer' "$log" | head -10 >&2; fi
}

for build in $BUILDS; do
  case "$build" in
    normal) exe="$HERE/build/tuner_harness"; asan=() ;;
    asan) exe="$HERE/build/tuner_harness_asan"; asan=(ASAN_OPTIONS="$ASAN") ;;
    *) echo "tuner-tests: unknown build $build" >&2; failed=$((failed + 1)); continue ;;
  esac
  # The model's eager limit comes from the transport: ofi_rxm's over tcp, none over shm.
  RUN_ENV=("${asan[@]}" FABRICOLL_PROVIDER=tcp FABRICOLL_DOMAIN=lo)
  run "tcp-$build" "$exe"
  RUN_ENV=("${asan[@]}" FABRICOLL_PROVIDER=shm)
  run "shm-$build" "$exe"
done
# FABRICOLL_TUNER=0: everything stays as NCCL gave it.
RUN_ENV=(FABRICOLL_TUNER=0 FABRICOLL_PROVIDER=tcp FABRICOLL_DOMAIN=lo)
run off "$HERE/build/tuner_harness" --off

echo "tuner-tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
