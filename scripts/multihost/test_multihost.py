"""Unit tests of the multi-host helpers that need no namespaces: rank placement, each
launcher's variables, `ss` address parsing, the benchmark's row parsing and its summaries, the
compressed benchmark's run order, and the benchmark scripts' syntax and --help."""
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench  # noqa: E402
import compress_summary  # noqa: E402
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

    def test_compressed_rows_and_errors(self):
        perf = ("#  size count type redop algo time algbw busbw #wrong error iters\n"
                "     1048576   262144  float  sum  bf16   5000.00  0.21  0.31  N/A  1.953e-3  26\n")
        self.assertEqual(bench.rows(perf, "perf"), [(1048576, 5000.0, 0.31)])
        self.assertEqual(bench.errors(perf), {1048576: 1.953e-3})
        self.assertEqual(bench.errors("  1024  256 float sum ring 12.5 0.08 0.12 0\n"), {})


class CompressOrder(unittest.TestCase):
    def test_pairs_back_to_back_and_turning(self):
        fmts = ["bf16", "int8"]
        self.assertEqual(bench.compress_order(fmts, 0),
                         [("off", "bf16"), ("compress:bf16", "bf16"),
                          ("off", "int8"), ("compress:int8", "int8")])
        # odd repetitions: compressed first, and the formats' order turned
        self.assertEqual(bench.compress_order(fmts, 1),
                         [("compress:int8", "int8"), ("off", "int8"),
                          ("compress:bf16", "bf16"), ("off", "bf16")])
        for rep in range(4):
            order = bench.compress_order(["bf16", "fp8e4m3", "int8"], rep)
            self.assertEqual(len(order), 6)
            for i in range(0, 6, 2):
                self.assertEqual(order[i][1], order[i + 1][1])
                self.assertEqual({order[i][0], order[i + 1][0]},
                                 {"off", f"compress:{order[i][1]}"})


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



class CompressSummary(unittest.TestCase):
    def run_summary(self, samples, *args):
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write("\n".join(json.dumps(s) for s in samples) + "\n")
        out = io.StringIO()
        try:
            with redirect_stdout(out):
                rc = compress_summary.main(["compress_summary.py", f.name, *args])
        finally:
            os.remove(f.name)
        return rc, out.getvalue()

    def test_medians_paired_ratios_and_targets(self):
        key = {"layout": "4x1", "rate": "1gbit", "delay": "0", "coll": "allreduce"}
        samples = []
        # off busbw 0.10, 0.12, 0.08; bf16 pairs 2.0x, 1.5x, 2.5x; int8 3.0x each; 64 KiB too
        for rep, (off, x) in enumerate([(0.10, 2.0), (0.12, 1.5), (0.08, 2.5)]):
            for size in (65536, 1 << 20):
                for tool, pair, bw in [("off", "bf16", off), ("compress:bf16", "bf16", off * x),
                                       ("off", "int8", off), ("compress:int8", "int8", off * 3)]:
                    s = dict(key, tool=tool, rep=rep, size=size, time_us=1000 / bw, busbw=bw,
                             pair=pair)
                    if tool.startswith("compress:"):
                        s["error"] = 0.004 if pair == "int8" else 0.002
                    samples.append(s)
        # a row of the plain benchmark in the same file is left out
        samples.append(dict(key, tool="auto", rep=0, size=65536, time_us=1.0, busbw=1.0))
        rc, text = self.run_summary(samples)
        self.assertEqual(rc, 0)
        self.assertIn("## 4x1, 1gbit, delay 0, allreduce", text)
        row = [ln for ln in text.splitlines() if ln.strip().startswith("1048576")][0]
        cells = row.replace("|", " ").split()
        # size, off us, off GB/s, bf16 us, GB/s, x, int8 us, GB/s, x
        self.assertEqual(cells[0], "1048576")
        self.assertEqual(cells[1], "10000.0")     # median of 10000, 8333.3, 12500
        self.assertEqual(cells[2], "0.100")
        self.assertEqual(cells[5], "2.00")        # median of the paired ratios 2.0, 1.5, 2.5
        self.assertEqual(cells[8], "3.00")
        self.assertIn("bf16: largest error (max |compressed - uncompressed| / amax) 2.000e-03", text)
        self.assertIn("target: bf16 x >= 1.8 from 1048576 B: 1 of 1 points", text)
        self.assertIn("target: int8 x >= 3.0 from 1048576 B: 1 of 1 points", text)
        rc, text = self.run_summary(samples, "--from", "65536")
        self.assertIn("target: bf16 x >= 1.8 from 65536 B: 2 of 2 points", text)

    def test_a_missed_target_counts_as_missed(self):
        key = {"layout": "2x2", "rate": "1gbit", "delay": "0", "coll": "allreduce"}
        samples = [dict(key, tool=t, rep=0, size=1 << 20, time_us=1.0, busbw=bw, pair="int8")
                   for t, bw in [("off", 0.1), ("compress:int8", 0.2)]]
        rc, text = self.run_summary(samples)
        self.assertEqual(rc, 0)
        self.assertIn("target: int8 x >= 3.0 from 1048576 B: 0 of 1 points", text)

    def test_no_compressed_samples_is_an_error(self):
        rc, _ = self.run_summary([{"layout": "2x2", "delay": "0", "coll": "allreduce",
                                   "tool": "auto", "rep": 0, "size": 1, "time_us": 1.0,
                                   "busbw": 1.0}])
        self.assertEqual(rc, 1)


class Scripts(unittest.TestCase):
    """The benchmark scripts parse, and --help prints their usage without root or a build."""

    SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def test_syntax_and_help(self):
        for name, usage in [("bench-compress.sh", "--formats"),
                            ("bench-multihost.sh", "--compress")]:
            path = os.path.join(self.SCRIPTS, name)
            r = subprocess.run(["bash", "-n", path], capture_output=True, text=True, timeout=30,
                               check=False)
            self.assertEqual(r.returncode, 0, f"{name}: {r.stderr}")
            r = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=30,
                               check=False)
            self.assertEqual(r.returncode, 0, f"{name} --help: {r.stderr}")
            self.assertIn(usage, r.stdout)
            self.assertNotIn("set -uo pipefail", r.stdout, f"{name} --help prints code")

    def test_bad_arguments_are_refused_by_name(self):
        path = os.path.join(self.SCRIPTS, "bench-compress.sh")
        r = subprocess.run([path, "--only", "medium"], capture_output=True, text=True,
                           timeout=30, check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--only", r.stderr)
        r = subprocess.run([path, "--bogus"], capture_output=True, text=True, timeout=30,
                           check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--bogus", r.stderr)


if __name__ == "__main__":
    unittest.main()
