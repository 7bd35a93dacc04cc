#!/usr/bin/env python3
"""The emulated-hosts stage (scripts/multihost-tests.sh): fabricoll-perf ranks, one process per
rank, inside network namespaces joined by a bridge (scripts/netns-cluster.sh), each host with its
own hostname. The ranks of one host use the intra-host provider (shm by default), the hosts the
network provider (FABRICOLL_PROVIDER). Checks, each a line PASS / FAIL with its reason:

  matrix    every algorithm x collective (`fabricoll-info --algorithms`, plus auto) with -c 1
            (every element checked) on 2 hosts x 2 ranks over net and tcp, and on 3 hosts with
            3+2+1 ranks and 4 hosts x 1 over one of them in rotation (MH_FULL=1: both); a few
            cases with the ranks placed cyclically (rank r on host r mod K), and at 2x2 a few
            over one fabric (FABRICOLL_INTRA_PROVIDER=same); torchrun variables
  intra     ranks of one host exchange nothing over TCP: while a run goes, `ss` in each host
            shows no established connection between two of its own addresses (bootstrap's
            port excepted), and some connection between hosts (the sampling works)
  kill      a rank SIGKILLed on host 2 makes every other rank fail well before the deadline
            (FABRICOLL_TIMEOUT_MS=60000; within a third of it): its ring neighbour sees it
            gone, the others hear it from the ranks that failed
  mismatch  one rank FABRICOLL_PROVIDER=tcp, the others net: every rank fails fast, naming a
            rank and the provider
  launcher  Open MPI (FABRICOLL_ROOT), Hydra (FABRICOLL_ROOT_FILE), Slurm (both), torchrun, and
            the unique-id route (`fabricoll-info --unique-id --ranks N` in host 1)
  nics      hosts with two interfaces and FABRICOLL_DOMAIN=ccl0,ccl1: the ranks of a host
            together use both (`ss` local addresses)
  simval    the simulator against a measurement (scripts/multihost/simval.py): 2 hosts x 2
            ranks at 1 Gbit/s, no delay, AllReduce of 64 KiB to 4 MiB by ring, rdh and mesh,
            medians of 3 repetitions; fabricoll-sim's geometric-mean error at most 50 %

A check that fails because a part of the library is not there yet says what it waits for.
Last line: `multihost-tests: N passed, N failed, N skipped`; exit status non-zero on a failure.

Environment: MH_PREFIX (cluster name prefix, from multihost-tests.sh), MH_FULL [0],
MH_CHECKS [matrix intra kill mismatch launcher nics simval], MH_PROVIDERS [net tcp],
MH_RUN_TIMEOUT [60] seconds per run, MH_JOBS [2] matrix runs at once, FABRICOLL_PERF /
FABRICOLL_INFO / FABRICOLL_SIM [target/release/...], FABRICOLL_TEST_STRICT (1: a check that
cannot run fails),
MH_LOGDIR [$CARGO_TARGET_DIR/multihost-tests/<date>-<pid>].
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench  # noqa: E402
import simval  # noqa: E402
from cluster import REPO, Cluster, Job, base_env, launcher_env, placement  # noqa: E402
from coll_tests import implemented_pairs  # noqa: E402

ALGOS = "ring bidir_ring mesh mesh1 rdh rd tree dbtree bruck pairwise hier swizzle auto"
COLLS = "allreduce allgather reducescatter broadcast reduce alltoall"
LAYOUTS = {"2x2": [2, 2], "3+2+1": [3, 2, 1], "4x1": [1, 1, 1, 1]}
# What the checks need from work that lands separately: shown when such a check fails.
WAITS = {
    "two-fabric": ("src/transport/tiered.rs", "the topo helper's two-fabric transport "
                   "(FABRICOLL_INTRA_PROVIDER, hosts detected at creation)"),
    "agree": ("src/coll/agree.rs", "the topo helper's agreement on providers at creation"),
    "devices": ("src/transport/tiered.rs", "the topo helper's spreading of a host's ranks over "
                "its devices (src/transport/fabric/)"),
    "launch": ("src/coll/launch.rs", "the launch helper's launcher support (OMPI_*, PMI_*, "
               "SLURM_*, FABRICOLL_ROOT, FABRICOLL_ROOT_FILE, fabricoll-info --unique-id)"),
}
# A fixed cost model for forced algorithms: spares the calibration at start-up.
MODEL = {"FABRICOLL_ALPHA_US": "30", "FABRICOLL_BETA_GBPS": "0.5", "FABRICOLL_GAMMA_GBPS": "4"}
# The simulator's check: the bound on the geometric-mean error of its predictions. Loose on
# purpose: this stage runs on a shared, often loaded machine of few CPUs, where 4 ranks busy-poll
# 2 CPUs beside other builds and a repetition can take far longer than the link's time; the
# medians of 3 repetitions (each the mean of at least 3 iterations) take out single disturbed
# runs, not a load that lasts the whole check. docs/performance.md has the tighter figures of a
# quieter run.
SIMVAL_BOUND = 0.5


def waiting(what):
    path, who = WAITS[what]
    if os.path.exists(os.path.join(REPO, path)):
        return ""
    return f" [waiting for {who}: {path} is not in this tree]"


class Stage:
    def __init__(self):
        target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
        self.perf = os.path.abspath(os.environ.get("FABRICOLL_PERF",
                                                   f"{target}/release/fabricoll-perf"))
        self.info = os.path.abspath(os.environ.get(
            "FABRICOLL_INFO", os.path.join(os.path.dirname(self.perf), "fabricoll-info")))
        self.prefix = os.environ.get("MH_PREFIX", f"fcn{os.getpid()}")
        self.timeout = float(os.environ.get("MH_RUN_TIMEOUT", "60"))
        self.jobs = max(1, int(os.environ.get("MH_JOBS", "2")))
        self.logdir = os.environ.get("MH_LOGDIR") or os.path.join(
            target, "multihost-tests", f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        os.makedirs(self.logdir, exist_ok=True)
        if not os.environ.get("MH_LOGDIR"):
            # runs of more than a day ago are removed, so that logs do not pile up
            root = os.path.dirname(self.logdir)
            for d in os.listdir(root):
                path = os.path.join(root, d)
                if os.path.isdir(path) and time.time() - os.path.getmtime(path) > 86400:
                    shutil.rmtree(path, ignore_errors=True)
        self.sim = os.path.abspath(os.environ.get(
            "FABRICOLL_SIM", os.path.join(os.path.dirname(self.perf), "fabricoll-sim")))
        self.strict = os.environ.get("FABRICOLL_TEST_STRICT", "0") == "1"
        self.passed = self.failed = self.skipped = 0
        self.failures = []
        self.port = 20000
        self.clusters = 0

    def next_port(self):
        """A fresh MASTER_PORT per run (the root listens on it + 1): no TIME_WAIT clash."""
        self.port += 2
        return self.port

    def cluster(self, hosts, nics=1):
        self.clusters += 1
        c = Cluster(f"{self.prefix}{chr(ord('a') + self.clusters % 26)}", hosts, nics=nics,
                    owner=os.environ.get("MH_OWNER"))
        c.up()
        return c

    def result(self, ok, tag, detail, secs, job=None, why=""):
        if ok:
            self.passed += 1
            print(f"PASS {tag:<44} {detail:<28} {secs:5.1f}s", flush=True)
            return
        self.failed += 1
        self.failures.append(f"{tag}: {why}")
        print(f"FAIL {tag:<44} {detail:<28} {secs:5.1f}s  {why}")
        if job:
            for r in range(len(job.procs)):
                for ln in job.tail(r, 4):
                    print(f"     r{r} | {ln}")
            print(f"     logs: {job.logs[0].rsplit('.r0.', 1)[0]}.r*.log", flush=True)

    def skip(self, tag, why):
        """A check that cannot run here: skipped, or failed under FABRICOLL_TEST_STRICT=1."""
        if self.strict:
            self.result(False, tag, "", 0, why=f"cannot run here: {why} "
                        "(FABRICOLL_TEST_STRICT=1: a test that cannot run fails)")
            return
        self.skipped += 1
        print(f"SKIP {tag:<44} {why}", flush=True)

    def perf_args(self, coll, algo, e="64K", f="8", n="2", check="1"):
        return [self.perf, "--coll", coll, "--algo", algo, "-b", "4", "-e", e, "-f", f, "-n", n,
                "-w", "1", "-c", check]

    def start(self, c, hosts_of, argv, name, common, kind="torchrun", per_rank=None, **kw):
        port = self.next_port()
        envs = []
        for r in range(len(hosts_of)):
            env = dict(common)
            env.update(launcher_env(kind, r, hosts_of, c.addr(1), port, **kw))
            if per_rank:
                env.update(per_rank.get(r, {}))
            envs.append(env)
        return Job(c, hosts_of, argv, envs, self.logdir, name), port

    def run_ok(self, c, hosts_of, argv, name, common, tag, detail, wait_for=None, **kw):
        """Runs a job that must pass: every rank exits 0, rank 0 found no wrong element, and
        every process was one rank of this job."""
        job, _ = self.start(c, hosts_of, argv, name, common, **kw)
        return self.verdict(job, job.wait(self.timeout), tag, detail, wait_for)

    def verdict(self, job, done, tag, detail, wait_for=None):
        """Reports an ended job that must pass (see run_ok); True when it did."""
        secs = time.monotonic() - job.t0
        why = ""
        if not done:
            why = f"TIMEOUT after {self.timeout:g}s"
        elif any(job.rcs()):
            why = "exit statuses " + " ".join(str(x) for x in job.rcs())
        elif job.wrong_width():
            why = job.wrong_width()
        elif not job.checked_ok():
            why = "rank 0 did not report 0 wrong elements"
        if why and wait_for:
            why += waiting(wait_for)
        self.result(not why, tag, detail, secs, job, why)
        return not why

    def run_all_ok(self, c, runs):
        """run_ok for each of `runs` (hosts_of, argv, name, common, tag, detail), up to
        self.jobs at once on cluster `c`: a run is mostly its ranks' start, spent waiting, so
        two overlap well even on two CPUs. The runs' ports differ (next_port), and each job's
        ranks meet under their own port, so two jobs on one host never mix."""
        todo, running = list(runs), []
        while todo or running:
            while todo and len(running) < self.jobs:
                hosts_of, argv, name, common, tag, detail = todo.pop(0)
                job, _ = self.start(c, hosts_of, argv, name, common)
                running.append((job, tag, detail))
            still = []
            for job, tag, detail in running:
                if job.poll():
                    job.close()
                    self.verdict(job, True, tag, detail, "two-fabric")
                elif time.monotonic() - job.t0 >= self.timeout:
                    job.kill()
                    self.verdict(job, False, tag, detail, "two-fabric")
                else:
                    still.append((job, tag, detail))
            running = still
            if running:
                time.sleep(0.02)

    # ---- matrix ----------------------------------------------------------------------------
    def matrix(self, providers):
        out = subprocess.run([self.info, "--algorithms"], capture_output=True, text=True,
                             timeout=60, check=True).stdout
        listed = {ln.split()[0]: ln.split()[1:] for ln in out.splitlines() if ln.split()}
        algos = [a for a in ALGOS.split() if a in listed or a == "auto"]
        if set(listed.get("swizzle", [])) < {"reducescatter", "allgather"}:
            self.result(False, "matrix swizzle reducescatter+allgather", "", 0,
                        why="fabricoll-info lists swizzle with "
                        f"{listed.get('swizzle') or 'no collective'} [waiting for the algo "
                        "helper's swizzle (src/algo/swizzle.rs)]")
        todo = implemented_pairs(out, algos, COLLS.split())
        full = os.environ.get("MH_FULL", "0") == "1"
        for li, (lname, layout) in enumerate(LAYOUTS.items()):
            c = self.cluster(len(layout))
            try:
                hosts_of = placement(layout)
                runs = []
                for pi, (algo, coll) in enumerate(todo):
                    provs = providers if full or lname == "2x2" else \
                        [providers[(pi + li) % len(providers)]]
                    for prov in provs:
                        common = {"FABRICOLL_PROVIDER": prov, "FABRICOLL_TIMEOUT_MS": "20000"}
                        if algo != "auto":
                            common.update(MODEL)
                        f = "7" if pi % 3 == 1 else "8"
                        argv = self.perf_args(coll, algo, f=f)
                        if coll in ("broadcast", "reduce"):
                            argv += ["-r", str((pi + li) % len(hosts_of))]
                        runs.append((hosts_of, argv, f"{lname}-{prov}-{algo}-{coll}", common,
                                     f"matrix {lname} {prov} {algo}/{coll}", f"-f {f}"))
                self.run_all_ok(c, runs)
                if lname == "2x2":
                    # one fabric for every peer (today's behaviour, kept on request)
                    for algo, coll in (("ring", "allreduce"), ("hier", "allreduce"),
                                       ("auto", "allgather")):
                        common = {"FABRICOLL_PROVIDER": providers[0],
                                  "FABRICOLL_INTRA_PROVIDER": "same",
                                  "FABRICOLL_TIMEOUT_MS": "20000"}
                        self.run_ok(c, hosts_of, self.perf_args(coll, algo),
                                    f"same-{algo}-{coll}", common,
                                    f"matrix 2x2 {providers[0]} only {algo}/{coll}",
                                    "INTRA_PROVIDER=same")
                if lname == "3+2+1":
                    # cyclic placement: the ranks of a host are not contiguous
                    cyc = placement(layout, cyclic=True)
                    for algo, coll in (("ring", "allreduce"), ("hier", "allreduce"),
                                       ("auto", "reducescatter")):
                        common = {"FABRICOLL_PROVIDER": providers[0],
                                  "FABRICOLL_TIMEOUT_MS": "20000"}
                        self.run_ok(c, cyc, self.perf_args(coll, algo),
                                    f"cyclic-{algo}-{coll}", common,
                                    f"matrix 3+2+1 cyclic {providers[0]} {algo}/{coll}",
                                    "hosts " + "".join(map(str, cyc)), wait_for="two-fabric")
            finally:
                c.down()

    # ---- no TCP inside a host --------------------------------------------------------------
    def intra(self, prov):
        for lname in ("2x2", "3+2+1"):
            layout = LAYOUTS[lname]
            c = self.cluster(len(layout))
            try:
                hosts_of = placement(layout)
                common = {"FABRICOLL_PROVIDER": prov, "FABRICOLL_TIMEOUT_MS": "20000"}
                common.update(MODEL)
                argv = self.perf_args("allreduce", "ring", e="4M", f="4", n="10", check="0")
                job, port = self.start(c, hosts_of, argv, f"intra-{lname}", common)
                inside, across = set(), 0
                boot = {port, port + 1}

                def sample():
                    nonlocal across
                    for h in range(1, len(layout) + 1):
                        own = c.addrs(h)
                        for lip, lport, pip, pport, _ in c.ss(h):
                            if lport in boot or pport in boot:
                                continue
                            local_both = (lip in own or lip.startswith("127.")) and \
                                (pip in own or pip.startswith("127."))
                            if local_both:
                                inside.add(f"host {h}: {lip}:{lport} <-> {pip}:{pport}")
                            else:
                                across += 1
                done = job.wait(self.timeout, during=sample, every=0.1)
                secs = time.monotonic() - job.t0
                why = ""
                if not done or any(job.rcs()):
                    why = f"the run failed (statuses {job.rcs()})"
                elif inside:
                    why = (f"{len(inside)} TCP connection(s) inside a host, e.g. "
                           f"{sorted(inside)[0]}" + waiting("two-fabric"))
                elif not across:
                    why = "no connection between hosts was seen: the sampling saw nothing"
                self.result(not why, f"intra {lname} {prov}: no TCP within a host",
                            f"{across} samples across", secs, job, why)
            finally:
                c.down()

    # ---- a rank killed -----------------------------------------------------------------------
    def kill(self, prov):
        c = self.cluster(2)
        try:
            hosts_of = placement([2, 2])
            # Long, so that ending well inside it says the ranks noticed the dead one.
            limit_ms = 60000
            common = {"FABRICOLL_PROVIDER": prov, "FABRICOLL_TIMEOUT_MS": str(limit_ms)}
            common.update(MODEL)
            argv = self.perf_args("allreduce", "ring", e="1M", f="2", n="100000", check="0")
            job, _ = self.start(c, hosts_of, argv, "kill", common)
            time.sleep(3)  # all ranks inside the collectives (creation took less)
            victim = len(hosts_of) - 1
            early = job.poll() or any(e is not None for e in job.ends)
            t_kill = time.monotonic() - job.t0
            job.kill(victim)
            bound = limit_ms / 1000 / 3  # far from the deadline, generous for a loaded machine
            done = job.wait(t_kill + bound + 5)
            late = [r for r, e in enumerate(job.ends)
                    if r != victim and (e is None or e - t_kill > bound)]
            zero = [r for r, rc in enumerate(job.rcs()) if r != victim and rc == 0]
            why = ""
            if early:
                why = f"a rank ended before the kill (statuses {job.rcs()})"
            elif late or not done:
                why = f"ranks {late} did not end within {bound:g}s of the kill"
            elif zero:
                why = f"ranks {zero} exited 0 after a peer died"
            spans = [f"{e - t_kill:.1f}" for r, e in enumerate(job.ends) if r != victim and e]
            self.result(not why, f"kill rank {victim} on host 2 ({prov})",
                        f"others ended after {','.join(spans)}s", t_kill, job, why)
        finally:
            c.down()

    # ---- mismatched providers ------------------------------------------------------------------
    def mismatch(self):
        c = self.cluster(2)
        try:
            hosts_of = placement([2, 2])
            odd = len(hosts_of) - 1
            # The bound is far below the timeout, so that ranks which end within it found the
            # mismatch, not the deadline; and far above the time it takes, for a loaded machine.
            common = {"FABRICOLL_PROVIDER": "net", "FABRICOLL_TIMEOUT_MS": "180000"}
            common.update(MODEL)
            job, _ = self.start(c, hosts_of, self.perf_args("allreduce", "ring"), "mismatch",
                                common, per_rank={odd: {"FABRICOLL_PROVIDER": "tcp"}})
            bound = 60
            done = job.wait(bound)
            secs = time.monotonic() - job.t0
            why = ""
            if not done:
                why = f"ranks still running after {bound}s (FABRICOLL_TIMEOUT_MS=180000)"
            elif any(rc == 0 for rc in job.rcs()):
                why = f"some rank succeeded (statuses {job.rcs()})"
            else:
                silent = [r for r in range(len(hosts_of))
                          if not (re.search(r"rank\s*\d", job.text(r)) and "tcp" in job.text(r))]
                if silent:
                    why = f"ranks {silent} failed without naming a rank and the provider tcp"
            if why:
                why += waiting("agree")
            self.result(not why, "mismatch: rank 3 tcp, others net", "", secs, job, why)
        finally:
            c.down()

    # ---- launchers ---------------------------------------------------------------------------
    def launchers(self):
        c = self.cluster(3)
        try:
            hosts_of = placement([2, 1, 1])
            common = {"FABRICOLL_PROVIDER": "net", "FABRICOLL_TIMEOUT_MS": "20000"}
            common.update(MODEL)
            argv = self.perf_args("allreduce", "ring", e="4K")
            rootfile = os.path.join(self.logdir, "root-file")
            cases = [("torchrun", None), ("ompi", None), ("ompi", rootfile), ("hydra", rootfile),
                     ("hydra", None), ("slurm", None), ("slurm", rootfile)]
            for kind, rf in cases:
                if rf and os.path.exists(rf):
                    os.remove(rf)
                how = "FABRICOLL_ROOT_FILE" if rf else \
                    ("MASTER_ADDR" if kind == "torchrun" else "FABRICOLL_ROOT")
                self.run_ok(c, hosts_of, argv, f"launcher-{kind}-{how}", common,
                            f"launcher {kind} ({how})", "hosts 2+1+1", wait_for="launch",
                            kind=kind, root_file=rf)
            self.unique_id(c, hosts_of, common, argv)
        finally:
            c.down()

    def unique_id(self, c, hosts_of, common, argv):
        """`fabricoll-info --unique-id --ranks N` in host 1 prints the id and serves it."""
        tag = "launcher unique id (fabricoll-info --unique-id)"
        log = open(os.path.join(self.logdir, "unique-id-tool.log"), "w+", encoding="utf-8")
        env = base_env()
        env.update(common)
        tool = c.popen(1, [self.info, "--unique-id", "--ranks", str(len(hosts_of))], env, log)
        t0, uid = time.monotonic(), None
        # a bound on a hang (the id comes at once), not a speed check
        while time.monotonic() - t0 < 60 and uid is None and tool.poll() is None:
            time.sleep(0.1)
            log.seek(0)
            for ln in log.read().splitlines():
                if re.fullmatch(r"\s*[0-9a-fA-F]{16,}\s*", ln):
                    uid = ln.strip()
        if uid is None:
            tool.kill()
            tool.wait()
            log.seek(0)
            said = " | ".join(log.read().splitlines()[-3:])
            self.result(False, tag, "", time.monotonic() - t0,
                        why=f"no hex id line within 10s ({said})" + waiting("launch"))
            log.close()
            return
        ok = self.run_ok(c, hosts_of, argv, "launcher-uid", common, tag, "hosts 2+1+1",
                         wait_for="launch", kind="uid", unique_id=uid)
        try:
            tool.wait(timeout=10 if ok else 1)
        except subprocess.TimeoutExpired:
            tool.kill()
            tool.wait()
        log.close()

    # ---- two interfaces per host -----------------------------------------------------------------
    def nics(self, prov):
        c = self.cluster(2, nics=2)
        try:
            hosts_of = placement([2, 2])
            common = {"FABRICOLL_PROVIDER": prov, "FABRICOLL_TIMEOUT_MS": "20000",
                      "FABRICOLL_DOMAIN": "ccl0,ccl1"}
            common.update(MODEL)
            argv = self.perf_args("allreduce", "ring", e="4M", f="4", n="10", check="0")
            job, port = self.start(c, hosts_of, argv, "nics", common)
            used = {h: set() for h in (1, 2)}

            def sample():
                for h in used:
                    for lip, lport, pip, pport, _ in c.ss(h):
                        if port + 1 not in (lport, pport) and pip not in c.addrs(h):
                            used[h].add(lip)
            done = job.wait(self.timeout, during=sample, every=0.1)
            secs = time.monotonic() - job.t0
            why = ""
            if not done or any(job.rcs()):
                why = f"the run failed (statuses {job.rcs()})"
            else:
                one = [h for h in used if len(used[h]) < 2]
                if one:
                    why = (f"host {one[0]}'s ranks used only {sorted(used[one[0]])} "
                           "between hosts" + waiting("devices"))
            detail = " ".join(f"h{h}:{'+'.join(sorted(a))}" for h, a in used.items())
            self.result(not why, f"nics: two interfaces per host ({prov})", detail[:28], secs,
                        job, why)
        finally:
            c.down()


    # ---- the simulator against a measurement -----------------------------------------------------
    def simval(self, prov):
        tag = "simval: fabricoll-sim against 2x2 at 1 Gbit/s"
        if not os.access(self.sim, os.X_OK):
            self.result(False, tag, "", 0, why=f"{self.sim} not found: run scripts/build.sh "
                        "(or set FABRICOLL_SIM)")
            return
        out = os.path.join(self.logdir, "simval", "1gbit")
        os.makedirs(out, exist_ok=True)
        a = argparse.Namespace(
            dir=out, perf=self.perf, mpi_bench="", layouts=["2x2"], delays=["0"],
            colls=["allreduce"], rate="1gbit", provider=prov, min="64K", max="4M", factor=4,
            seconds=0.3, reps=3, run_timeout=self.timeout, prefix=self.prefix,
            owner=os.environ.get("MH_OWNER") or str(os.getpid()), algos=["ring", "rdh", "mesh"],
            no_auto=True, calibrate=True, compress=[])
        t0 = time.monotonic()
        try:
            failed_runs = bench.Bench(a).run()
        except RuntimeError as e:
            if "tbf" in str(e):
                self.skip(tag, f"the link rate cannot be shaped (tc tbf): {e}")
            else:
                self.result(False, tag, "", time.monotonic() - t0, why=str(e))
            return
        (g,) = simval.validate(out, self.sim) or [{"error": "no measured rows"}]
        secs = time.monotonic() - t0
        why, detail = "", ""
        if failed_runs:
            why = f"some runs failed (logs in {out}/logs)"
        elif "error" in g:
            why = g["error"]
        else:
            s = simval.summarise(g["points"])
            detail = f"geomean {s['geo_from']:.1%}, worst {s['worst'][4]:.1%}"
            if s["n_from"] < 12:
                why = f"{s['n_from']} points compared, not 12 (3 algorithms x 4 sizes)"
            elif s["geo_from"] > SIMVAL_BOUND:
                why = (f"geometric-mean error {s['geo_from']:.1%} over {SIMVAL_BOUND:.0%}; "
                       f"worst {simval.worst_text(s['worst'])}")
        self.result(not why, tag, detail, secs, why=why)
        if why or os.environ.get("MH_SIMVAL_REPORT") == "1":
            print(simval.markdown([g]), flush=True)


def main():
    st = Stage()
    for exe in (st.perf, st.info):
        if not os.access(exe, os.X_OK):
            print(f"multihost-tests: {exe} not found: run scripts/build.sh (or set FABRICOLL_PERF)")
            print("multihost-tests: 0 passed, 1 failed, 0 skipped")
            return 1
    providers = os.environ.get("MH_PROVIDERS", "net tcp").split()
    checks = os.environ.get("MH_CHECKS",
                            "matrix intra kill mismatch launcher nics simval").split()
    t0 = time.monotonic()
    print(f"multihost-tests: checks {' '.join(checks)}; providers {' '.join(providers)} between "
          f"hosts, the default intra-host provider within; logs in {st.logdir}", flush=True)
    for check in checks:
        t = time.monotonic()
        if check == "matrix":
            st.matrix(providers)
        elif check in ("intra", "kill", "nics", "simval"):
            getattr(st, check)(providers[0])
        elif check == "mismatch":
            st.mismatch()
        elif check == "launcher":
            st.launchers()
        else:
            print(f"multihost-tests: unknown check {check!r} in MH_CHECKS")
            return 2
        print(f"# {check}: {time.monotonic() - t:.0f}s", flush=True)
    if st.failures:
        print("\nfailed checks:")
        for f in st.failures:
            print(f"  {f}")
    print(f"multihost-tests: elapsed {time.monotonic() - t0:.0f}s; logs in {st.logdir}")
    print(f"multihost-tests: {st.passed} passed, {st.failed} failed, {st.skipped} skipped")
    return 1 if st.failed else 0


if __name__ == "__main__":
    sys.exit(main())
