"""Every operation of the backend under test against gloo in the same job, at 2 and 4 ranks,
over shm and net (tests.ranks.ops_reduce and tests.ranks.ops_move hold the checks)."""
import os
import unittest

from tests.checks import assert_checks, run_job


class ReduceOps(unittest.TestCase):
    """all_reduce (every ReduceOp x CPU dtype), reduce, reduce_scatter, coalesced forms."""

    def _run(self, nranks, provider):
        assert_checks(self, run_job(self, "ops_reduce", nranks, provider))

    def test_shm_2(self):
        self._run(2, "shm")

    def test_shm_4(self):
        self._run(4, "shm")

    def test_net_2(self):
        self._run(2, "net")

    def test_net_4(self):
        self._run(4, "net")


class MoveOps(unittest.TestCase):
    """broadcast, all_gather, all_to_all, gather, scatter, barrier, send/recv, futures, groups,
    DeviceMesh, functional collectives, object collectives."""

    def _run(self, nranks, provider):
        assert_checks(self, run_job(self, "ops_move", nranks, provider))

    def test_shm_2(self):
        self._run(2, "shm")

    def test_shm_4(self):
        self._run(4, "shm")

    def test_net_2(self):
        self._run(2, "net")

    def test_net_4(self):
        self._run(4, "net")


class Mixed(unittest.TestCase):
    """init_process_group("cpu:<backend>,cuda:..."): CPU tensors go to the backend under test."""

    def test_cpu_and_cuda_backends(self):
        # FABRICOLL_MIXED_PROVIDER: GPU machines whose libfabric lacks shm (scripts/torch/gpu-check.sh)
        provider = os.environ.get("FABRICOLL_MIXED_PROVIDER", "shm")
        assert_checks(self, run_job(self, "mixed", 2, provider))


if __name__ == "__main__":
    unittest.main()
