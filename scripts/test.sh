#!/usr/bin/env bash
# scripts/test.sh - THE test command (README and CI run this, nothing else).
#
# Stages, in order; the first failure stops the run (fail fast). The cheap checks that need no
# build come first, so that a formatting slip fails in seconds:
#   deps          scripts/deps.sh
#   fmt           cargo fmt --all -- --check
#   py-tests      python3 -m unittest over scripts/tests (the coll-tests runner's matrix,
#                 scripts/benchsum.py against bench-coll.sh's earlier tables, the Open MPI
#                 baseline built and run at 2 ranks, the repository standing alone) and
#                 scripts/multihost (placement, launcher variables, the multi-host summary)
#   build         scripts/build.sh (release library, binaries, the Neuron flavour
#                 libnccom-net.so, C harness)
#   clippy        cargo clippy --all-targets --release -- -D warnings, and the Neuron flavour's
#                 library (--features neuron)
#   cargo-test    cargo test --release (unit tests and tests/: header, README config table,
#                 exported symbols, multi-process tests over tcp and shm)
#   coll-tests    scripts/coll-tests.sh (fabricoll-perf: every algorithm x collective it
#                 implements, 2-8 ranks, tcp and net on lo and shm, results checked element by element)
#   multihost-tests scripts/multihost-tests.sh (as root: emulated hosts in network namespaces;
#                 every algorithm x collective over net and tcp between hosts and shm within,
#                 layouts 2x2, 3+2+1, 4x1, no TCP inside a host, a killed rank, mismatched
#                 providers, each launcher's variables, two interfaces per host, fabricoll-sim
#                 against a measurement at 2x2 and 1 Gbit/s (loose bound); skips where
#                 namespaces cannot be made, which fails under FABRICOLL_TEST_STRICT=1)
#   plugin-tests  plugin-tests/selftest.sh (the net harness against a mock with injected bugs:
#                 each bug must be caught), then plugin-tests/run.sh (C harness over tcp, net and
#                 shm, normal and ASan builds, and the C API examples in C and C++)
#   tuner-tests   plugin-tests/tuner_run.sh (the tuner tables v2-v6 as NCCL's loader calls them:
#                 every collective and size, 1-64 nodes, -1 cells never changed; normal and ASan)
#   neuron-tests  plugin-tests/neuron_selftest.sh (the Neuron harness against a mock with injected
#                 bugs), then plugin-tests/neuron_run.sh (libnccom-net.so played as libnccom: the
#                 Neuron tables v4-v6 over tcp, net and shm, normal and ASan builds)
#   lf2-tests     scripts/lf2-tests.sh: the second configuration, libfabric 2.1.0 built from its
#                 upstream source once and cached (scripts/libfabric2.sh), fabricoll built against
#                 its headers in a target directory of its own, then the Rust tests, the
#                 collective matrix and the net, CollNet and C API harnesses run on it
#   torch-tests   scripts/torch-tests.sh (the torch venv from scripts/deps.sh --torch, then the
#                 torch.distributed backend: every operation against gloo in the same job, DDP and
#                 FSDP2 training, error paths, at 2 and 4 ranks over shm and net, and a subset of
#                 PyTorch's own distributed tests)
# Prints the elapsed time of each stage and a summary at the end (with the test counts); exits
# non-zero on any failure.  Each stage's output is also saved in $CARGO_TARGET_DIR/test-logs/.
# Tests run strict (FABRICOLL_TEST_STRICT=1 unless set): a test that cannot run here fails.
# Every stage runs under `timeout` (its own limit, or TEST_STAGE_TIMEOUT seconds for all stages),
# and the whole run stops after TEST_TOTAL_TIMEOUT seconds (default 3600), so a hung test cannot
# hang CI. The limits are about 3 times each stage's time on an idle 2-core machine, so that a
# machine with other work still passes.  Honours CARGO_TARGET_DIR (default target/).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi

t_start=$(date +%s)
all_stages=(deps fmt py-tests build clippy cargo-test coll-tests multihost-tests plugin-tests
  tuner-tests neuron-tests lf2-tests torch-tests)
names=() results=() times=() details=()
current="" failed=""
# each stage's output is also kept in $log_dir/<stage>.log
log_dir="${CARGO_TARGET_DIR:-target}/test-logs"
mkdir -p "$log_dir"
log_dir=$(cd "$log_dir" && pwd)
# A test that cannot run here fails (nccl_net_fabricoll::testing::skip) unless the caller chose
# FABRICOLL_TEST_STRICT=0; then it is logged in skipped.txt and counted as skipped, not passed.
export FABRICOLL_TEST_STRICT=${FABRICOLL_TEST_STRICT:-1}
export FABRICOLL_SKIP_LOG="$log_dir/skipped.txt"
: >"$FABRICOLL_SKIP_LOG"

