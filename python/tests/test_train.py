"""DDP and FSDP2 training steps with the backend under test against gloo in the same job, at 2
and 4 ranks over shm and net (tests.ranks.train)."""
import unittest

from tests.checks import assert_checks, run_job


class Training(unittest.TestCase):
    def _run(self, nranks, provider):
        assert_checks(self, run_job(self, "train", nranks, provider))

    def test_shm_2(self):
        self._run(2, "shm")

    def test_shm_4(self):
        self._run(4, "shm")

    def test_net_2(self):
        self._run(2, "net")

    def test_net_4(self):
        self._run(4, "net")


if __name__ == "__main__":
    unittest.main()
