"""PyTorch's own backend-generic distributed tests (DistributedTest._DistTestBase from
torch.testing._internal.distributed.distributed_test) run with a chosen backend, as PyTorch's
test/distributed/test_distributed_spawn.py does (that file is not in the wheel): each test spawns
WORLD_SIZE processes that init the backend from a file store.

    python -m tests.torch_suite --backend fabricoll [--world-size 3] [--select ci|all|REGEX]
                                [--start spawn|fork] [--json OUT] [--list]

--start fork (CI's subset) forks the ranks from the runner, as PyTorch's former
test_distributed_fork.py did: a spawned rank spends seconds importing torch before each test.

"fabricoll" is counted as a CPU backend like gloo where that is honest: it joins
DistTestCases.backend_feature "ddp", "subgroup" and "plugin", and "gpu" (the set of the standard
backends: every test under that gate that needs a GPU also carries a GPU-count gate). Tests
gated on gloo's or MPI's name (BACKEND == "gloo", "Only MPI supports CPU all_to_all") stay
skipped. Each child imports this module (spawn), so `import fabricoll.torch` runs there too.
Prints one line per test and `torch-suite: N passed, M failed, K skipped`; --json writes
{test: [status, reason]}. DISTRIBUTED_TESTS_DEFAULT_TIMEOUT bounds each test (default 120 s).
"""
import argparse
import json
import multiprocessing
import os
import re
import sys
import time
import unittest

# CI's subset (--select ci): the tests that pass with gloo at world size 3 on CPU, less those
# of gloo-only features (monitored_barrier, per-op timeouts, sparse tensors, batch_isend_irecv
# gated on gloo's name), receive from any source, the profiler's event checks, and the tests
# that skip any backend but gloo, MPI and NCCL by name (get_future hooks, coalesced all_reduce,
# scatter_object_list). Also left out, as torch's limits for any Python backend: test_isend and
# test_irecv (Work.is_completed(): torch's holder of a Python backend's Work forwards only
# wait() and get_future()) and test_ddp_logging_data_cpu (DDP's logger names a Python
# backend 'custom'). --select all runs every test (scripts/torch-tests.sh --full).
CI = [
    "test_Backend_enum_class", "test_DistributedDataParallelCPU",
    "test_DistributedDataParallelCPU_grad_is_view", "test_DistributedDataParallel_requires_grad",
    "test_all_gather", "test_all_gather_coalesced_complex",
    "test_all_gather_coalesced_full_group", "test_all_gather_coalesced_simple",
    "test_all_gather_coalesced_with_empty", "test_all_gather_complex",
    "test_all_gather_full_group", "test_all_gather_object_default_pg",
    "test_all_gather_object_subgroup", "test_all_reduce_coalesced_max_complex_unsupported",
    "test_all_reduce_complex_unsupported_ops", "test_all_reduce_full_group_max",
    "test_all_reduce_full_group_min", "test_all_reduce_full_group_product",
    "test_all_reduce_full_group_sum", "test_all_reduce_max", "test_all_reduce_min",
    "test_all_reduce_product", "test_all_reduce_sum", "test_all_reduce_sum_async",
    "test_all_reduce_sum_complex", "test_barrier", "test_barrier_full_group", "test_broadcast",
    "test_broadcast_full_group", "test_ddp_create_graph",
    "test_destroy_full_group", "test_destroy_group", "test_gather", "test_gather_checks",
    "test_gather_full_group", "test_get_backend", "test_get_rank",
    "test_get_rank_size_full_group", "test_get_rank_size_group",
    "test_reduce_full_group_max", "test_reduce_full_group_min", "test_reduce_full_group_product",
    "test_reduce_full_group_sum", "test_reduce_max", "test_reduce_min", "test_reduce_product",
    "test_reduce_sum", "test_reduce_sum_twice", "test_scatter", "test_scatter_checks",
    "test_scatter_complex", "test_scatter_full_group", "test_send_recv",
    "test_send_recv_with_tag", "test_static_graph_api_cpu",
]


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--backend", default=os.environ.get("BACKEND", "fabricoll"))
    p.add_argument("--world-size", default=os.environ.get("WORLD_SIZE", "3"))
    p.add_argument("--select", default="ci", help="ci, all, or a regular expression")
    p.add_argument("--start", choices=("spawn", "fork"),
                   default=os.environ.get("TORCH_SUITE_START", "spawn"))
    p.add_argument("--json", help="write {test: [status, reason]} here")
    p.add_argument("--list", action="store_true", help="print the selected tests and exit")
    return p.parse_args()


