"""Spawn a job's ranks as subprocesses, bound them by a hard timeout, collect per-rank results.

Each rank runs `python -m tests.rank_main MODULE OUTDIR ARGS_JSON` (MODULE: tests.ranks.JOB
unless the caller names another) with RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and a free MASTER_PORT set, and writes
OUTDIR/rank<r>.json (tests.rank_main). Its output goes to OUTDIR/rank<r>.log. OUTDIR is
$CARGO_TARGET_DIR/torch-tests/<tag> unless the caller names another (kept, for the logs).
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time

from tests import harness


def free_port():
    """A TCP port on the loopback interface that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JobResult:
    """What a job's ranks left: exit codes, their JSON results, log paths, timing."""

    def __init__(self, tag, outdir, rcs, results, timed_out, elapsed):
        self.tag, self.outdir, self.rcs, self.results = tag, outdir, rcs, results
        self.timed_out, self.elapsed = timed_out, elapsed

    def log(self, rank):
        return os.path.join(self.outdir, f"rank{rank}.log")

    def log_tail(self, rank, chars=3000):
        try:
            with open(self.log(rank), encoding="utf-8", errors="replace") as f:
                return f.read()[-chars:]
        except OSError as e:
            return f"(no log: {e})"

    def describe(self):
        """A failure message: each rank's exit code and the tail of every failed rank's log."""
        lines = [f"job {self.tag}: exit codes {self.rcs}"
                 + (" (TIMED OUT, killed)" if self.timed_out else "")
                 + f" after {self.elapsed:.1f}s; logs in {self.outdir}"]
        for r, rc in enumerate(self.rcs):
            if rc != 0 or self.results[r] is None:
                lines.append(f"--- rank {r} (exit {rc}) log tail ---\n{self.log_tail(r)}")
        return "\n".join(lines)


def launch(job, nranks, tag, env=None, args=None, timeout=180, module=None, outdir=None):
    """Run `job` on `nranks` ranks; kill them all after `timeout` seconds. Returns a JobResult."""
    outdir = outdir or os.path.join(harness.target_dir(), "torch-tests", tag)
    os.makedirs(outdir, exist_ok=True)
    for name in os.listdir(outdir):
        os.remove(os.path.join(outdir, name))
    port = free_port()
    base = dict(os.environ)
    # the caller's choices of fabric must not leak into a case that sets its own
    for k in ("FABRICOLL_PROVIDER", "FABRICOLL_INTRA_PROVIDER", "FABRICOLL_DOMAIN"):
        base.pop(k, None)
    base.update({
        "WORLD_SIZE": str(nranks), "LOCAL_WORLD_SIZE": str(nranks),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "PYTHONPATH": harness.PY_DIR + os.pathsep + base.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": base.get("OMP_NUM_THREADS", "1"),
        "FABRICOLL_TEST_BACKEND": harness.BACKEND,
        "PYTHONUNBUFFERED": "1",
    })
    extra = dict(env or {})
    # the package and the tests stay importable whatever path the caller adds
    base["PYTHONPATH"] = os.pathsep.join(
        p for p in (harness.PY_DIR, extra.pop("PYTHONPATH", ""), base["PYTHONPATH"]) if p)
    base.update(extra)
    argv = [sys.executable, "-m", "tests.rank_main", module or f"tests.ranks.{job}", outdir,
            json.dumps(args or {})]
    procs, logs = [], []
    t0 = time.monotonic()
    for r in range(nranks):
        e = dict(base, RANK=str(r), LOCAL_RANK=str(r))
        log = open(os.path.join(outdir, f"rank{r}.log"), "w", encoding="utf-8")
        logs.append(log)
        procs.append(subprocess.Popen(argv, env=e, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True,
                                      cwd=harness.REPO))
    deadline = t0 + timeout
    timed_out = False
    while any(p.poll() is None for p in procs):
        if time.monotonic() > deadline:
            timed_out = True
            break
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            # each rank leads its own session: its group holds it and anything it started
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait()
    for log in logs:
        log.close()
    results = []
    for r in range(nranks):
        try:
            with open(os.path.join(outdir, f"rank{r}.json"), encoding="utf-8") as f:
                results.append(json.load(f))
        except (OSError, ValueError):
            results.append(None)
    return JobResult(tag, outdir, [p.returncode for p in procs], results, timed_out,
                     time.monotonic() - t0)
