"""Every operation of the backend under test against gloo in the same job, at 2 and 4 ranks,
over shm and net (tests.ranks.ops_reduce and tests.ranks.ops_move hold the checks)."""
import os
import unittest

from tests import harness
from tests.checks import assert_checks, matrix_case, run_job

ReduceOps = matrix_case(
    __name__, "ReduceOps", "ops_reduce",
    "all_reduce (every ReduceOp x CPU dtype), reduce, reduce_scatter, coalesced forms.")
MoveOps = matrix_case(
    __name__, "MoveOps", "ops_move",
    "broadcast, all_gather, all_to_all, gather, scatter, barrier, send/recv, futures, groups, "
    "DeviceMesh, functional collectives, object collectives.")


class PythonOnly(unittest.TestCase):
    """The Python backend alone (FABRICOLL_TORCH_EXT=0), as it runs where the compiled front
    is not built: every operation at 2 ranks over shm, and training steps. Not on a torch
    that cannot run it (2.11: tests.test_package.Choice checks the import's error there)."""

    def _run(self, job):
        if not harness.python_backend_runs_alone():
            self.skipTest("this torch cannot run the Python backend alone (its c10d Backend "
                          "cannot be subclassed in Python)")
        env = {"FABRICOLL_TORCH_EXT": "0"}
        assert_checks(self, run_job(self, job, 2, "shm", env=env, variant="python"))

    def test_reduce_ops(self):
        self._run("ops_reduce")

    def test_move_ops(self):
        self._run("ops_move")

    def test_train(self):
        self._run("train")


class Mixed(unittest.TestCase):
    """init_process_group("cpu:<backend>,cuda:..."): CPU tensors go to the backend under test."""

    def test_cpu_and_cuda_backends(self):
        # FABRICOLL_MIXED_PROVIDER: GPU machines whose libfabric lacks shm (scripts/torch/gpu-check.sh)
        provider = os.environ.get("FABRICOLL_MIXED_PROVIDER", "shm")
        assert_checks(self, run_job(self, "mixed", 2, provider))


if __name__ == "__main__":
    unittest.main()
