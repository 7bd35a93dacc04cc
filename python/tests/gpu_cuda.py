"""CUDA tensors on the backend (tests.ranks.cuda_ops), 2 and 3 ranks sharing the machine's GPUs
over shm. Needs a GPU and the compiled front: not a test_* module, so the CPU runs never
collect it; scripts/torch/gpu-check.sh runs it on the GPU machine."""
import os
import unittest

import torch

from tests.checks import assert_checks, run_job


class CudaTensors(unittest.TestCase):
    """Every operation the compiled front runs on CUDA tensors, in stream order."""

    def _run(self, nranks):
        if not torch.cuda.is_available():
            self.fail("no GPU: this module runs on the GPU machine only")
        provider = os.environ.get("FABRICOLL_MIXED_PROVIDER", "shm")
        # ranks are processes: each has its own hardware queues, no CUDA_DEVICE_MAX_CONNECTIONS
        assert_checks(self, run_job(self, "cuda_ops", nranks, provider))

    def test_two_ranks(self):
        self._run(2)

    def test_three_ranks(self):
        self._run(3)


if __name__ == "__main__":
    unittest.main()
