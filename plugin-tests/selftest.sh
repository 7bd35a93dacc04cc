#!/usr/bin/env bash
# plugin-tests/selftest.sh: checks the harness itself against mock_plugin.c (no libfabric, no
# network: Unix sockets). First every scenario must pass on the correct mock, with both builds;
# then, for each bug the mock can inject (MOCK_BUG=...), the scenario meant to catch it must fail.
# Prints "selftest: N passed, M failed".
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
timeout 300 make -C "$HERE" all mock >/dev/null || { echo "selftest: build failed"; exit 1; }
MOCK="$HERE/build/libnccl-net-mock.so"
pass=0
fail=0

for exe in net_harness net_harness_asan; do
  if ASAN_OPTIONS=detect_leaks=1 timeout 600 "$HERE/build/$exe" --lib "$MOCK" --scenario all >/tmp/selftest.$$ 2>&1; then
    echo "ok   $exe: all scenarios pass on the correct mock"
    pass=$((pass + 1))
  else
    echo "FAIL $exe: scenarios failed on the correct mock:"
    grep -E '^(FAIL|net_harness:)' /tmp/selftest.$$
    fail=$((fail + 1))
  fi
done

# bug -> scenario that must catch it
for pair in corrupt:xfer overrun:xfer badsize:xfer tagorder:group nulls:inflight32 hang:kill leakfd:cycles \
  noverify:badinput hint:badinput corrupt:ring4 corrupt:pairs16 badsize:versions; do
  bug=${pair%%:*}
  scn=${pair#*:}
  extra=""
  [ "$scn" = cycles ] && extra="--cycles 200"
  MOCK_BUG=$bug timeout 300 "$HERE/build/net_harness" --lib "$MOCK" --scenario "$scn" $extra >/tmp/selftest.$$ 2>&1
  if grep -q "^FAIL $scn:" /tmp/selftest.$$; then
    echo "ok   MOCK_BUG=$bug caught by $scn: $(grep "^FAIL $scn:" /tmp/selftest.$$ | cut -c1-160)"
    pass=$((pass + 1))
  else
    echo "FAIL MOCK_BUG=$bug NOT caught by $scn"
    fail=$((fail + 1))
  fi
done
rm -f /tmp/selftest.$$

if timeout 120 "$HERE/build/net_bench" --lib "$MOCK" -b 8 -e 1M -f 16 -t 0.1 >/tmp/selftest-bench.$$ 2>&1 &&
  [ "$(grep -cE '^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$' /tmp/selftest-bench.$$)" -eq 5 ]; then
  echo "ok   net_bench produced 5 rows"
  pass=$((pass + 1))
else
  echo "FAIL net_bench:"
  cat /tmp/selftest-bench.$$
  fail=$((fail + 1))
fi
rm -f /tmp/selftest-bench.$$
echo "selftest: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
