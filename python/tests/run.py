"""The torch-tests stage (scripts/torch-tests.sh): our unittest modules, then PyTorch's own
distributed tests (tests.torch_suite, the CI subset), one count line at the end:
`torch-tests: N passed, M failed, K skipped` (PyTorch's tests counted one by one).

    python -m tests.run [--no-suite] [--suite-select ci|all|REGEX] [unittest names...]

Under FABRICOLL_TEST_STRICT=1 a skip is a failure (tests.harness.skip), and so is a PyTorch
test of the CI subset that skips (the subset is chosen to run with the backend).
Each piece has a deadline (TORCH_TESTS_SUITE_TIMEOUT, default 600 s, for PyTorch's tests).
PyTorch's tests fork their ranks here (TORCH_SUITE_START=spawn to spawn them, slower).
"""
import argparse
import json
import os
import subprocess
import sys
import time
import unittest

from tests import harness, suite_compare


def run_ours(names):
    loader = unittest.TestLoader()
    if names:
        suite = loader.loadTestsFromNames(names)
    else:
        suite = loader.discover(os.path.dirname(__file__), pattern="test_*.py",
                                top_level_dir=harness.PY_DIR)
    res = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    bad = len(res.failures) + len(res.errors) + len(res.unexpectedSuccesses)
    return res.testsRun - bad - len(res.skipped), bad, len(res.skipped)


def run_suite(select):
    """PyTorch's tests with the backend under test: (passed, failed, skipped)."""
    outdir = os.path.join(harness.target_dir(), "torch-tests")
    os.makedirs(outdir, exist_ok=True)
    out_json = os.path.join(outdir, f"suite-{harness.BACKEND}-{select}.json")
    log = os.path.join(outdir, f"suite-{harness.BACKEND}-{select}.log")
    if os.path.exists(out_json):
        os.remove(out_json)
    limit = int(os.environ.get("TORCH_TESTS_SUITE_TIMEOUT", "600"))
    cmd = [sys.executable, "-m", "tests.torch_suite", "--backend", harness.BACKEND,
           "--select", select, "--json", out_json,
           "--start", os.environ.get("TORCH_SUITE_START", "fork")]
    env = dict(os.environ, PYTHONPATH=harness.PY_DIR + os.pathsep
               + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    print(f"\nPyTorch's distributed tests ({select}, backend {harness.BACKEND}): log {log}",
          flush=True)
    t0 = time.monotonic()
    with open(log, "w", encoding="utf-8") as f:
        try:
            subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=limit,
                           cwd=harness.PY_DIR, check=False)
        except subprocess.TimeoutExpired:
            print(f"FAIL PyTorch's tests did not finish within {limit}s "
                  "(TORCH_TESTS_SUITE_TIMEOUT)")
            return 0, 1, 0
    try:
        with open(out_json, encoding="utf-8") as f:
            tests = json.load(f)["tests"]
    except (OSError, ValueError, KeyError):
        print(f"FAIL PyTorch's tests left no results; see {log}")
        return 0, 1, 0
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for name, (status, why) in sorted(tests.items()):
        if status == "skipped" and select == "ci" and harness.strict():
            status, why = "failed", f"skipped under FABRICOLL_TEST_STRICT=1: {why}"
        counts[status] += 1
        line = suite_compare.reason(why)
        print(f"  {status.upper():<7} {name} {line[:200]}")
    print(f"  ({time.monotonic() - t0:.0f}s)")
    return counts["passed"], counts["failed"], counts["skipped"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--no-suite", action="store_true", help="skip PyTorch's tests")
    p.add_argument("--suite-select", default="ci")
    p.add_argument("names", nargs="*", help="unittest names (default: every test_*.py)")
    a = p.parse_args()
    passed, failed, skipped = run_ours(a.names)
    if not a.no_suite and not a.names:
        try:
            harness.require("torch_suite")
            sp, sf, ss = run_suite(a.suite_select)
        except unittest.SkipTest as e:
            print(f"SKIP PyTorch's tests: {e}")
            sp, sf, ss = 0, 0, 1
        except AssertionError as e:
            print(f"FAIL {e}")
            sp, sf, ss = 0, 1, 0
        passed, failed, skipped = passed + sp, failed + sf, skipped + ss
    print(f"torch-tests: {passed} passed, {failed} failed, {skipped} skipped")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
