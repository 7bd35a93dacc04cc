#!/usr/bin/env bash
# plugin-tests/run.sh: build the C harness and run every scenario against the fabricoll plugin,
# over FABRICOLL_PROVIDER=tcp and net (loopback only: FABRICOLL_DOMAIN=lo) and shm, each with the normal
# and the AddressSanitizer build; then the CollNet harness (collnet_harness) the same way; then
# the C API examples (capi_example, its ASan build, and the
# C++ capi_example_cpp), which link the library and fork CAPI_RANKS ranks, over the same
# providers. Prints "plugin-tests: N passed, M failed, K skipped" (scenario and check counts over
# all runs; a provider left out, with its reason, counts as one skipped)
# and exits non-zero on any failure.
#
#   FABRICOLL_LIB   the plugin (default: <repo>/target/release/libnccl-net-fabricoll.so)
#   PROVIDERS       providers to run (default: "tcp shm net", net where fi_info finds it)
#   BUILDS          builds to run: "normal asan" (default)
#   ASAN_PROVIDERS  providers the ASan build runs over (default "tcp shm"): ASan instruments the
#                   harness, whose code is the same over every provider, and net is TCP as tcp
#                   is; the normal build runs every provider (CollNet's ASan-only rank counts
#                   included where ASan does not run)
#   HARNESS_ARGS    extra net_harness arguments, e.g. "--scenario xfer,group" or "--cycles 200"
#   STRIPE_STREAMS  FABRICOLL_NET_STREAMS of one more pass of the data scenarios over tcp and net
#                   (default 4; 0 skips it)
#   RUN_TIMEOUT     seconds allowed per harness run (default 1800); the harness also has its own
#                   per-scenario deadlines, this is the outer bound
#   CAPI            1 (default): also run the C API examples; 0: only the net harness
#   COLLNET         1 (default): also run collnet_harness (the ncclCollNetPlugin_v6..v12 tables:
#                   every scenario for 2 to 5 ranks, kill with 4; see COLLNET_RANKS);
#                   0: skip it
#   COLLNET_ARGS    extra collnet_harness arguments, e.g. "--scenario allreduce --ranks 3"
#   COLLNET_RANKS   rank counts of the normal CollNet runs (default "2,3,4"; 5 ranks run in the
#                   ASan build, and in the normal one over providers ASan leaves out)
#   COLLNET_ASAN_RANKS  rank counts of the ASan CollNet runs (default "2,5"; kill always runs
#                   with 4)
#   CAPI_RANKS      ranks of each C API example run (default 4)
#   CAPI_TIMEOUT    seconds the example's parent waits for its ranks before killing them (180)
#   NCCL_TORCH      1 (default): run nccl_torch.py (PyTorch's NCCL loads the plugin; two ranks on
#                   GPU 0 with their own NCCL_HOSTID, so all NCCL traffic crosses the plugin; under
#                   a private CUDA MPS daemon where nvidia-cuda-mps-control is on PATH); it
#                   prints SKIP and counts nothing without PyTorch or a CUDA device; 0: skip it
# Logs: plugin-tests/build/logs/<provider>-<build>.log (stderr of the run),
#       plugin-tests/build/logs/collnet-<provider>-<build>.log (stderr of the CollNet run), and
#       plugin-tests/build/logs/capi-<program>-<provider>.log (full output of an example run).
set -u

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
LIB=${FABRICOLL_LIB:-$ROOT/target/release/libnccl-net-fabricoll.so}
case "$LIB" in /*) ;; *) LIB="$PWD/$LIB" ;; esac
# shellcheck source=../scripts/providers.sh
. "$ROOT/scripts/providers.sh"
# shellcheck source=harness_lib.sh
. "$HERE/harness_lib.sh"
# net where libfabric offers it; where it does not, a counted skip with the reason (or, where this
# libfabric should have it and FABRICOLL_TEST_STRICT=1, net stays and its runs fail)
net_skip=""
if [ -z "${PROVIDERS:-}" ]; then
  PROVIDERS=$(with_net "tcp shm")
  case " $PROVIDERS " in *" net "*) ;; *) net_skip=$(net_absent) ;; esac
fi
BUILDS=${BUILDS:-"normal asan"}
ASAN_PROVIDERS=${ASAN_PROVIDERS:-"tcp shm"}
RUN_TIMEOUT=${RUN_TIMEOUT:-1800}
# skip_build BUILD PROV: true where BUILD does not run over PROV (ASan beyond ASAN_PROVIDERS)
skip_build() {
  [ "$1" = asan ] && case " $ASAN_PROVIDERS " in *" $2 "*) false ;; *) true ;; esac
}
CAPI=${CAPI:-1}
COLLNET=${COLLNET:-1}
CAPI_RANKS=${CAPI_RANKS:-4}
CAPI_TIMEOUT=${CAPI_TIMEOUT:-180}
NCCL_TORCH=${NCCL_TORCH:-1}

# The library's directory, for the C API examples (they link it, with an rpath).
export FABRICOLL_LIBDIR
FABRICOLL_LIBDIR=$(cd "$(dirname "$LIB")" 2>/dev/null && pwd || dirname "$LIB")
make_targets=(all)
[ "$CAPI" = 1 ] && make_targets+=(capi)
if ! timeout 300 make -C "$HERE" "${make_targets[@]}" >/dev/null; then
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
total_skip=0
summary=""
if [ -n "$net_skip" ]; then
  total_skip=1
  summary="  net: skipped ($net_skip)\n"
fi

# net_run LABEL LOG EXE [VAR=VALUE...] -- [ARGS...]: one net_harness run, counted and summarised.
# --expect-multi 128: fabricoll's maxMultiRequestSize (a receive comm's requests in flight).
# The kill and badinput ranks run with FABRICOLL_TIMEOUT_MS=3000 (--kill-timeout-ms), so a dead
# peer must be reported within 3 s (+5 s slack); the other scenarios use the plugin's default.
net_run() {
  local label=$1 log=$2 exe=$3 envs=() out rc
  shift 3
  while [ "$#" -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  out=$(timeout --kill-after=15 "$RUN_TIMEOUT" env -u FABRICOLL_DOMAIN "${envs[@]}" "$exe" --lib "$LIB" \
    --kill-timeout-ms 3000 --expect-multi 128 "$@" 2>"$log")
  rc=$?
  printf '%s\n' "$out"
  harness_counts net_harness "harness-run: $label" "$out" "$rc" "$log"
  total_pass=$((total_pass + p))
  total_fail=$((total_fail + f))
  summary="$summary  $label: $p passed, $f failed (log: $log)\n"
}

for build in $BUILDS; do
  case "$build" in
    normal) exe="$HERE/build/net_harness" ;;
    asan) exe="$HERE/build/net_harness_asan" ;;
    *) echo "plugin-tests: unknown build '$build'" >&2; exit 2 ;;
  esac
  for prov in $PROVIDERS; do
    skip_build "$build" "$prov" && continue
    log="$LOGDIR/$prov-$build.log"
    echo "== provider $prov, $build build ($exe) =="
    envs=(FABRICOLL_PROVIDER="$prov")
    if is_ip "$prov"; then
      envs+=(FABRICOLL_DOMAIN=lo) # loopback only: never send traffic off the host
    fi
    if [ "$build" = asan ]; then
      # detect_leaks=0: LeakSanitizer would report memory owned by the dlopened plugin and by
      # libfabric (uninstrumented, process-lifetime globals, provider caches) that the harness
      # cannot free; the harness's own errors (overflows, use-after-free) are still detected.
      # quarantine_size_mb=4: ASan keeps freed memory resident (256 MiB by default), which the
      # cycles scenario's RSS-growth check would read as a leak.
      envs+=(ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:print_summary=1:quarantine_size_mb=4")
    fi
    scen=all
    if [ "$prov" = shm ] && [ "${SHM_KILL:-1}" != 1 ]; then
      # libfabric 1.17's shm: a rank SIGKILLed while holding a lock in its shared region leaves
      # the survivor spinning inside the provider (fi_cq_read), out of reach of any deadline
      # (README, known limitations). Between fastbox peers no message takes the provider's
      # region any more, so the kill scenario runs over shm too; SHM_KILL=0 leaves it out.
      scen=symbols,connect2,connect1,xfer,group,multi,inflight32,pairs16,ring4,badinput,cycles,versions,reload
      echo "SKIP kill on shm (SHM_KILL=0)"
    fi
    # shellcheck disable=SC2086 # HARNESS_ARGS is a word list
    net_run "$prov/$build" "$log" "$exe" "${envs[@]}" -- --scenario "$scen" ${HARNESS_ARGS:-}
  done
done

# ---- the net harness with striped comms (FABRICOLL_NET_STREAMS) across processes -----------
# The data scenarios once more over the IP providers, normal build, with several endpoints per
# device: messages from 256 KiB are cut over them (tests/net_stripe.rs covers one process).
if [ "${STRIPE_STREAMS:-4}" != 0 ]; then
  for prov in $PROVIDERS; do
    is_ip "$prov" || continue
    log="$LOGDIR/$prov-stripes.log"
    echo "== provider $prov, FABRICOLL_NET_STREAMS=${STRIPE_STREAMS:-4} (normal build) =="
    net_run "$prov/stripes" "$log" "$HERE/build/net_harness" FABRICOLL_PROVIDER="$prov" \
      FABRICOLL_DOMAIN=lo FABRICOLL_NET_STREAMS="${STRIPE_STREAMS:-4}" -- \
      --scenario xfer,group,multi,inflight32,pairs16,crossed,ring4,kill
  done
fi

# ---- CollNet harness ------------------------------------------------------------------------
if [ "$COLLNET" = 1 ]; then
  for build in $BUILDS; do
    case "$build" in
      normal) exe="$HERE/build/collnet_harness" ;;
      asan) exe="$HERE/build/collnet_harness_asan" ;;
    esac
    for prov in $PROVIDERS; do
      skip_build "$build" "$prov" && continue
      log="$LOGDIR/collnet-$prov-$build.log"
      echo "== CollNet harness, provider $prov, $build build ($exe) =="
      envs=(FABRICOLL_PROVIDER="$prov")
      is_ip "$prov" && envs+=(FABRICOLL_DOMAIN=lo)
      # Every rank count runs on every provider across the two builds, each only once (the
      # normal build takes the ASan build's 5 ranks where ASan does not run).
      cn_ranks=(--ranks "${COLLNET_RANKS:-2,3,4}")
      if [[ " $BUILDS " == *" asan "* ]] && skip_build asan "$prov"; then
        cn_ranks=(--ranks "${COLLNET_RANKS:-2,3,4},5")
      fi
      if [ "$build" = asan ]; then
        envs+=(ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:print_summary=1:quarantine_size_mb=4")
        cn_ranks=(--ranks "${COLLNET_ASAN_RANKS:-2,5}") # the ASan runs are slow: fewer rank counts
      fi
      # kill: the ranks run with FABRICOLL_TIMEOUT_MS=3000; survivors must fail within 3 s + 5 s
      cn_scen=()
      if [ "$prov" = shm ] && [ "${SHM_KILL:-1}" != 1 ]; then
        # See the net harness above.
        cn_scen=(--scenario symbols,support,allreduce,allgather,reducescatter,inflight,versions,twocomms)
        echo "SKIP CollNet kill on shm (SHM_KILL=0)"
      fi
      out=$(timeout --kill-after=15 "$RUN_TIMEOUT" env -u FABRICOLL_DOMAIN "${envs[@]}" "$exe" --lib "$LIB" \
        --kill-timeout-ms 3000 "${cn_ranks[@]}" "${cn_scen[@]}" ${COLLNET_ARGS:-} 2>"$log")
      rc=$?
      printf '%s\n' "$out"
      harness_counts collnet_harness "collnet-run: $prov/$build" "$out" "$rc" "$log"
      total_pass=$((total_pass + p))
      total_fail=$((total_fail + f))
      summary="$summary  collnet $prov/$build: $p passed, $f failed (log: $log)\n"
      if declare -F shm_cleanup >/dev/null; then shm_cleanup; fi
    done
  done
fi

# ---- C API examples ------------------------------------------------------------------------
if [ "$CAPI" = 1 ]; then
  for build in $BUILDS; do
    case "$build" in
      normal) progs="capi_example capi_example_cpp" ;;
      asan) progs="capi_example_asan" ;;
    esac
    for prog in $progs; do
      for prov in $PROVIDERS; do
        skip_build "$build" "$prov" && continue
        log="$LOGDIR/capi-$prog-$prov.log"
        echo "== C API example $prog, provider $prov, $CAPI_RANKS ranks =="
        envs=(FABRICOLL_PROVIDER="$prov")
        # one host: "same" keeps the C API's ranks on the IP provider instead of shm
        is_ip "$prov" && envs+=(FABRICOLL_DOMAIN=lo FABRICOLL_INTRA_PROVIDER=same)
        [ "$build" = asan ] && envs+=(ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:print_summary=1:quarantine_size_mb=4")
        # FABRICOLL_TIMEOUT_MS: a lost rank turns into an error well before the parent's deadline
        out=$(timeout --kill-after=15 "$RUN_TIMEOUT" env -u FABRICOLL_DOMAIN FABRICOLL_TIMEOUT_MS=60000 \
          "${envs[@]}" "$HERE/build/$prog" -n "$CAPI_RANKS" -t "$CAPI_TIMEOUT" 2>&1)
        rc=$?
        printf '%s\n' "$out" >"$log"
        # the failures and the summary (every check and error message is in the log)
        printf '%s\n' "$out" | grep -E '^(rank [0-9]+: FAIL|FAIL |capi_example)'
        harness_counts capi_example "capi-run: $prog/$prov" "$out" "$rc" "$log"
        total_pass=$((total_pass + p))
        total_fail=$((total_fail + f))
        summary="$summary  capi $prog/$prov: $p passed, $f failed (log: $log)\n"
      done
    done
  done
fi

# ---- real NCCL (PyTorch's NCCL backend) over the plugin: needs a GPU, skipped without one -----
if [ "$NCCL_TORCH" = 1 ]; then
  log="$LOGDIR/nccl-torch.log"
  echo "== NCCL through PyTorch (plugin-tests/nccl_torch.py), provider tcp, 2 ranks on GPU 0 =="
  if ! command -v python3 >/dev/null 2>&1; then
    echo "SKIP nccl-torch: no python3"
    summary="$summary  nccl-torch: skipped (no python3)\n"
  else
    # with MPS the ranks share GPU 0 at once and the timings are the transport's (nccl_torch.py)
    mps=()
    command -v nvidia-cuda-mps-control >/dev/null 2>&1 && mps=(--mps)
    out=$(timeout --kill-after=15 400 python3 "$HERE/nccl_torch.py" --lib "$LIB" --ranks 2 \
      --provider tcp "${mps[@]}" --timeout 300 2>&1)
    rc=$?
    printf '%s\n' "$out" >"$log"
    if printf '%s\n' "$out" | grep -q '^SKIP'; then
      printf '%s\n' "$out" | grep '^SKIP' | sed 's/^SKIP/SKIP nccl-torch/'
      summary="$summary  nccl-torch: skipped ($(printf '%s\n' "$out" | grep -m1 '^SKIP' | cut -c7-))\n"
    else
      printf '%s\n' "$out" | grep -E 'WRONG|passed|plugin loaded|allreduce [0-9]+ MiB'
      if [ "$rc" -eq 0 ]; then p=1 f=0; else p=0 f=1; fi
      total_pass=$((total_pass + p))
      total_fail=$((total_fail + f))
      summary="$summary  nccl-torch: exit $rc (log: $log)\n"
    fi
  fi
fi

printf '%b' "$summary"
echo "plugin-tests: $total_pass passed, $total_fail failed, $total_skip skipped"
[ "$total_fail" -eq 0 ]
