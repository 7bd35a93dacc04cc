#!/usr/bin/env python3
"""Multi-process test of the collective engines through fabricoll-perf (scripts/coll-tests.sh).

Each case is one run of
    fabricoll-perf --ranks R --coll C --algo A -b 4 -e 64K -f 8 -n 2 -w 1 -c 1 [variant options]
over one libfabric provider (tcp and net stay on loopback: FABRICOLL_DOMAIN=lo). fabricoll-perf
forks the ranks, checks every element of every size against its own reference and exits non-zero
on a wrong element or a failed rank. Sizes 4 B .. 64 KiB: counts below the rank count, uneven
chunks (every third case uses -f 7: 4, 28, 196, ... bytes) and several slices.

The pairs come from `fabricoll-info --algorithms` (each algorithm with the collectives it
implements) plus auto for every collective: a pair that does not exist is no test and is never
run. hier runs with FABRICOLL_LOCAL_RANKS=2, so only at even rank counts.

Matrix: every pair at 4 ranks over every provider; at 3, 2, 5 and 8 ranks every pair over one
provider, in rotation (each pair meets every provider across those rank counts). COLL_FULL=1:
every rank count over every provider. A case costs mostly its start (libfabric's initialisation
in each rank), so the matrix runs each (pair, provider) once at full width and spreads the other
rank counts over the providers rather than repeating them all.

Variants rotate over the cases: data types and ops, --inplace on every fourth, the root for
broadcast and reduce, `-t 0.0001 -m 1 -n 3` (iterations from a time target, agreed by the ranks)
on every fifth, FABRICOLL_SHM_FASTBOX=0 on every seventh over shm, one case per algorithm at
4 ranks up to 1 MiB. The cost model: auto cases measure it (as a user's run does, since it picks
the algorithm); cases of a named algorithm rotate over fixed models (the slicing they give
differs), which spares them the calibration at start-up.

A provider that libfabric does not offer makes its cases SKIP, and under FABRICOLL_TEST_STRICT=1
(scripts/test.sh) FAIL. net (libfabric 1.17's native TCP endpoint, renamed tcp in 1.18) is only
in the default list where fi_info finds it.

Output: one line per case (PASS / FAIL / SKIP, with its variant and seconds); a FAIL prints the
command to reproduce it and the tail of its output. Last line: `coll-tests: N passed, N failed,
N skipped`. Exit status non-zero on any failure.

Environment (defaults in brackets):
  COLL_PROVIDERS [tcp shm net]  COLL_RANKS [4 3 2 5 8]  COLL_FULL [0]
  COLL_ALGOS [every algorithm and auto]  COLL_COLLS [every collective]
  COLL_RUN_TIMEOUT [90]        seconds per fabricoll-perf run
  COLL_JOBS [2]                cases run at once
  COLL_LIB_TIMEOUT_MS [20000]  FABRICOLL_TIMEOUT_MS of the ranks (a lost peer becomes an error)
  COLL_DEADLINE [0]            if > 0: cases not started after this many seconds are NOT RUN
                               (counted as failed, so an incomplete run never passes)
  FABRICOLL_PERF, FABRICOLL_INFO [$CARGO_TARGET_DIR/release/fabricoll-{perf,info}]
  COLL_LOGDIR [$CARGO_TARGET_DIR/coll-tests/<date>-<pid>]   one <case>.log per case; directories
                               older than a day are removed; coll-tests/latest is the newest
"""
import os
import re
import shutil
import subprocess
import sys
import time

ALGOS = "ring bidir_ring mesh mesh1 rdh rd tree dbtree bruck pairwise hier auto"
COLLS = "allreduce allgather reducescatter broadcast reduce alltoall"
DTYPES = [("float", "sum"), ("double", "max"), ("int32", "sum"), ("bfloat16", "sum"),
          ("half", "avg"), ("int64", "prod"), ("uint8", "min"), ("fp8_e4m3", "sum"),
          ("int32", "bxor"), ("uint64", "bor"), ("int8", "band")]
# Fixed cost models (alpha us, beta GB/s, gamma GB/s) for cases of a named algorithm.
MODELS = [("5", "2", "8"), ("20", "1", "4"), ("2", "10", "30")]
# Variables of the caller's environment that would change what a case runs.
CLEARED = ["FABRICOLL_DOMAIN", "FABRICOLL_LOCAL_RANKS", "FABRICOLL_SHM_FASTBOX", "FABRICOLL_ALGO",
           "FABRICOLL_ALPHA_US", "FABRICOLL_BETA_GBPS", "FABRICOLL_GAMMA_GBPS"]


