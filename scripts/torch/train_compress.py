#!/usr/bin/env python3
"""DDP training on emulated hosts with compressed gradients (scripts/bench-train-compress.sh):
the same small model and data (python/tests/ranks/train_compress.py) trained once per mode
(gloo with PyTorch's bf16_compress_hook, fabricoll with a compressed format, fabricoll
uncompressed, ...), each mode a job of its own (one process per rank, torchrun's variables,
fabricoll over `net` between hosts and `shm` within, gloo over the hosts' interface), the
modes' order turning from one repetition to the next.

Per mode: the median step time (each repetition's median over its timed steps, the slowest
rank's per step; then the median over repetitions), x = the anchor's step time over the mode's
(the first mode is the anchor), the final loss on the held-out set and its difference from
the uncompressed fabricoll run's ("off"), the training loss at the start and the end, and
whether the ranks ended with identical parameters. Targets: a compressed format's step at
least 2x faster than the anchor, its final loss within 1 % (relative) of the uncompressed run.
Rows go to DIR/samples.jsonl, the table to DIR/summary.txt.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "scripts", "multihost"))
from cluster import Cluster, Job, launcher_env, placement  # noqa: E402  pylint: disable=wrong-import-position

FORMATS = ("bf16", "fp16", "fp8e4m3", "fp8e5m2", "int8", "int4")
MODES = ("off", "gloo", "gloo-bf16") + FORMATS


def parse_layout(s):
    """'4x1' -> [1, 1, 1, 1]; '2,1' -> [2, 1]."""
    if "x" in s:
        h, r = s.split("x", 1)
        return [int(r)] * int(h)
    return [int(x) for x in s.split(",")]


def args_of(a, mode):
    return {"mode": mode, "inputs": a.inputs, "width": a.width, "depth": a.depth,
            "batch": a.batch, "steps": a.steps, "warmup": a.warmup, "log_every": a.log_every,
            "lr": a.lr, "timeout_s": a.run_timeout}


def run_mode(a, c, hosts_of, mode, rep, port):
    name = f"{mode}-{rep}"
    outdir = os.path.join(a.dir, name)
    os.makedirs(outdir, exist_ok=True)
    argv = [a.python, "-m", "tests.rank_main", "tests.ranks.train_compress", outdir,
            json.dumps(args_of(a, mode))]
    common = {"PYTHONPATH": os.path.join(REPO, "python"), "FABRICOLL_LIB": a.lib,
              "FABRICOLL_TORCH_EXT": os.environ.get("FABRICOLL_TORCH_EXT", "1"),
              "FABRICOLL_PROVIDER": "net", "GLOO_SOCKET_IFNAME": "ccl0",
              "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
              "FABRICOLL_TIMEOUT_MS": str(a.run_timeout * 1000)}
    # The caller's own settings (FABRICOLL_LOG, FABRICOLL_ALGO, ...) reach the ranks too.
    common.update({k: v for k, v in os.environ.items()
                   if k.startswith("FABRICOLL_") and k not in common})
    envs = [dict(common, **launcher_env("torchrun", r, hosts_of, c.addr(1), port))
            for r in range(len(hosts_of))]
    t0 = time.monotonic()
    job = Job(c, hosts_of, argv, envs, outdir, "log")
    ok = job.wait(a.run_timeout + 60)
    path = os.path.join(outdir, "rank0.json")
    res = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            res = json.load(f)
    if not ok or any(job.rcs()) or "error" in res or "step_s" not in res:
        print(f"train-compress: {name} failed (statuses {job.rcs()}); logs in {outdir}", flush=True)
        return None
    res.update(rep=rep, wall_s=time.monotonic() - t0)
    st = res["step_s"]
    print(f"train-compress: {name}: median step {statistics.median(st) * 1e3:.1f} ms, "
          f"final loss {res['eval_loss']:.5f}, {res['wall_s']:.0f} s", flush=True)
    return res


def summary(a, runs):
    """The table of `runs` ({mode: [result per repetition]})."""
    med = {m: statistics.median(statistics.median(r["step_s"]) for r in rs)
           for m, rs in runs.items() if rs}
    anchor = a.modes[0]
    first = next((rs[0] for rs in runs.values() if rs), {})
    lines = [f"# DDP training, {a.layout} at {a.rate} with {a.delay} delay, "
             f"{first.get('ranks', '?')} ranks; MLP "
             f"{a.inputs}-{'-'.join([str(a.width)] * a.depth)}-10 "
             f"({first.get('params', '?')} parameters), batch {a.batch} "
             f"per rank, {a.steps} steps ({a.warmup} untimed), {a.reps} repetitions",
             f"# x: {anchor}'s step time over the mode's; loss vs off: final held-out loss "
             f"over the uncompressed fabricoll run's, minus 1",
             f"{'mode':>10} {'step ms':>9} {'x':>6} {'final loss':>11} {'vs off':>8} "
             f"{'loss first':>11} {'loss last':>10} {'same params':>12}"]
    off = runs.get("off") and runs["off"][0]["eval_loss"]
    for m in a.modes:
        rs = runs.get(m) or []
        if not rs:
            lines.append(f"{m:>10} failed")
            continue
        r0 = rs[0]
        x = med[anchor] / med[m] if anchor in med else float("nan")
        vs = f"{(r0['eval_loss'] / off - 1) * 100:+.2f}%" if off else "n/a"
        lines.append(f"{m:>10} {med[m] * 1e3:9.2f} {x:6.2f} {r0['eval_loss']:11.5f} {vs:>8} "
                     f"{r0['losses'][0]:11.4f} {r0['losses'][-1]:10.4f} "
                     f"{str(all(r['same_params'] for r in rs)):>12}")
    for m in a.modes:
        if m in FORMATS and m in med:
            x = med[anchor] / med[m] if anchor in med else float("nan")
            ok = "met" if x >= 2.0 else "missed"
            lines.append(f"# target: {m} step >= 2x faster than {anchor}: {x:.2f} ({ok})")
            if off:
                d = abs(runs[m][0]["eval_loss"] / off - 1)
                ok = "met" if d <= 0.01 else "missed"
                lines.append(f"# target: {m} final loss within 1 % of off: {d * 100:.2f} % ({ok})")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    p.add_argument("--layout", default="4x1", help="HOSTSxRANKS or ranks per host (2,1)")
    p.add_argument("--rate", default="100mbit")
    p.add_argument("--delay", default="1ms")
    p.add_argument("--modes", default="gloo-bf16,fp8e4m3,off",
                   help=f"comma-separated, the first is the anchor; of {','.join(MODES)}")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--inputs", type=int, default=256)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--run-timeout", type=int, default=900, help="seconds per job")
    p.add_argument("--dir", required=True)
    p.add_argument("--prefix", required=True, help="the cluster's name (netns-cluster.sh prefix)")
    p.add_argument("--owner", type=int, required=True, help="the pid that owns the cluster")
    p.add_argument("--lib", required=True, help="libnccl_net_fabricoll.so")
    p.add_argument("--python", default=sys.executable, help="the ranks' Python (with torch)")
    a = p.parse_args()
    a.modes = a.modes.split(",")
    bad = [m for m in a.modes if m not in MODES]
    if bad:
        p.error(f"--modes: {bad} not among {MODES}")
    os.makedirs(a.dir, exist_ok=True)
    layout = parse_layout(a.layout)
    hosts_of = placement(layout)
    c = Cluster(f"{a.prefix}t", len(layout), rate=a.rate, delay=a.delay, owner=a.owner)
    c.up()
    runs = {m: [] for m in a.modes}
    port = 29500
    try:
        with open(os.path.join(a.dir, "samples.jsonl"), "a", encoding="utf-8") as out:
            for rep in range(a.reps):
                k = rep % len(a.modes)
                for mode in a.modes[k:] + a.modes[:k]:
                    port += 2
                    res = run_mode(a, c, hosts_of, mode, rep, port)
                    if res:
                        runs[mode].append(res)
                        out.write(json.dumps(dict(res, layout=a.layout, rate=a.rate,
                                                  delay=a.delay)) + "\n")
                        out.flush()
    finally:
        c.down()
    text = summary(a, runs)
    with open(os.path.join(a.dir, "summary.txt"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text, end="")
    return 0 if all(runs[m] for m in a.modes) else 1


if __name__ == "__main__":
    sys.exit(main())
