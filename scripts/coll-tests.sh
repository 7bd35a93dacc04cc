#!/usr/bin/env bash
# scripts/coll-tests.sh - multi-process test of the collective engines through fabricoll-perf:
# every algorithm x collective it implements, 2-8 ranks, over tcp, net and shm, results checked
# element by element. The runner is scripts/coll_tests.py (its docstring: matrix, variants,
# environment); its last line is `coll-tests: N passed, N failed, N skipped`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec python3 scripts/coll_tests.py "$@"
