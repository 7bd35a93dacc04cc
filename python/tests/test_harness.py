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


class Reports(unittest.TestCase):
    def test_reason_is_the_exception_line(self):
        from tests.suite_compare import reason  # pylint: disable=import-outside-toplevel
        why = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
               "fabricoll._dtypes.Unsupported: fabricoll x: no\n\nTo execute this test, run:\n"
               "This message can be suppressed by setting PYTORCH_PRINT_REPRO_ON_FAILURE=0\n")
        self.assertEqual(reason(why), "fabricoll._dtypes.Unsupported: fabricoll x: no")
        self.assertEqual(reason("Skipped due to small world size."),
                         "Skipped due to small world size.")

    def test_bench_table_follows_nccl_tests(self):
        import sys  # pylint: disable=import-outside-toplevel
        sys.path.insert(0, os.path.join(harness.REPO, "scripts", "torch"))
        import bench  # pylint: disable=import-outside-toplevel
        res = {"ranks": 4, "colls": [
            {"coll": "all_reduce", "size": 1 << 20, "iters": {},
             "times": {"fabricoll": [1e-3, 2e-3, 3e-3], "gloo": [4e-3, 4e-3, 9e-3]}}]}
        lines = bench.tables(res, "shm")
        row = [ln for ln in lines if "1MiB" in ln][0].split()
        # 1 MiB in 2 ms: algbw 0.524 GB/s, busbw x 2(n-1)/n = 0.786; gloo's median 4 ms: 2.00x
        self.assertEqual(row[3:6], ["2000.0", "0.524", "0.786"])
        self.assertEqual(row[-1], "2.00x")
        self.assertEqual(bench.sizes(8, 64 << 20)[:3], [8, 64, 512])
        self.assertEqual(bench.sizes(4, 64 << 20)[-2:], [32 << 20, 64 << 20])
