"""Unit tests of scripts/benchsum.py: the pieces (medians, round-trip classes, modes, pairs) and
the whole summary of a synthetic result directory, through bench-coll.sh's BENCH_RESUMMARIZE,
against the tables the awk version printed for it (bench_coll_summary.expected); likewise the
tables of bench-collnet.sh and bench-p2p.sh from synthetic samples (bench_*.expected)."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import benchsum  # noqa: E402
import synthetic_bench  # noqa: E402


class AbTable(unittest.TestCase):
    def test_medians_per_build_and_the_median_of_ratios_within_repetitions(self):
        rows = [
            "A shm 2 allreduce 8 1 2.0", "B shm 2 allreduce 8 1 3.0",
            "A shm 2 allreduce 8 2 4.0", "B shm 2 allreduce 8 2 4.0",
            "B shm 2 allreduce 8 3 9.0",  # no A in repetition 3: no ratio
            "A net 4 allgather 65536 1 10.0", "B net 4 allgather 65536 1 5.0",
            "junk line",
        ]
        out = benchsum.ab_table([r.split() for r in rows])
        self.assertEqual(len(out), 3)
        net, shm = out[1].split(), out[2].split()
        self.assertEqual(net, ["net", "4", "allgather", "65536", "10.00", "5.00", "0.500", "1"])
        # A: median of 2, 4 = 3; B: median of 3, 4, 9 = 4; ratios 1.5 and 1.0 -> 1.25.
        self.assertEqual(shm, ["shm", "2", "allreduce", "8", "3.00", "4.00", "1.250", "2"])


class Pieces(unittest.TestCase):
    def test_median_of_odd_and_even_counts(self):
        self.assertEqual(benchsum.median([1.0]), 1.0)
        self.assertEqual(benchsum.median([1.0, 2.0, 9.0]), 2.0)
        self.assertEqual(benchsum.median([1.0, 2.0, 4.0, 9.0]), 3.0)

    def test_round_trips_fall_into_classes_split_at_one_and_a_half_times(self):
        lines = ["c 2 shm ours 1 30 31", "c 2 shm ompi 1 62 75", "c 2 shm ours 2 310 -"]
        self.assertEqual(benchsum.rtt_classes(lines), ["30-31", "62-75", "310-310"])
        self.assertEqual(benchsum.rtt_classes([]), [])

    def test_a_run_mode_is_the_class_of_both_probes(self):
        classes = ["30-31", "62-75", "310-345"]
        self.assertEqual(benchsum.run_mode("62", "75", classes), "62-75 ns")
        self.assertEqual(benchsum.run_mode("62", "310", classes), "changed")
        self.assertEqual(benchsum.run_mode("-", "310", classes), "-")
        self.assertEqual(benchsum.run_mode("62", "75", []), "-")

    def test_pairs_are_ratios_within_a_repetition(self):
        rows = [["c", "2", "shm", "8", w, "time", t, rep]
                for w, t, rep in [("ours", "2", "1"), ("ompi", "4", "1"), ("ours", "9", "2"),
                                  ("ompi", "3", "2"), ("ours", "5", "3")]]
        modes = [["c", "2", "shm", w, rep, "30", "31" if rep == "1" else "300"]
                 for w in ("ours", "ompi") for rep in ("1", "2")]
        t = benchsum.Table(rows, modes, ["30-31", "300-300"])
        self.assertEqual(t.pair(8, "time", False), ("1.75", 2))  # median of 0.5 and 3.0
        self.assertEqual(t.pair(8, "time", True), ("0.50", 1))  # rep 2 changed mode
        self.assertEqual(t.med[(8, "ours", "time")], 5.0)
        self.assertEqual(t.cnt[(8, "ours", "time")], 3)


class Resummarize(unittest.TestCase):
    def test_bench_coll_prints_the_same_tables_as_before(self):
        with open(os.path.join(HERE, "bench_coll_summary.expected"), encoding="utf-8") as f:
            want = f.read()
        with tempfile.TemporaryDirectory() as d:
            synthetic_bench.write(d)
            env = dict(os.environ, BENCH_RESUMMARIZE=d, BENCH_COLLS=synthetic_bench.COLLS,
                       BENCH_RANKS=synthetic_bench.RANKS,
                       BENCH_TRANSPORTS=synthetic_bench.TRANSPORTS)
            script = os.path.join(os.path.dirname(HERE), "bench-coll.sh")
            r = subprocess.run(["bash", script], env=env, capture_output=True, text=True,
                               timeout=120, check=False)
            self.assertEqual(r.returncode, 0, r.stderr)
            got = r.stdout.replace(d.rstrip("/"), "/tmp/synth")
            lines = got.splitlines(keepends=True)
            self.assertRegex(lines[-1], r"^# total \d+ s; raw logs: /tmp/synth/$")
            self.assertEqual("".join(lines[:-1]), want)
            with open(os.path.join(d, "summary.txt"), encoding="utf-8") as f:
                self.assertEqual(f.read().replace(d.rstrip("/"), "/tmp/synth"), got)
            with open(os.path.join(d, "targets.txt"), encoding="utf-8") as f:
                self.assertEqual(len(f.readlines()), 7, "a line per table with a common size")

    def test_a_table_without_samples_does_not_stop_the_summary(self):
        with tempfile.TemporaryDirectory() as d:
            synthetic_bench.write(d)
            lines = benchsum.coll_summary(d, "auto", ["allreduce", "alltoall"], ["2"], ["shm"])
            self.assertIn("## alltoall, 2 ranks, shm: medians over 5 repetition(s); ours = "
                          "fabricoll-perf --algo auto (shm), OMPI = btl self,vader", lines)
            self.assertIn("   (no size reported by both)", lines)
            self.assertTrue(lines[-2].startswith("# target, shm: "), lines[-2])



def expected(name):
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        return f.read().splitlines()


class OtherBenches(unittest.TestCase):
    def test_collnet_tables_are_the_awk_ones(self):
        samples = [line.split() for line in synthetic_bench.collnet_samples()]
        got = []
        for tr in ("shm", "tcp"):
            for r in ("2", "4"):
                got += benchsum.collnet_table(samples, r, tr)
        self.assertEqual(got, expected("bench_collnet_tables.expected"))
        self.assertTrue(any(line.endswith("WRONG RESULTS (3)") for line in got))

    def test_p2p_table_is_the_awk_one(self):
        samples = [line.split() for line in synthetic_bench.p2p_samples()]
        self.assertEqual(benchsum.p2p_table(samples), expected("bench_p2p_table.expected"))

    def test_megabytes_keep_three_significant_digits_or_more(self):
        table = benchsum.p2p_table([["8", "raw_pp", "1.23456"], ["8", "plug_pp", "45.678"],
                                    ["8", "plug_st", "456.78"]])
        self.assertIn("1.235", table[2])
        self.assertIn("45.68", table[2])
        self.assertIn("456.8", table[2])


if __name__ == "__main__":
    unittest.main()
