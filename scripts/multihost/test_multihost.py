"""Unit tests of the multi-host helpers that need no namespaces: rank placement, each
launcher's variables, `ss` address parsing, the benchmark's row parsing and its summary."""
import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench  # noqa: E402
import summary  # noqa: E402
from cluster import base_env, launcher_env, placement, split_addr  # noqa: E402


class Placement(unittest.TestCase):
    def test_contiguous_and_cyclic(self):
        self.assertEqual(placement([3, 2, 1]), [1, 1, 1, 2, 2, 3])
        self.assertEqual(placement([3, 2, 1], cyclic=True), [1, 2, 3, 1, 2, 1])
        self.assertEqual(placement([1, 1, 1, 1]), [1, 2, 3, 4])

    def test_layout_names(self):
        self.assertEqual(bench.layout_of("2x4"), [4, 4])
        self.assertEqual(bench.layout_of("3+2+1"), [3, 2, 1])
        with self.assertRaises(ValueError):
            bench.layout_of("2xq")


class Launchers(unittest.TestCase):
    hosts = [1, 1, 2, 2]

    def test_torchrun_gives_the_root_address(self):
        e = launcher_env("torchrun", 3, self.hosts, "10.0.0.1", 29500)
        self.assertEqual((e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"]), ("3", "4", "1"))
        self.assertEqual((e["MASTER_ADDR"], e["MASTER_PORT"]), ("10.0.0.1", "29500"))

    def test_mpi_and_slurm_get_root_or_root_file(self):
        e = launcher_env("ompi", 2, self.hosts, "10.0.0.1", 29500)
        self.assertEqual(e["OMPI_COMM_WORLD_RANK"], "2")
        self.assertEqual(e["OMPI_COMM_WORLD_LOCAL_RANK"], "0")
        self.assertEqual(e["FABRICOLL_ROOT"], "10.0.0.1:29500")
        e = launcher_env("hydra", 1, self.hosts, "10.0.0.1", 1, root_file="/x")
        self.assertEqual((e["PMI_RANK"], e["PMI_SIZE"]), ("1", "4"))
        self.assertEqual(e["FABRICOLL_ROOT_FILE"], "/x")
        self.assertNotIn("FABRICOLL_ROOT", e)
        e = launcher_env("slurm", 3, self.hosts, "10.0.0.1", 7)
        self.assertEqual((e["SLURM_PROCID"], e["SLURM_NTASKS"], e["SLURM_LOCALID"]),
                         ("3", "4", "1"))
        e = launcher_env("uid", 0, self.hosts, "", 0, unique_id="ab")
        self.assertEqual(e["FABRICOLL_UNIQUE_ID"], "ab")
        with self.assertRaises(ValueError):
            launcher_env("pbs", 0, self.hosts, "", 0)

    def test_callers_launcher_variables_are_dropped(self):
        os.environ["OMPI_COMM_WORLD_RANK"] = "5"
        os.environ["FABRICOLL_LOG"] = "info"
        try:
            env = base_env()
        finally:
            del os.environ["OMPI_COMM_WORLD_RANK"]
            del os.environ["FABRICOLL_LOG"]
        self.assertNotIn("OMPI_COMM_WORLD_RANK", env)
        self.assertEqual(env["FABRICOLL_LOG"], "info")


class Parsing(unittest.TestCase):
    def test_ss_addresses(self):
        self.assertEqual(split_addr("10.77.0.1:4000"), ("10.77.0.1", 4000))
        self.assertEqual(split_addr("[::ffff:10.77.0.2]:80"), ("10.77.0.2", 80))
        self.assertIsNone(split_addr("*:*"))

    def test_rows_of_both_tools(self):
        perf = "# header\n        1024     256  float  sum  ring   12.50  0.08  0.12  0\n"
        self.assertEqual(bench.rows(perf, "perf"), [(1024, 12.5, 0.12)])
        ompi = "  1024  256 float sum  50  20.00  19.00  0.05  0.077  -1\n# x\n"
        self.assertEqual(bench.rows(ompi, "ompi"), [(1024, 20.0, 0.077)])


class Summary(unittest.TestCase):
    def test_ratios_and_targets(self):
        samples = []
        for rep in range(3):
            for tool, t, bw in [("auto", 110, 1.0), ("algo:ring", 100, 1.1),
                                ("algo:tree", 200, 0.5), ("ompi", 100, 0.8),
                                ("auto-same", 220, 0.5)]:
                samples.append({"layout": "2x2", "delay": "0", "coll": "allreduce",
                                "tool": tool, "rep": rep, "size": 65536, "time_us": t,
                                "busbw": bw})
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write("\n".join(json.dumps(s) for s in samples) + "\n")
        out = io.StringIO()
        try:
            with redirect_stdout(out):
                self.assertEqual(summary.main(["summary.py", f.name]), 0)
        finally:
            os.remove(f.name)
        text = out.getvalue()
        row = [ln for ln in text.splitlines() if ln.strip().startswith("65536")][0].split()
        # auto 110, best ring 100: 1.10; busbw 1.0 / 0.8; one fabric 220 / 110
        self.assertEqual(row[1:], ["110.0", "100.0", "ring", "1.10", "100.0", "1.25", "2.00"])
        self.assertIn("auto within 10% of best forced: 1 of 1 points", text)
        self.assertIn("busbw >= Open MPI's from 64 KiB: 1 of 1 points", text)


if __name__ == "__main__":
    unittest.main()
