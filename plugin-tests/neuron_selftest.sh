#!/usr/bin/env bash
# plugin-tests/neuron_selftest.sh: checks neuron_harness itself against neuron_mock.c (no
# libfabric, no network: Unix sockets). Every scenario must pass on the correct mock with both
# builds; then for each bug the mock can inject (MOCK_BUG=...), the scenario meant to catch it
# must fail. Prints "neuron-selftest: N passed, M failed".
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
timeout 300 make -C "$HERE" neuron neuron-mock >/dev/null || { echo "neuron-selftest: build failed"; exit 1; }
MOCK="$HERE/build/libnccom-net-mock.so"
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
pass=0
fail=0
# without RMA (the four calls must return SystemError) and with it (MOCK_RMA=1)
for run in "neuron_harness 0" "neuron_harness_asan 0" "neuron_harness 1"; do
  exe=${run% *}
  rma=${run#* }
  # quarantine_size_mb=4: ASan keeps freed memory resident (256 MiB by default), which the
  # ringcycles scenario would read as RSS growth
  if MOCK_RMA=$rma ASAN_OPTIONS=detect_leaks=0:quarantine_size_mb=4 timeout 600 "$HERE/build/$exe" --lib "$MOCK" --expect-rma "$rma" \
    >"$OUT" 2>&1; then
    echo "ok   $exe: every scenario passes on the correct mock (MOCK_RMA=$rma)"
    pass=$((pass + 1))
  else
    echo "FAIL $exe: scenarios failed on the correct mock (MOCK_RMA=$rma):"
    grep -E '^(FAIL|neuron_harness:)' "$OUT"
    fail=$((fail + 1))
  fi
done
# bug -> the scenario that must catch it
for pair in corrupt:xfer6 overrun:xfer5 nulls:inflight cudaok:badinput loudclose:lifecycle leakfd:cycles hang:kill \
  rmaoff:rma6 rmaoff:rma5 rmaoff:ring6 quieterr:badinput leakmem:ringcycles; do
  bug=${pair%%:*}
  scn=${pair#*:}
  MOCK_RMA=1 MOCK_BUG=$bug timeout 300 "$HERE/build/neuron_harness" --lib "$MOCK" --scenario "$scn" >"$OUT" 2>&1
  if grep -q "^FAIL $scn:" "$OUT"; then
    echo "ok   MOCK_BUG=$bug caught by $scn: $(grep "^FAIL $scn:" "$OUT" | cut -c1-160)"
    pass=$((pass + 1))
  else
    echo "FAIL MOCK_BUG=$bug NOT caught by $scn"
    fail=$((fail + 1))
  fi
done
echo "neuron-selftest: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
