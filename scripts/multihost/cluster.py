"""Emulated hosts for the multi-host tests and benchmark: a thin wrapper over
scripts/netns-cluster.sh, and jobs of fabricoll-perf ranks (one process per rank, each inside
its host's network namespace) started under a launcher's environment variables.

A job's ranks sit on the hosts contiguously (host 1 has ranks 0..n1-1, ...) or cyclically
(rank r on host r mod K, as `mpirun --map-by node`). Every wait has a deadline; a job that
passes it has all its ranks killed.
"""
import os
import re
import signal
import subprocess
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "netns-cluster.sh")

# Variables of the caller's environment that would change what a rank runs or which launcher
# it believes started it: never passed on (each job sets its own).
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT")
LAUNCHER_PREFIXES = ("FABRICOLL_", "OMPI_", "PMI_", "PMIX_", "SLURM_", "MPI_LOCAL")
KEPT = ("FABRICOLL_LOG",)


def base_env():
    """The caller's environment without any launcher's or library's variables."""
    return {k: v for k, v in os.environ.items()
            if k in KEPT or (k not in LAUNCHER_VARS and not k.startswith(LAUNCHER_PREFIXES))}


def sh(args, timeout=60):
    """Runs a command; (exit status, stdout+stderr)."""
    try:
        r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout}s: {' '.join(args)}"
    return r.returncode, r.stdout


class Cluster:
    """K emulated hosts (netns-cluster.sh up); `down` removes them (idempotent)."""

    def __init__(self, prefix, hosts, nics=1, rate="0", delay="0", subnet="10.77.0", owner=None):
        self.prefix, self.hosts, self.nics, self.subnet = prefix, hosts, nics, subnet
        self.rate, self.delay = rate, delay
        self.owner = str(owner or os.getppid())

    def up(self):
        rc, out = sh([SCRIPT, "up", "-p", self.prefix, "-k", str(self.hosts), "--nics",
                      str(self.nics), "-r", self.rate, "-d", self.delay, "-s", self.subnet,
                      "--owner", self.owner], timeout=120)
        if rc != 0:
            self.down()
            raise RuntimeError(f"netns-cluster.sh up failed: {out.strip()}")

    def reshape(self, rate, delay):
        rc, out = sh([SCRIPT, "reshape", "-p", self.prefix, "-r", rate, "-d", delay])
        if rc != 0:
            raise RuntimeError(f"netns-cluster.sh reshape failed: {out.strip()}")
        self.rate, self.delay = rate, delay

    def down(self):
        sh([SCRIPT, "down", "-p", self.prefix], timeout=120)

    def ns(self, host):
        return f"{self.prefix}-h{host}"

    def addr(self, host, nic=0):
        """Address of interface ccl<nic> of host `host` (1-based)."""
        a, b, c = self.subnet.split(".")
        return f"{a}.{b}.{int(c) + nic}.{host}"

    def addrs(self, host):
        return {self.addr(host, n) for n in range(self.nics)}

    def popen(self, host, argv, env, log):
        """Starts argv inside host `host` (its own hostname too), in a session of its own, with
        stdout and stderr into the open file `log`."""
        return subprocess.Popen([SCRIPT, "exec", "-p", self.prefix, str(host)] + argv, env=env,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)

    def ss(self, host):
        """Established TCP connections in host `host`: (local ip, local port, peer ip, peer port,
        pids)."""
        rc, out = sh(["ip", "netns", "exec", self.ns(host), "ss", "-tnpH", "state", "established"],
                     timeout=20)
        conns = []
        if rc != 0:
            return conns
        for line in out.splitlines():
            w = line.split()
            if len(w) < 4:
                continue
            local, peer = split_addr(w[2]), split_addr(w[3])
            if local and peer:
                pids = {int(p) for p in re.findall(r"pid=(\d+)", line)}
                conns.append((local[0], local[1], peer[0], peer[1], pids))
        return conns


def split_addr(s):
    """'10.0.0.1:80' or '[::ffff:10.0.0.1]:80' -> ('10.0.0.1', 80)."""
    m = re.match(r"^\[?(?:::ffff:)?([0-9.]+)\]?:(\d+)$", s)
    return (m.group(1), int(m.group(2))) if m else None


def placement(layout, cyclic=False):
    """The host (1-based) of each rank: `layout` lists the ranks per host."""
    if not cyclic:
        return [h + 1 for h, n in enumerate(layout) for _ in range(n)]
    left, out = list(layout), []
    while any(left):
        for h, n in enumerate(left):
            if n:
                out.append(h + 1)
                left[h] -= 1
    return out


