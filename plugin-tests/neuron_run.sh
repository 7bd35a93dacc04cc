#!/usr/bin/env bash
# plugin-tests/neuron_run.sh: build neuron_harness (make neuron) and run every scenario against
# the Neuron build of fabricoll (libnccom-net.so), playing libnccom, over FABRICOLL_PROVIDER=tcp
# and net (loopback only: FABRICOLL_DOMAIN=lo) and shm, each with the normal and the
# AddressSanitizer build (1 to 4 ranks per scenario, see neuron_harness --list). Prints
# "neuron-tests: N passed, M failed" (scenarios over all runs) and exits non-zero on any failure.
#
#   FABRICOLL_NEURON_LIB  the library (default: <repo>/target/release/libnccom-net.so)
#   PROVIDERS       providers to run (default: "tcp shm net", net where fi_info finds it); a
#                   provider fi_info does not offer is skipped, or fails under FABRICOLL_TEST_STRICT=1
#   BUILDS          builds to run: "normal asan" (default)
#   ASAN_PROVIDERS  providers the ASan build runs over (default "tcp shm": the harness's code,
#                   which ASan instruments, is the same over every provider)
#   HARNESS_ARGS    extra neuron_harness arguments, e.g. "--scenario xfer6,rma" or "--cycles 100"
#   RUN_TIMEOUT     seconds allowed per harness run (default 1200); each scenario also has its own
#                   deadline inside the harness, this is the outer bound
#   EXPECT_RMA      auto (default): rma_supported (--expect-rma) must be 1 where fi_info lists the
#                   provider with FI_RMA and FI_MR_VIRT_ADDR in its mr_mode, 0 where it lists no
#                   FI_RMA; FI_RMA without FI_MR_VIRT_ADDR is not checked (whether the provider
#                   can address by virtual address is the library's probe to make); 0 or 1: that
#                   value everywhere; any: not checked
# Logs: plugin-tests/build/logs/neuron-<provider>-<build>.log (stderr of the run).
set -u

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
LIB=${FABRICOLL_NEURON_LIB:-$ROOT/target/release/libnccom-net.so}
case "$LIB" in /*) ;; *) LIB="$PWD/$LIB" ;; esac
# shellcheck source=../scripts/providers.sh
. "$ROOT/scripts/providers.sh"
# shellcheck source=harness_lib.sh
. "$HERE/harness_lib.sh"
PROVIDERS=${PROVIDERS:-tcp shm net}
BUILDS=${BUILDS:-"normal asan"}
ASAN_PROVIDERS=${ASAN_PROVIDERS:-"tcp shm"}
RUN_TIMEOUT=${RUN_TIMEOUT:-1200}
STRICT=${FABRICOLL_TEST_STRICT:-0}
EXPECT_RMA=${EXPECT_RMA:-auto}

if ! timeout 300 make -C "$HERE" neuron >/dev/null; then
  echo "neuron-tests: build failed" >&2
  echo "neuron-tests: 0 passed, 1 failed"
  exit 1
fi
if [ ! -f "$LIB" ]; then
  echo "neuron-tests: library not found: $LIB (build it with scripts/build.sh, or set FABRICOLL_NEURON_LIB)" >&2
  echo "neuron-tests: 0 passed, 1 failed"
  exit 1
fi

LOGDIR="$HERE/build/logs"
mkdir -p "$LOGDIR"
total_pass=0
total_fail=0
summary=""

# Whether libfabric offers the provider here (tcp is tcp;ofi_rxm, the others RDM endpoints).
provider_available() { fi_info -p "$(fi_name "$1")" -t FI_EP_RDM >/dev/null 2>&1; }

# fi_info's name of the provider (tcp is tcp;ofi_rxm).
fi_name() { if [ "$1" = tcp ]; then echo 'tcp;ofi_rxm'; else echo "$1"; fi; }

for prov in $PROVIDERS; do
  if ! command -v fi_info >/dev/null 2>&1 || ! provider_available "$prov"; then
    if [ "$STRICT" = 1 ]; then
      echo "FAIL provider $prov: fi_info does not offer it here (FABRICOLL_TEST_STRICT=1)"
      total_fail=$((total_fail + 1))
      summary="$summary  $prov: cannot run (fi_info does not offer it), failed under FABRICOLL_TEST_STRICT=1\n"
    else
      echo "SKIP provider $prov: fi_info does not offer it here"
      summary="$summary  $prov: skipped (fi_info does not offer it)\n"
    fi
    continue
  fi
  rma_args=()
  case "$EXPECT_RMA" in
    any) ;;
    0 | 1) rma_args=(--expect-rma "$EXPECT_RMA") ;;
    *) # auto
      if ! fi_info -p "$(fi_name "$prov")" -t FI_EP_RDM -c FI_RMA >/dev/null 2>&1; then
        rma_args=(--expect-rma 0)
      elif fi_info -p "$(fi_name "$prov")" -t FI_EP_RDM -c FI_RMA -v 2>/dev/null | grep 'mr_mode:' |
        grep -q FI_MR_VIRT_ADDR; then
        rma_args=(--expect-rma 1)
      fi ;;
  esac
  for build in $BUILDS; do
    case "$build" in
      normal) exe="$HERE/build/neuron_harness" ;;
      asan) exe="$HERE/build/neuron_harness_asan" ;;
      *) echo "neuron-tests: unknown build '$build'" >&2; exit 2 ;;
    esac
    if [ "$build" = asan ]; then
      case " $ASAN_PROVIDERS " in *" $prov "*) ;; *) continue ;; esac
    fi
    log="$LOGDIR/neuron-$prov-$build.log"
    echo "== Neuron tables, provider $prov, $build build (${rma_args[*]:-rma_supported not checked}) =="
    envs=(FABRICOLL_PROVIDER="$prov")
    is_ip "$prov" && envs+=(FABRICOLL_DOMAIN=lo) # loopback only: never send traffic off the host
    if [ "$build" = asan ]; then
      # detect_leaks=0: memory owned by the dlopened library and libfabric (uninstrumented,
      # process-lifetime caches) is not the harness's to free; quarantine_size_mb=4: freed memory
      # kept resident would read as RSS growth in the cycles scenario.
      envs+=(ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:print_summary=1:quarantine_size_mb=4")
    fi
    # the kill, badinput and v4block ranks run with FABRICOLL_TIMEOUT_MS=3000 (--kill-timeout-ms)
    # shellcheck disable=SC2086
    out=$(timeout --kill-after=15 "$RUN_TIMEOUT" env -u FABRICOLL_DOMAIN "${envs[@]}" "$exe" --lib "$LIB" \
      --kill-timeout-ms 3000 "${rma_args[@]}" ${HARNESS_ARGS:-} 2>"$log")
    rc=$?
    printf '%s\n' "$out"
    harness_counts neuron_harness "harness-run: $prov/$build" "$out" "$rc" "$log"
    total_pass=$((total_pass + p))
    total_fail=$((total_fail + f))
    checks=$(printf '%s\n' "$out" | sed -nE 's/^neuron_harness: ([0-9]+) checks$/\1/p' | tail -1)
    summary="$summary  $prov/$build: $p passed, $f failed, ${checks:-?} checks (log: $log)\n"
    if declare -F shm_cleanup >/dev/null; then shm_cleanup; fi
  done
done

printf '%b' "$summary"
echo "neuron-tests: $total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