if __name__ == "__main__":
    ARGS = parse()
    # the children (spawn) re-import this module: they find these in their environment
    os.environ["BACKEND"] = ARGS.backend
    os.environ["WORLD_SIZE"] = str(ARGS.world_size)
    os.environ["TORCH_SUITE_START"] = ARGS.start
os.environ.setdefault("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "120")
os.environ.setdefault("TEMP_DIR", "/tmp")  # replaced per test by TestDistBackend.setUp

# pylint: disable=wrong-import-position
import torch  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if os.environ.get("BACKEND") == "fabricoll":
    import fabricoll.torch  # noqa: E402,F401  pylint: disable=unused-import
    for _feature in ("ddp", "subgroup", "plugin", "gpu"):
        DistTestCases.backend_feature[_feature].add("fabricoll")

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """As PyTorch's test_distributed_spawn.py: each test spawns (or forks) its ranks."""

    def setUp(self):
        super().setUp()
        if os.environ.get("TORCH_SUITE_START") == "fork":
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    def tearDown(self):
        # a rank left blocked by a failed test (SIGTERM may be blocked there) must not outlive it
        for proc in getattr(self, "processes", []):
            if proc.is_alive():
                proc.kill()
                proc.join(10)
        super().tearDown()


def selected(select):
    names = sorted(n for n in dir(TestDistBackendWithSpawn) if n.startswith("test_"))
    if select == "ci":
        return [n for n in CI if n in names]
    if select == "all":
        return names
    rx = re.compile(select)
    return [n for n in names if rx.search(n)]


class Recorder(unittest.TextTestResult):
    """Keeps each test's status and reason for the JSON summary."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.status = {}

    def addSuccess(self, test):
        super().addSuccess(test)
        self.status[test._testMethodName] = ["passed", ""]

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.status[test._testMethodName] = ["failed", self._exc_info_to_string(err, test)[-6000:]]

    def addError(self, test, err):
        super().addError(test, err)
        self.status[test._testMethodName] = ["failed", self._exc_info_to_string(err, test)[-6000:]]

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.status[test._testMethodName] = ["skipped", str(reason)]

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self.status[test._testMethodName] = ["passed", "expected failure"]

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self.status[test._testMethodName] = ["failed", "unexpected success"]


def main():
    names = selected(ARGS.select)
    if ARGS.list:
        print("\n".join(names))
        return 0
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    t0 = time.monotonic()
    res = unittest.TextTestRunner(resultclass=Recorder, verbosity=2, stream=sys.stdout).run(suite)
    counts = {s: sum(1 for v in res.status.values() if v[0] == s)
              for s in ("passed", "failed", "skipped")}
    if ARGS.json:
        with open(ARGS.json, "w", encoding="utf-8") as f:
            json.dump({"backend": ARGS.backend, "world_size": ARGS.world_size,
                       "select": ARGS.select, "start": ARGS.start,
                       "seconds": round(time.monotonic() - t0, 1),
                       "tests": res.status}, f, indent=1, sort_keys=True)
    # a rank that hung (a failed test leaves it behind) must not hold this process at exit:
    # multiprocessing joins its children then
    for child in multiprocessing.active_children():
        child.kill()
    print(f"torch-suite: {counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['skipped']} skipped ({ARGS.backend}, world size {ARGS.world_size}, "
          f"{ARGS.start}, "
          f"{time.monotonic() - t0:.0f}s)")
    sys.stdout.flush()
    return 0 if counts["failed"] == 0 else 1


if __name__ == "__main__":
    RC = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(RC)  # (no interpreter teardown: a backend's threads cannot turn a result into a hang)