def launcher_env(kind, rank, hosts_of, root, port, root_file=None, unique_id=None):
    """The variables launcher `kind` gives rank `rank` (torchrun, ompi, hydra, slurm, uid).
    `root` is host 1's address, where rank 0 runs; launchers that give no rank-0 address get
    FABRICOLL_ROOT=root:port, or FABRICOLL_ROOT_FILE=root_file when one is given."""
    n = len(hosts_of)
    local = sum(1 for h in hosts_of[:rank] if h == hosts_of[rank])
    local_n = hosts_of.count(hosts_of[rank])
    if kind == "torchrun":
        return {"RANK": str(rank), "WORLD_SIZE": str(n), "LOCAL_RANK": str(local),
                "LOCAL_WORLD_SIZE": str(local_n), "MASTER_ADDR": root, "MASTER_PORT": str(port)}
    if kind == "uid":
        return {"FABRICOLL_RANK": str(rank), "FABRICOLL_NRANKS": str(n),
                "FABRICOLL_UNIQUE_ID": unique_id}
    where = {"FABRICOLL_ROOT_FILE": root_file} if root_file else \
        {"FABRICOLL_ROOT": f"{root}:{port}"}
    if kind == "ompi":
        env = {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(n),
               "OMPI_COMM_WORLD_LOCAL_RANK": str(local), "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_n)}
    elif kind == "hydra":
        env = {"PMI_RANK": str(rank), "PMI_SIZE": str(n), "MPI_LOCALRANKID": str(local),
               "MPI_LOCALNRANKS": str(local_n)}
    elif kind == "slurm":
        env = {"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(n), "SLURM_LOCALID": str(local)}
    else:
        raise ValueError(f"unknown launcher {kind!r}")
    env.update(where)
    return env


class Job:
    """The ranks of one fabricoll-perf run, started at once, one log per rank."""

    def __init__(self, cluster, hosts_of, argv, envs, logdir, name):
        """`hosts_of[r]` is rank r's host; `envs[r]` its environment (added to base_env())."""
        self.cluster, self.hosts_of, self.logdir, self.name = cluster, hosts_of, logdir, name
        self.logs = [os.path.join(logdir, f"{name}.r{r}.log") for r in range(len(hosts_of))]
        self.procs, self.files = [], []
        self.t0 = time.monotonic()
        for r, host in enumerate(hosts_of):
            f = open(self.logs[r], "w", encoding="utf-8")  # pylint: disable=consider-using-with
            env = base_env()
            env.update(envs[r])
            f.write(f"# host {host}, env: {' '.join(f'{k}={v}' for k, v in sorted(envs[r].items()))}\n")
            f.write(f"# cmd: {' '.join(argv)}\n")
            f.flush()
            self.files.append(f)
            self.procs.append(cluster.popen(host, argv, env, f))
        self.ends = [None] * len(self.procs)

    def poll(self):
        """Records the exit time of ranks that ended; True when all have."""
        for r, p in enumerate(self.procs):
            if self.ends[r] is None and p.poll() is not None:
                self.ends[r] = time.monotonic() - self.t0
        return all(e is not None for e in self.ends)

    def wait(self, timeout, during=None, every=0.2):
        """Waits for every rank at most `timeout` seconds from the start, calling `during()`
        every `every` seconds meanwhile; kills the ranks left. True when none was killed."""
        while not self.poll():
            if time.monotonic() - self.t0 >= timeout:
                self.kill()
                return False
            if during:
                during()
            time.sleep(every)
        self.close()
        return True

    def kill(self, rank=None):
        """SIGKILL to one rank (its session), or to every rank still running."""
        for r, p in enumerate(self.procs):
            if (rank is None or r == rank) and p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
        if rank is None:
            for p in self.procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            self.poll()
            self.close()

    def close(self):
        for f in self.files:
            f.close()
        self.files = []

    def rcs(self):
        return [p.returncode for p in self.procs]

    def text(self, rank):
        """What rank `rank` printed (without the two lines the job wrote first)."""
        try:
            with open(self.logs[rank], encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[2:])
        except OSError:
            return ""

    def checked_ok(self):
        """Rank 0 checked every element and found nothing wrong."""
        return "# Out of bounds values : 0 OK" in self.text(0).splitlines()

    def wrong_width(self):
        """A rank whose header names another rank count (for instance a launcher not
        recognised, so that the process forked a job of its own): its message, or None."""
        n = len(self.procs)
        for r in range(n):
            for m in re.finditer(r"on (\d+) ranks", self.text(r)):
                if int(m.group(1)) != n:
                    return f"rank {r}'s process ran a job of {m.group(1)} ranks, not {n}"
        if not re.search(rf"on {n} ranks", self.text(0)):
            return f"rank 0 printed no header for {n} ranks"
        return None

    def tail(self, rank, lines=8):
        keep = [ln for ln in self.text(rank).splitlines() if ln.strip()]
        return keep[-lines:]
