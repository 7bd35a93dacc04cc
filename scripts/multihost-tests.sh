#!/usr/bin/env bash
# scripts/multihost-tests.sh - the emulated-hosts stage of scripts/test.sh: fabricoll-perf ranks
# in network namespaces joined by a bridge (scripts/netns-cluster.sh), one process per rank under
# a launcher's variables. What it checks: scripts/multihost/mh_tests.py (its docstring and
# environment). Last line: `multihost-tests: N passed, N failed, N skipped`.
#
# Needs root and `ip netns`. Where namespaces cannot be made it skips, saying why, and fails
# under FABRICOLL_TEST_STRICT=1 (as scripts/test.sh runs it). Every namespace, veth and bridge
# it made is removed at the end, also when it is interrupted or terminated; clusters left by a
# run that was killed with SIGKILL are removed by the next run (netns-cluster.sh down --stale).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

skip() {
  if [ "${FABRICOLL_TEST_STRICT:-0}" = 1 ]; then
    echo "multihost-tests: cannot run here: $1 (FABRICOLL_TEST_STRICT=1: a test that cannot run fails)"
    echo "multihost-tests: 0 passed, 1 failed, 0 skipped"
    exit 1
  fi
  echo "multihost-tests: SKIPPED: $1"
  if [ -n "${FABRICOLL_SKIP_LOG:-}" ]; then
    echo "multihost-tests: $1" >>"$FABRICOLL_SKIP_LOG"
  fi
  echo "multihost-tests: 0 passed, 0 failed, 1 skipped"
  exit 0
}

[ "$(id -u)" -eq 0 ] || skip "not root: network namespaces need root"
command -v ip >/dev/null 2>&1 || skip "ip (iproute2) is not installed: run scripts/deps.sh"
command -v ss >/dev/null 2>&1 || skip "ss (iproute2) is not installed: run scripts/deps.sh"
command -v unshare >/dev/null 2>&1 || skip "unshare (util-linux) is not installed"
scripts/netns-cluster.sh down --stale
probe="fcn$$z"
if ! out=$(ip netns add "$probe-h1" 2>&1); then
  skip "cannot create a network namespace: $out"
fi
ip netns del "$probe-h1"

prefix="fcn$$"
runner=""
cleanup() {
  if [ -n "$runner" ]; then
    kill -TERM "$runner" 2>/dev/null
    # bounded: the runner only has to notice; its ranks die with the namespaces below
    for _ in $(seq 1 20); do kill -0 "$runner" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$runner" 2>/dev/null
  fi
  scripts/netns-cluster.sh down --owner $$
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# In the background and waited for, so that a signal runs the cleanup at once.
MH_PREFIX=$prefix MH_OWNER=$$ python3 scripts/multihost/mh_tests.py "$@" &
runner=$!
wait "$runner"
rc=$?
runner=""
exit "$rc"
