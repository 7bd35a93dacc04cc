"""The harness itself, without a backend: the launcher's environment, results and hard timeout,
the strict skip, the reference reductions, the benchmark's table."""
import os
import unittest
from unittest import mock

from tests import harness, launcher


class Launcher(unittest.TestCase):
    def test_env_and_results(self):
        res = launcher.launch("selftest", 3, "selftest-ok", timeout=60)
        self.assertEqual(res.rcs, [0, 0, 0], res.describe())
        ports = {r["env"]["MASTER_PORT"] for r in res.results}
        self.assertEqual(len(ports), 1)
        for r, out in enumerate(res.results):
            self.assertEqual(out["env"]["RANK"], str(r))
            self.assertEqual(out["env"]["WORLD_SIZE"], "3")

    def test_hang_is_killed_at_the_timeout(self):
        res = launcher.launch("selftest", 2, "selftest-hang", args={"hang_rank": 1}, timeout=3)
        self.assertTrue(res.timed_out)
        self.assertEqual(res.rcs[0], 0)
        self.assertNotEqual(res.rcs[1], 0)
        self.assertLess(res.elapsed, 30)
        self.assertIn("TIMED OUT", res.describe())

    def test_failing_rank_reports_its_traceback(self):
        res = launcher.launch("selftest", 2, "selftest-fail", args={"fail_rank": 0}, timeout=60)
        self.assertEqual(res.rcs, [1, 0])
        self.assertIn("fails on purpose", res.results[0]["error"])
        self.assertIn("fails on purpose", res.describe())


class Skip(unittest.TestCase):
    def test_strict_skip_fails(self):
        with mock.patch.dict(os.environ, {"FABRICOLL_TEST_STRICT": "1"}):
            with self.assertRaisesRegex(AssertionError, "cannot run here: why"):
                harness.skip("t", "why")

    def test_skip_logs_and_skips(self):
        log = os.path.join(harness.target_dir(), "torch-tests", "skip-selftest.txt")
        os.makedirs(os.path.dirname(log), exist_ok=True)
        open(log, "w", encoding="utf-8").close()
        env = {"FABRICOLL_TEST_STRICT": "0", "FABRICOLL_SKIP_LOG": log}
        with mock.patch.dict(os.environ, env):
            with self.assertRaises(unittest.SkipTest):
                harness.skip("t", "why")
        with open(log, encoding="utf-8") as f:
            self.assertIn("torch-tests t: why", f.read())

    def test_net_runs_on_one_fabric(self):
        self.assertEqual(harness.provider_env("net")["FABRICOLL_INTRA_PROVIDER"], "same")
        self.assertEqual(harness.provider_env("shm"), {"FABRICOLL_PROVIDER": "shm"})


class Reference(unittest.TestCase):
    def test_reductions(self):
        import torch  # pylint: disable=import-outside-toplevel
        from tests.ranks import ops_reduce  # pylint: disable=import-outside-toplevel
        xs = [torch.tensor([100, -3, 7], dtype=torch.int8), torch.tensor([100, 5, 3],
                                                                          dtype=torch.int8)]
        self.assertEqual(ops_reduce.reference(xs, "SUM").tolist(), [-56, 2, 10])  # wraps
        self.assertEqual(ops_reduce.reference(xs, "BXOR").tolist(), [0, -8, 4])
        self.assertEqual(ops_reduce.reference(xs, "MIN").tolist(), [100, -3, 3])
        f = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 5.0])]
        self.assertEqual(ops_reduce.reference(f, "AVG").tolist(), [2.0, 3.5])
        self.assertEqual(ops_reduce.reference(f, "PREMUL_SUM").tolist(), [8.0, 14.0])
        b = [torch.tensor([True, False, False]), torch.tensor([True, True, False])]
        self.assertEqual(ops_reduce.reference(b, "SUM").tolist(), [True, True, False])
        self.assertEqual(ops_reduce.reference(b, "BAND").tolist(), [True, False, False])

    def test_same_is_bitwise_where_asked(self):
        import torch  # pylint: disable=import-outside-toplevel
        from tests.ranks import common  # pylint: disable=import-outside-toplevel
        a = torch.tensor([1.0, 0.0])
        common.same(a, a.clone(), True, "x")
        with self.assertRaisesRegex(AssertionError, "not bitwise equal.*first at 1"):
            common.same(a, torch.tensor([1.0, -0.0]), True, "x")
        common.same(torch.tensor([1.0]), torch.tensor([1.0 + 1e-7]), False, "x")
        with self.assertRaisesRegex(AssertionError, "beyond tolerance"):
            common.same(torch.tensor([1.0]), torch.tensor([1.1]), False, "x")


if __name__ == "__main__":
    unittest.main()
