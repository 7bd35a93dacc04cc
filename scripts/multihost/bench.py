#!/usr/bin/env python3
"""The multi-host benchmark's runs (scripts/bench-multihost.sh): per layout and link delay, at a
shaped rate, every forced algorithm, auto, auto over one fabric (FABRICOLL_INTRA_PROVIDER=same,
at 2x2) and Open MPI, on the same emulated hosts, the tools in a rotating order in each
repetition. Each run appends its rows to DIR/samples.jsonl:
  {"layout", "delay", "coll", "tool", "rep", "size", "time_us", "busbw"}
(tool: auto, auto-same, algo:<name>, ompi). scripts/multihost/summary.py makes the tables.

--compress FMTS (scripts/bench-compress.sh) runs instead, per repetition and format, auto
uncompressed ("off") and auto with `fabricoll-perf --compress FMT` back to back, the pair's order
and the formats' order turning from one repetition to the next; their rows add "rate", "pair"
(the format the run is paired with) and, compressed, "error" (fabricoll-perf's error column).
scripts/multihost/compress_summary.py makes those tables.

--algos keeps only the named forced algorithms, --no-auto leaves auto and auto-same out, and
--calibrate adds, per layout, delay and repetition, one short run of auto with FABRICOLL_LOG=info
whose calibration line ("calibration on N ranks ...", rank 0's) goes to DIR/calibrations.jsonl:
  {"layout", "delay", "rate", "rep", "line", "disturbed"}
(the simulator's validation, scripts/multihost/simval.py, takes its parameters from them).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cluster import REPO, Cluster, Job, launcher_env, placement  # noqa: E402
from coll_tests import implemented_pairs  # noqa: E402

COLLS = ("allreduce", "allgather", "reducescatter")
# fabricoll-perf --compress's formats (compress::NAMES without off)
FORMATS = ("bf16", "fp16", "fp8e4m3", "fp8e5m2", "int8", "int4")
# mpi_coll_bench rows: size count type redop iters time tmin algbw busbw #wrong
# fabricoll-perf rows: size count type redop algo time algbw busbw #wrong
COLUMNS = {"ompi": (5, 8), "perf": (5, 7)}


def rows(text, kind):
    """(size, time us, busbw GB/s) of each table row in `text`."""
    ti, bi = COLUMNS[kind]
    out = []
    for line in text.splitlines():
        w = line.split()
        if len(w) > bi and w[0].isdigit():
            try:
                out.append((int(w[0]), float(w[ti]), float(w[bi])))
            except ValueError:
                continue
    return out


def errors(text):
    """{size: error} of the rows of `fabricoll-perf --compress` (the column after #wrong)."""
    out = {}
    for line in text.splitlines():
        w = line.split()
        if len(w) > 9 and w[0].isdigit():
            try:
                out[int(w[0])] = float(w[9])
            except ValueError:
                continue
    return out


def compress_order(formats, rep):
    """The runs of one repetition of --compress: (tool, format paired with) for each format,
    "off" and the format back to back; the formats' order turns with `rep`, and odd
    repetitions run the compressed call of each pair first."""
    k = rep % len(formats)
    out = []
    for fmt in formats[k:] + formats[:k]:
        pair = [("off", fmt), (f"compress:{fmt}", fmt)]
        out += pair[::-1] if rep % 2 else pair
    return out


def calibration_lines(text):
    """The calibration a rank logged with FABRICOLL_LOG=info: (its line from "calibration on",
    whether a warning said the measurement looked disturbed), or None when it logged none."""
    line, disturbed = None, False
    for ln in text.splitlines():
        at = ln.find("calibration on ")
        if at < 0:
            continue
        if "looks disturbed" in ln:
            disturbed = True
        elif re.search(r"gamma [0-9.]+ GB/s", ln):
            line = ln[at:].strip()
    return None if line is None else (line, disturbed)


def layout_of(name):
    """'2x4' -> [4, 4] (hosts x ranks per host); '3+2+1' -> [3, 2, 1]."""
    if "x" in name:
        hosts, per = name.split("x")
        return [int(per)] * int(hosts)
    return [int(n) for n in name.split("+")]


class Bench:
    def __init__(self, a):
        self.a = a
        self.perf = os.path.abspath(a.perf)
        self.port = 21000
        self.out = open(os.path.join(a.dir, "samples.jsonl"), "a", encoding="utf-8")
        self.cals = open(os.path.join(a.dir, "calibrations.jsonl"), "a", encoding="utf-8") \
            if a.calibrate else None
        self.logdir = os.path.join(a.dir, "logs")
        os.makedirs(self.logdir, exist_ok=True)
        info = os.path.join(os.path.dirname(self.perf), "fabricoll-info")
        listing = subprocess.run([info, "--algorithms"], capture_output=True, text=True,
                                 timeout=60, check=True).stdout
        algos = [ln.split()[0] for ln in listing.splitlines() if ln.split()]
        if a.algos:
            unknown = [x for x in a.algos if x not in algos]
            if unknown:
                raise ValueError(f"--algos: {unknown} not among the library's {algos}")
            algos = [x for x in algos if x in a.algos]
        self.algos = {c: [x for x, cc in implemented_pairs(listing, algos, [c])]
                      for c in a.colls}
        self.failures = 0
        self.last_errors = {}

    def record(self, key, tool, rep, got, extra=None):
        """Appends one run's rows; `extra` (a dict) adds "pair", and "error" per size."""
        extra = extra or {}
        errs = extra.get("error", {})
        for size, t, bw in got:
            row = dict(key, tool=tool, rep=rep, size=size, time_us=t, busbw=bw)
            if "pair" in extra:
                row["pair"] = extra["pair"]
            if size in errs:
                row["error"] = errs[size]
            self.out.write(json.dumps(row) + "\n")
        self.out.flush()

    def size_args(self):
        return ["-b", self.a.min, "-e", self.a.max, "-f", str(self.a.factor), "-w", "1",
                "-t", str(self.a.seconds), "-m", "3", "-n", "200"]

    def run_ours(self, c, hosts_of, coll, tool, name):
        self.port += 2
        env = {"FABRICOLL_PROVIDER": self.a.provider, "FABRICOLL_TIMEOUT_MS": "60000"}
        # The caller's own settings (FABRICOLL_LOG, FABRICOLL_ALGO, ...) reach the ranks too.
        env.update({k: v for k, v in os.environ.items()
                    if k.startswith("FABRICOLL_") and k not in env})
        algo = "auto"
        if tool.startswith("algo:"):
            algo = tool[5:]
        if tool == "auto-same":
            env["FABRICOLL_INTRA_PROVIDER"] = "same"
        sizes = self.size_args()
        if tool.startswith("compress:"):
            sizes += ["--compress", tool[9:]]
        if tool == "calib":
            # the communicator calibrates at creation; one tiny size is enough to create it. No
            # calibration cache: each run measures the links as they are shaped now.
            env.update({"FABRICOLL_LOG": "info", "FABRICOLL_CALIBRATION_CACHE": "0"})
            sizes = ["-b", "16", "-e", "16", "-w", "1", "-n", "1"]
        argv = [self.perf, "--coll", coll, "--algo", algo, "-c", "0"] + sizes
        envs = [dict(env, **launcher_env("torchrun", r, hosts_of, c.addr(1), self.port))
                for r in range(len(hosts_of))]
        job = Job(c, hosts_of, argv, envs, self.logdir, name)
        if not job.wait(self.a.run_timeout) or any(job.rcs()):
            print(f"bench: {name} failed (statuses {job.rcs()}); log {job.logs[0]}", flush=True)
            self.failures += 1
            return []
        if tool == "calib":
            return calibration_lines(job.text(0))
        self.last_errors = errors(job.text(0)) if tool.startswith("compress:") else {}
        return rows(job.text(0), "perf")

    def calibrate(self, c, hosts_of, lname, delay):
        """The --calibrate runs of one layout and delay: their lines to calibrations.jsonl."""
        for rep in range(self.a.reps):
            name = f"{lname}-{delay}-calib-{rep}"
            got = self.run_ours(c, hosts_of, self.a.colls[0], "calib", name)
            if got == []:
                continue
            if got is None:
                print(f"bench: {name} logged no calibration line; log {self.logdir}/{name}.r0.log",
                      flush=True)
                self.failures += 1
                continue
            self.cals.write(json.dumps({"layout": lname, "delay": delay, "rate": self.a.rate,
                                        "rep": rep, "line": got[0], "disturbed": got[1]}) + "\n")
            self.cals.flush()

    def run_ompi(self, c, layout, coll, name):
        hosts = ",".join(f"{c.addr(h + 1)}:{n}" for h, n in enumerate(layout))
        argv = ["env", f"NETNS_PREFIX={c.prefix}", "mpirun.openmpi", "--allow-run-as-root",
                "--oversubscribe", "--bind-to", "none",
                "--mca", "plm_rsh_agent", os.path.join(REPO, "scripts", "netns-rsh.sh"),
                "--mca", "plm_rsh_no_tree_spawn", "1", "--mca", "oob_tcp_if_include", "ccl0",
                "--mca", "btl_tcp_if_include", "ccl0", "--mca", "pml", "ob1",
                "--mca", "btl", "self,vader,tcp", "--mca", "mpi_yield_when_idle", "1",
                "-H", hosts, "-np", str(sum(layout)), self.a.mpi_bench, "-o", coll,
                "-b", self.a.min, "-e", self.a.max, "-f", str(self.a.factor), "-w", "1",
                "-t", str(self.a.seconds), "-m", "3", "-n", "200", "-c", "0", "-r", "1"]
        log = os.path.join(self.logdir, name + ".log")
        with open(log, "w", encoding="utf-8") as f:
            p = c.popen(1, argv, dict(os.environ), f)
            try:
                rc = p.wait(timeout=self.a.run_timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()
                rc = None
        with open(log, encoding="utf-8", errors="replace") as f:
            text = f.read()
        if rc != 0:
            print(f"bench: {name} failed (status {rc}); log {log}", flush=True)
            self.failures += 1
            return []
        return rows(text, "ompi")

    def run_compress(self, c, hosts_of, lname, delay, t0):
        """--compress: per collective and repetition, each format's pair of runs."""
        for coll in self.a.colls:
            key = {"layout": lname, "rate": self.a.rate, "delay": delay, "coll": coll}
            for rep in range(self.a.reps):
                for tool, fmt in compress_order(self.a.compress, rep):
                    name = f"{lname}-{self.a.rate}-{delay}-{coll}-{tool.replace(':', '-')}-{rep}"
                    if tool == "off":
                        name += f"-{fmt}"
                    got = self.run_ours(c, hosts_of, coll, tool, name)
                    self.record(key, tool, rep, got, {"pair": fmt, "error": self.last_errors})
            print(f"bench: {lname} rate {self.a.rate} delay {delay} {coll}: off and "
                  f"{','.join(self.a.compress)} x {self.a.reps} reps, "
                  f"{time.monotonic() - t0:.0f}s so far", flush=True)

    def run(self):
        t0 = time.monotonic()
        for li, lname in enumerate(self.a.layouts):
            layout = layout_of(lname)
            c = Cluster(f"{self.a.prefix}{chr(ord('a') + li % 26)}", len(layout),
                        rate=self.a.rate, owner=self.a.owner)
            c.up()
            try:
                hosts_of = placement(layout)
                for delay in self.a.delays:
                    c.reshape(self.a.rate, delay)
                    if self.cals:
                        self.calibrate(c, hosts_of, lname, delay)
                    if self.a.compress:
                        self.run_compress(c, hosts_of, lname, delay, t0)
                        continue
                    for coll in self.a.colls:
                        tools = [] if self.a.no_auto else ["auto"]
                        tools += [f"algo:{x}" for x in self.algos[coll]]
                        if lname == "2x2" and not self.a.no_auto:
                            tools.append("auto-same")
                        if not tools:
                            continue
                        if self.a.mpi_bench:
                            tools.append("ompi")
                        key = {"layout": lname, "delay": delay, "coll": coll}
                        for rep in range(self.a.reps):
                            # a rotating order: no tool always runs first or after another
                            k = rep % len(tools)
                            for tool in tools[k:] + tools[:k]:
                                name = f"{lname}-{delay}-{coll}-{tool.replace(':', '-')}-{rep}"
                                got = self.run_ompi(c, layout, coll, name) if tool == "ompi" \
                                    else self.run_ours(c, hosts_of, coll, tool, name)
                                self.record(key, tool, rep, got)
                        print(f"bench: {lname} delay {delay} {coll}: {len(tools)} tools x "
                              f"{self.a.reps} reps, {time.monotonic() - t0:.0f}s so far",
                              flush=True)
            finally:
                c.down()
        self.out.close()
        if self.cals:
            self.cals.close()
        print(f"bench: {time.monotonic() - t0:.0f}s, {self.failures} failed runs")
        return 1 if self.failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    p.add_argument("--dir", required=True)
    p.add_argument("--perf", required=True)
    p.add_argument("--mpi-bench", default="")
    p.add_argument("--layouts", default="2x2,4x1,2x4")
    p.add_argument("--delays", default="0,100us,1ms")
    p.add_argument("--colls", default=",".join(COLLS))
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--provider", default="net")
    p.add_argument("--min", default="16")
    p.add_argument("--max", default="64M")
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--seconds", type=float, default=0.3)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--run-timeout", type=float, default=900)
    p.add_argument("--algos", default="", help="only these forced algorithms (default all)")
    p.add_argument("--no-auto", action="store_true", help="leave auto and auto-same out")
    p.add_argument("--calibrate", action="store_true",
                   help="log each layout's and delay's calibration to calibrations.jsonl")
    p.add_argument("--compress", default="",
                   help=f"compressed against uncompressed auto, these formats ({','.join(FORMATS)})")
    p.add_argument("--prefix", required=True)
    p.add_argument("--owner", required=True)
    a = p.parse_args()
    for name in ("layouts", "delays", "colls", "algos", "compress"):
        setattr(a, name, [x for x in getattr(a, name).split(",") if x])
    bad = [c for c in a.colls if c not in COLLS]
    if bad:
        p.error(f"--colls: {bad} not among {COLLS}")
    bad = [f for f in a.compress if f not in FORMATS]
    if bad:
        p.error(f"--compress: {bad} not among {FORMATS}")
    for lname in a.layouts:
        try:
            layout_of(lname)
        except ValueError:
            p.error(f"--layouts: {lname!r} is not HOSTSxRANKS or N+N+...")
    if a.reps < 1:
        p.error("--reps must be at least 1")
    try:
        bench = Bench(a)
    except ValueError as e:
        p.error(str(e))
    return bench.run()


if __name__ == "__main__":
    sys.exit(main())