# stage_detail NAME: the test counts a stage printed, for the summary
stage_detail() {
  case "$1" in
    cargo-test)
      # a test that called testing::skip returned "ok" to cargo: it counts as skipped
      awk -v s="$(wc -l <"$FABRICOLL_SKIP_LOG")" '/^test result:/ {
             for (i = 1; i < NF; i++) { v = $(i + 1); sub(/[;,]$/, "", v)
             if ($i ~ /^[0-9]+$/ && v == "passed") p += $i
             if ($i ~ /^[0-9]+$/ && v == "failed") f += $i
             if ($i ~ /^[0-9]+$/ && v == "ignored") g += $i } n++ }
           END { if (n) printf "%d passed, %d failed, %d skipped, %d ignored (%d test binaries)",
                   p - s, f, s, g, n }' "$log_dir/$1.log" ;;
    py-tests) grep -E '^(Ran [0-9]+ tests|OK|FAILED)' "$log_dir/$1.log" | tr '\n' ' ' | sed 's/ $//' || true ;;
    coll-tests) grep -E '^coll-tests: [0-9]+ passed' "$log_dir/$1.log" | tail -1 || true ;;
    multihost-tests) grep -E '^multihost-tests: [0-9]+ passed' "$log_dir/$1.log" | tail -1 || true ;;
    plugin-tests) grep -E '^(selftest|plugin-tests): [0-9]+ passed' "$log_dir/$1.log" | tr '\n' ' ' |
      sed 's/ $//' || true ;;
    tuner-tests) grep -E '^tuner-tests: [0-9]+ passed' "$log_dir/$1.log" | tail -1 || true ;;
    neuron-tests) grep -E '^neuron-tests: [0-9]+ passed' "$log_dir/$1.log" | tail -1 || true ;;
    lf2-tests) grep -E '^lf2-tests: [0-9]+ passed' "$log_dir/$1.log" | tail -1 || true ;;
    torch-tests) grep -E '^torch-tests: [0-9]+ passed' "$log_dir/$1.log" | tail -1 || true ;;
  esac
}

fmt_secs() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# shellcheck disable=SC2317  # (summary and on_exit run from the EXIT trap)
summary() {
  local i
  echo
  echo "==================== test.sh summary ===================="
  for i in "${!names[@]}"; do
    printf '  %-16s %-8s %-7s %s\n' "${names[$i]}" "${results[$i]}" "${times[$i]}" \
      "${details[$i]:-}" | sed 's/ *$//'
  done
  for i in "${all_stages[@]:${#names[@]}}"; do
    printf '  %-16s %s\n' "$i" "not run"
  done
  echo "  total            $(fmt_secs $(($(date +%s) - t_start)))"
}

# shellcheck disable=SC2317
on_exit() {
  local rc=$?
  if [ -n "$current" ]; then # interrupted inside a stage
    names+=("$current") results+=("ABORTED") times+=("-") details+=("")
    failed=$current
  fi
  summary
  if [ "$rc" -eq 0 ] && [ -z "$failed" ]; then
    echo "test.sh: ALL STAGES PASSED"
  else
    if [ -n "$failed" ]; then
      echo "test.sh: FAILED at stage \"$failed\" (exit $rc)" >&2
    else
      echo "test.sh: FAILED (exit $rc)" >&2
    fi
  fi
}
trap on_exit EXIT
# killed (CI's limit, ^C): stop with a failing status, so the summary never reads as a pass
trap 'exit 143' TERM
trap 'exit 130' INT

