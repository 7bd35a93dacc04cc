"""The Open MPI collective baseline (scripts/baselines/mpi_coll_bench.c) and its runner
(scripts/baselines/run-mpi.sh), at CI size: built with Open MPI's mpicc, run by the runner for
2 ranks over shared memory (btl self,vader) at one size, every collective checked element by
element (-c 1). Needs openmpi-bin and libopenmpi-dev (scripts/deps.sh); without them the test
is skipped, which fails under FABRICOLL_TEST_STRICT=1 (scripts/test.sh sets it)."""
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASELINES = os.path.join(REPO, "scripts", "baselines")
# Generous: a build and two short MPI jobs take seconds; this only stops a hung job.
DEADLINE_S = 300
SIZE = 4096


def _harness():
    """python/tests/harness.py (its strict skip), loaded by path: `tests` names this folder's
    package for the other scripts tests."""
    spec = importlib.util.spec_from_file_location(
        "fabricoll_test_harness", os.path.join(REPO, "python", "tests", "harness.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


harness = _harness()


def missing_open_mpi():
    """Why Open MPI's compiler or launcher cannot be used here, or None."""
    for tool in ("mpicc.openmpi", "mpirun.openmpi"):
        if shutil.which(tool) is None:
            return f"{tool} not found (scripts/deps.sh installs openmpi-bin and libopenmpi-dev)"
    try:
        inc = subprocess.run(["mpicc.openmpi", "--showme:incdirs"], capture_output=True,
                             text=True, timeout=60, check=False).stdout.split()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"mpicc.openmpi --showme:incdirs failed: {e}"
    if not any(os.path.exists(os.path.join(d, "mpi.h")) for d in inc):
        return "Open MPI's mpi.h is missing (package libopenmpi-dev; scripts/deps.sh installs it)"
    return None


def tables(text):
    """{collective: (busbw factor, [row dicts])} from mpi_coll_bench's output."""
    out, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"# op=(\w+) busbw factor=([0-9.]+) ", line)
        if m:
            cur = out.setdefault(m.group(1), (float(m.group(2)), []))
            continue
        f = line.split()
        if cur is not None and len(f) == 10 and f[0].isdigit():
            cur[1].append(dict(size=int(f[0]), count=int(f[1]), type=f[2], redop=f[3],
                               iters=int(f[4]), time=float(f[5]), tmin=float(f[6]),
                               algbw=float(f[7]), busbw=float(f[8]), wrong=int(f[9])))
    return out


class OpenMpiBaseline(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.why_not = missing_open_mpi()
        cls.tmp = tempfile.mkdtemp(prefix="fabricoll-mpi-baseline-")
        cls.env = dict(os.environ, BASELINE_BUILD=os.path.join(cls.tmp, "build"),
                       OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        if self.why_not:
            harness.skip(self.id(), self.why_not, stage="py-tests")

    def test_runner_two_ranks_one_size_every_collective_correct(self):
        out = os.path.join(self.tmp, "out")
        env = dict(self.env, OUT=out, CONFIGS="ompi-vader", NPS="2", REPS="2", T="0.01",
                   MIN_BYTES=str(SIZE), MAX_BYTES=str(SIZE), QUIET="0",
                   RUN_TIMEOUT=str(DEADLINE_S))
        r = subprocess.run([os.path.join(BASELINES, "run-mpi.sh")], env=env, cwd=self.tmp,
                           capture_output=True, text=True, timeout=DEADLINE_S + 60, check=False)
        path = os.path.join(out, "ompi-vader_np2.txt")
        text = ""
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                text = f.read()
        self.assertEqual(r.returncode, 0, f"run-mpi.sh failed:\n{r.stdout}{r.stderr}\n{text}")
        self.assertIn("# mpi_coll_bench nranks=2 ", text)
        self.assertIn("Open MPI", text)
        got = tables(text)
        self.assertEqual(sorted(got), ["allgather", "allreduce", "reducescatter"], text)
        for coll, (factor, rows) in got.items():
            # nccl-tests' bus bandwidth factors at 2 ranks: 2(n-1)/n and (n-1)/n
            self.assertAlmostEqual(factor, 1.0 if coll == "allreduce" else 0.5, places=4)
            self.assertEqual(len(rows), 1, (coll, text))
            row = rows[0]
            self.assertEqual((row["size"], row["type"], row["redop"]), (SIZE, "float", "sum"))
            # the count column: AllReduce's buffer, AllGather's output, ReduceScatter's input
            self.assertEqual(row["count"], SIZE // 4, coll)
            self.assertEqual(row["wrong"], 0, (coll, text))
            self.assertTrue(5 <= row["iters"] <= 1000, (coll, row))
            self.assertGreater(row["time"], 0, (coll, row))
            self.assertLessEqual(row["tmin"], row["time"], (coll, row))
            algbw = SIZE / row["time"] / 1e3
            self.assertAlmostEqual(row["algbw"], algbw, delta=1e-3 + 0.02 * algbw)
            self.assertAlmostEqual(row["busbw"], row["algbw"] * factor, delta=2e-3)

    def test_a_bad_option_is_named_and_exits_2(self):
        build = self.env["BASELINE_BUILD"]
        binary = os.path.join(build, "mpi_coll_bench.openmpi")
        if not os.path.exists(binary):
            b = subprocess.run([os.path.join(BASELINES, "build.sh")], env=self.env,
                               capture_output=True, text=True, timeout=DEADLINE_S, check=False)
            self.assertEqual(b.returncode, 0, b.stdout + b.stderr)
        r = subprocess.run(["mpirun.openmpi", "--oversubscribe", "--allow-run-as-root",
                            "--mca", "oob_tcp_if_include", "lo", "-np", "2",
                            "--mca", "btl", "self,vader", binary, "-f", "1"],
                           env=self.env, capture_output=True, text=True, timeout=DEADLINE_S,
                           check=False)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("mpi_coll_bench: -f: FACTOR must be above 1", r.stderr)


if __name__ == "__main__":
    unittest.main()