def env_list(name, default):
    return os.environ.get(name, default).split()


def is_ip(prov):
    return prov in ("tcp", "net")


def offered(prov):
    """Whether libfabric offers `prov` with reliable datagram endpoints (fi_info)."""
    try:
        r = subprocess.run(["fi_info", "-p", prov, "-t", "FI_EP_RDM"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def libfabric_version():
    """libfabric's (major, minor) from `fi_info --version`, or None."""
    try:
        out = subprocess.run(["fi_info", "--version"], capture_output=True, text=True,
                             timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"^libfabric:\s*(\d+)\.(\d+)", out, re.M)
    return (int(m.group(1)), int(m.group(2))) if m else None


def net_absence(version):
    """Why `net` is left out where fi_info does not offer it: from libfabric 1.18 on it has no
    net by design (1.18 renamed it tcp), so its cases count as skipped (`by_design` True); before
    that it should be there, and its cases fail under strict mode (`by_design` False)."""
    if version is not None and version >= (1, 18):
        return f"libfabric {version[0]}.{version[1]} has no net provider (1.18 renamed it tcp)", True
    shown = f"{version[0]}.{version[1]}" if version else "?"
    return f"libfabric {shown} offers no net provider, although this version should", False


def pairs(info, algos, colls):
    """(algo, coll) pairs that exist (`fabricoll-info --algorithms`), in the order of `algos`
    then `colls`."""
    out = subprocess.run([info, "--algorithms"], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    return implemented_pairs(out, algos, colls)


def implemented_pairs(listing, algos, colls):
    """`pairs` from the text of `fabricoll-info --algorithms` (`ALGO COLL...` lines)."""
    implemented = {}
    for line in listing.splitlines():
        words = line.split()
        if words:
            implemented[words[0]] = set(words[1:])
    implemented["auto"] = set(COLLS.split())
    unknown = [a for a in algos if a not in implemented]
    if unknown:
        raise SystemExit(f"coll-tests: unknown algorithm(s) {unknown}")
    return [(a, c) for a in algos for c in colls if c in implemented[a]]


def providers_for(r, ai, ci, providers, full):
    if full or r == 4:
        return providers
    # rotate over (algo, coll); the phase per rank count
    phase = {2: 0, 3: 1, 5: 1}.get(r, r % 2 + 2)
    return [providers[(ai + ci + phase) % len(providers)]]


def tail(log):
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            lines = [ln.rstrip("\n") for ln in f]
    except OSError:
        return ["(the log is gone: was its directory removed by someone else?)"]
    keep = [ln for ln in lines if ln.strip() and not ln.startswith("#") and not ln.endswith(" 0")]
    return keep[-12:]


def main():
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    perf = os.environ.get("FABRICOLL_PERF", f"{target}/release/fabricoll-perf")
    info = os.environ.get("FABRICOLL_INFO", os.path.join(os.path.dirname(perf), "fabricoll-info"))
    strict = os.environ.get("FABRICOLL_TEST_STRICT") == "1"
    ranks_list = [int(r) for r in env_list("COLL_RANKS", "4 3 2 5 8")]
    algos = env_list("COLL_ALGOS", ALGOS)
    colls = env_list("COLL_COLLS", COLLS)
    full = os.environ.get("COLL_FULL", "0") == "1"
    run_timeout = float(os.environ.get("COLL_RUN_TIMEOUT", "90"))
    lib_timeout_ms = os.environ.get("COLL_LIB_TIMEOUT_MS", "20000")
    deadline = float(os.environ.get("COLL_DEADLINE", "0"))
    jobs = max(1, int(os.environ.get("COLL_JOBS", "2")))
    for exe in (perf, info):
        if not os.access(exe, os.X_OK):
            print(f"coll-tests: {exe} not found: run scripts/build.sh (or set FABRICOLL_PERF)",
                  file=sys.stderr)
            print("coll-tests: 0 passed, 1 failed")
            return 1
    if "COLL_PROVIDERS" in os.environ:
        providers = env_list("COLL_PROVIDERS", "")
        missing = [p for p in providers if not offered(p)]
    else:
        providers = ["tcp", "shm", "net"]
        missing = [p for p in providers if not offered(p)]
    absent_by_design = {}
    if "net" in missing:
        why, by_design = net_absence(libfabric_version())
        if by_design:
            absent_by_design["net"] = why
    for p in missing:
        verdict = "SKIP" if p in absent_by_design or not strict else "FAIL (FABRICOLL_TEST_STRICT=1)"
        print(f"coll-tests: {absent_by_design.get(p, f'libfabric does not offer provider {p}')}: "
              f"its cases are {verdict}")

    logroot = f"{target}/coll-tests"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    logdir = os.environ.get("COLL_LOGDIR") or f"{logroot}/{stamp}-{os.getpid()}"
    os.makedirs(logdir, exist_ok=True)
    if not os.environ.get("COLL_LOGDIR"):
        now = time.time()
        for d in os.listdir(logroot):
            path = os.path.join(logroot, d)
            old = now - os.path.getmtime(path) > 86400
            if os.path.isdir(path) and not os.path.islink(path) and old:
                shutil.rmtree(path, ignore_errors=True)
        link = os.path.join(logroot, "latest")
        try:
            if os.path.islink(link):
                os.remove(link)
            os.symlink(os.path.basename(logdir), link)
        except OSError:
            pass

    todo = pairs(info, algos, colls)
    algo_index = {a: i for i, a in enumerate(algos)}
    coll_index = {c: i for i, c in enumerate(colls)}
    passed = failed = skipped = run_i = 0
    failed_list = []
    big_done = set()
    bad_pairs = set()
    cases = []  # (tag, desc, args, envs, name, pair), in the order they start
    for r in ranks_list:
        for algo, coll in todo:
            if algo == "hier" and r % 2:
                continue  # FABRICOLL_LOCAL_RANKS=2 needs an even rank count: no such case
            for prov in providers_for(r, algo_index[algo], coll_index[coll], providers, full):
                tag = f"{prov} r={r} {algo}/{coll}"
                if prov in missing:
                    why = absent_by_design.get(prov, f"libfabric does not offer provider {prov}")
                    if strict and prov not in absent_by_design:
                        print(f"FAIL {tag:<34} {why} (FABRICOLL_TEST_STRICT=1)")
                        failed += 1
                        failed_list.append(f"{tag}: {why}")
                    else:
                        print(f"SKIP {tag:<34} {why}")
                        skipped += 1
                    continue
                envs = {"FABRICOLL_PROVIDER": prov, "FABRICOLL_TIMEOUT_MS": lib_timeout_ms}
                if is_ip(prov):
                    # One host: without "same" its ranks would talk over shm, not `prov`.
                    envs["FABRICOLL_DOMAIN"] = "lo"
                    envs["FABRICOLL_INTRA_PROVIDER"] = "same"
                if algo == "hier":
                    envs["FABRICOLL_LOCAL_RANKS"] = "2"
                dt, op = DTYPES[run_i % len(DTYPES)]
                f = "7" if run_i % 3 == 1 else "8"
                e = "64K"
                if r == 4 and (prov, algo) not in big_done:
                    e = "1M"  # one larger size per algorithm (its first collective) at 4 ranks
                    big_done.add((prov, algo))
                args = ["--ranks", str(r), "--coll", coll, "--algo", algo, "-b", "4", "-e", e,
                        "-f", f, "-n", "2", "-w", "1", "-c", "1", "-d", dt, "-o", op]
                desc = f"{dt}/{op} -f {f} -e {e}"
                if run_i % 4 == 3:
                    args.append("--inplace")
                    desc += " inplace"
                if run_i % 5 == 2:
                    # iterations per size from a time target: the ranks must agree on the count
                    args += ["-t", "0.0001", "-m", "1", "-n", "3"]
                    desc += " -t"
                if prov == "shm" and run_i % 7 == 5:
                    # shm's provider path for small messages (pool receives matched in software)
                    envs["FABRICOLL_SHM_FASTBOX"] = "0"
                    desc += " no-fastbox"
                if coll in ("broadcast", "reduce"):
                    root = run_i % r
                    args += ["-r", str(root)]
                    desc += f" root {root}"
                model = None if algo == "auto" else MODELS[run_i % len(MODELS)]
                if model:
                    envs.update(zip(["FABRICOLL_ALPHA_US", "FABRICOLL_BETA_GBPS",
                                     "FABRICOLL_GAMMA_GBPS"], model))
                    desc += " model " + "/".join(model)
                run_i += 1
                cases.append((tag, desc, args, envs, f"{prov}-r{r}-{algo}-{coll}", (algo, coll)))

    # Up to `jobs` cases at once: a case is mostly its ranks' start, spent waiting (libfabric's
    # initialisation), so two overlap well even on two CPUs; cases of one job never share a
    # port or a shared-memory name (each forks its own ranks under its own unique id).
    t_start = time.monotonic()
    running = []
    while cases or running:
        while cases and len(running) < jobs:
            tag, desc, args, envs, name, pair = cases.pop(0)
            if deadline > 0 and time.monotonic() - t_start >= deadline:
                print(f"FAIL {tag:<34} NOT RUN: COLL_DEADLINE={deadline:g}s reached")
                failed += 1
                failed_list.append(f"{tag} (not run)")
                continue
            running.append((tag, desc, args, envs, pair,
                            Case(perf, args, envs, logdir, name, run_timeout)))
        still = []
        for tag, desc, args, envs, pair, case in running:
            if not case.ended():
                still.append((tag, desc, args, envs, pair, case))
                continue
            ok, why, secs, log = case.result()
            if ok:
                print(f"PASS {tag:<34} {desc:<52} {secs:5.1f}s", flush=True)
                passed += 1
                continue
            print(f"FAIL {tag:<34} {desc:<52} {secs:5.1f}s  ({why})")
            env_s = " ".join(f"{k}={v}" for k, v in envs.items())
            print(f"     reproduce: env {env_s} {perf} {' '.join(args)}")
            for line in tail(log):
                print(f"     | {line}")
            print(f"     log: {log}", flush=True)
            failed += 1
            failed_list.append(f"{tag} ({desc}): {why}")
            bad_pairs.add(pair)
        running = still
        if running:
            time.sleep(0.02)

    if failed_list:
        print("\nfailed runs:")
        for t in failed_list:
            print(f"  {t}")
    print(f"coll-tests: elapsed {time.monotonic() - t_start:.0f}s ({jobs} cases at once); "
          f"logs in {logdir}")
    print(f"coll-tests: {len(todo) - len(bad_pairs)} of {len(todo)} algorithm x collective pairs "
          f"passed in every case, over {' '.join(providers)} at {len(ranks_list)} rank counts")
    print(f"coll-tests: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


class Case:
    """One case's fabricoll-perf run, started at once; `ended` polls it, `result` reads it."""

    def __init__(self, perf, args, envs, logdir, name, run_timeout):
        self.log = os.path.join(logdir, name + ".log")
        self.run_timeout = run_timeout
        env = {k: v for k, v in os.environ.items() if k not in CLEARED}
        env.update(envs)
        self.t0 = time.monotonic()
        with open(self.log, "w", encoding="utf-8") as out:
            out.write(f"# env: {' '.join(f'{k}={v}' for k, v in envs.items())}\n")
            out.write(f"# cmd: {perf} {' '.join(args)}\n")
            out.flush()
            # Its own process group, so that a timeout ends the forked ranks too.
            self.proc = subprocess.Popen([perf] + args, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.rc = None
        self.timed_out = False
        self.secs = 0.0

    def ended(self):
        """True once the run exited, or was killed at its timeout."""
        if self.proc.poll() is None:
            if time.monotonic() - self.t0 < self.run_timeout:
                return False
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
            self.timed_out = True
        self.rc = None if self.timed_out else self.proc.returncode
        self.secs = time.monotonic() - self.t0
        return True

    def result(self):
        """(passed, why not, seconds, log path) of an ended case."""
        try:
            with open(self.log, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            text = ""
        lines = text.splitlines()
        checked = "# Out of bounds values : 0 OK" in lines
        if self.rc == 0 and checked:
            return True, "", self.secs, self.log
        why = f"TIMEOUT after {self.run_timeout:g}s" if self.timed_out else f"exit {self.rc}"
        if any(ln.startswith("# Out of bounds values : ") and not ln.endswith(" 0 OK")
               for ln in lines):
            why += ", wrong elements"
        return False, why, self.secs, self.log


if __name__ == "__main__":
    sys.exit(main())