# stage NAME TIMEOUT_S CMD... : run one stage, time it, stop everything if it fails.
stage() {
  local name=$1 limit=${TEST_STAGE_TIMEOUT:-$2} t0 rc=0 dt left
  shift 2
  # never let the whole run pass TEST_TOTAL_TIMEOUT (default 60 minutes)
  left=$((${TEST_TOTAL_TIMEOUT:-3600} - ($(date +%s) - t_start)))
  if [ "$left" -le 0 ]; then
    fail "$name" "no time left (TEST_TOTAL_TIMEOUT=${TEST_TOTAL_TIMEOUT:-3600}s reached)"
  fi
  [ "$limit" -le "$left" ] || limit=$left
  echo
  echo "==================== [$name] $* ===================="
  current=$name
  t0=$(date +%s)
  set +e
  timeout --kill-after=30 "$limit" "$@" 2>&1 | tee "$log_dir/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  dt=$(($(date +%s) - t0))
  current=""
  failed=$name
  names+=("$name") times+=("$(fmt_secs "$dt")") details+=("$(stage_detail "$name")")
  if [ "$rc" -eq 0 ]; then
    results+=("ok")
    failed=""
    echo "---- [$name] ok in $(fmt_secs "$dt")"
    return 0
  fi
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    results+=("TIMEOUT")
    echo "test.sh: stage '$name' TIMED OUT after ${limit}s: $*" >&2
  else
    results+=("FAILED")
    echo "test.sh: stage '$name' FAILED (exit $rc) after $(fmt_secs "$dt"): $*" >&2
  fi
  exit 1
}

# fail NAME MESSAGE : record NAME as failed without running it, and stop.
fail() {
  names+=("$1") results+=("FAILED") times+=("-") details+=("$2")
  failed=$1
  echo "test.sh: stage '$1' FAILED: $2" >&2
  exit 1
}

stage deps 600 scripts/deps.sh
cargo fmt --version >/dev/null 2>&1 ||
  fail fmt "rustfmt is not installed; run: rustup component add rustfmt"
stage fmt 120 cargo fmt --all -- --check
stage py-tests 120 sh -c 'python3 -m unittest discover -s scripts/tests -v &&
  python3 -m unittest discover -s scripts/multihost -v'
stage build 1500 scripts/build.sh
cargo clippy --version >/dev/null 2>&1 ||
  fail clippy "clippy is not installed; run: rustup component add clippy"
stage clippy 900 sh -c 'cargo clippy --all-targets --release -- -D warnings &&
  cargo clippy --release --lib --features neuron \
    --target-dir "${CARGO_TARGET_DIR:-target}/neuron" -- -D warnings'
stage cargo-test 900 cargo test --release
[ -x scripts/coll-tests.sh ] ||
  fail coll-tests "scripts/coll-tests.sh is missing or not executable"
stage coll-tests 900 env \
  FABRICOLL_PERF="${FABRICOLL_PERF:-${CARGO_TARGET_DIR:-target}/release/fabricoll-perf}" \
  scripts/coll-tests.sh
[ -x scripts/multihost-tests.sh ] ||
  fail multihost-tests "scripts/multihost-tests.sh is missing or not executable"
stage multihost-tests 720 env \
  FABRICOLL_PERF="${FABRICOLL_PERF:-${CARGO_TARGET_DIR:-target}/release/fabricoll-perf}" \
  scripts/multihost-tests.sh
[ -x plugin-tests/run.sh ] ||
  fail plugin-tests "plugin-tests/run.sh is missing or not executable"
stage plugin-tests 1500 env \
  FABRICOLL_LIB="${FABRICOLL_LIB:-${CARGO_TARGET_DIR:-target}/release/libnccl-net-fabricoll.so}" \
  sh -c 'plugin-tests/selftest.sh && plugin-tests/run.sh'
[ -x plugin-tests/tuner_run.sh ] ||
  fail tuner-tests "plugin-tests/tuner_run.sh is missing or not executable"
stage tuner-tests 600 env \
  FABRICOLL_LIB="${FABRICOLL_LIB:-${CARGO_TARGET_DIR:-target}/release/libnccl-net-fabricoll.so}" \
  plugin-tests/tuner_run.sh
[ -x plugin-tests/neuron_run.sh ] ||
  fail neuron-tests "plugin-tests/neuron_run.sh is missing or not executable"
stage neuron-tests 900 env \
  FABRICOLL_NEURON_LIB="${FABRICOLL_NEURON_LIB:-${CARGO_TARGET_DIR:-target}/release/libnccom-net.so}" \
  sh -c 'plugin-tests/neuron_selftest.sh && plugin-tests/neuron_run.sh'
[ -x scripts/lf2-tests.sh ] ||
  fail lf2-tests "scripts/lf2-tests.sh is missing or not executable"
stage lf2-tests 2400 scripts/lf2-tests.sh
[ -x scripts/torch-tests.sh ] ||
  fail torch-tests "scripts/torch-tests.sh is missing or not executable"
stage torch-tests 1500 scripts/torch-tests.sh
exit 0
