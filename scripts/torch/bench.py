"""Driver of scripts/bench-torch.sh: for each rank count x provider, one job (tests.launcher,
rank side bench_rank.py) times the backend under test against gloo in the same job, alternating,
and this prints nccl-tests style tables (time, algbw, busbw) with gloo's time over ours per size,
then the DDP step. Outputs: target/bench-torch/<stamp>.txt (the tables) and .json (raw timings).

nccl-tests' definitions: size = the whole buffer (all_gather: the gathered output;
reduce_scatter: the input), algbw = size / time, busbw = algbw x 2(n-1)/n for all_reduce and
x (n-1)/n for all_gather and reduce_scatter. Times are the slowest rank's, per call, medians
over the alternating runs.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))
from tests import harness, launcher  # noqa: E402  pylint: disable=wrong-import-position

BUS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
       "reduce_scatter": lambda n: (n - 1) / n}
MIB = 1 << 20


def sizes(step, last, first=8):
    out, s = [], first
    while s < last:
        out.append(s)
        s *= step
    return out + [last]


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 2 ranks over shm, 8 B / 64 KiB / 1 MiB, short timings")
    p.add_argument("--ranks", default="2 4")
    p.add_argument("--providers", default="shm net")
    p.add_argument("--colls", default="all_reduce all_gather reduce_scatter")
    p.add_argument("--step", type=int, default=4, help="size factor between rows (4 or 8)")
    p.add_argument("--min-size", type=int, default=8, help="first size in bytes (default 8)")
    p.add_argument("--max-size", type=int, default=64 * MIB)
    p.add_argument("--reps", type=int, default=5, help="alternating runs (median; at least 3)")
    p.add_argument("--target-s", type=float, default=0.2, help="seconds per timed run")
    p.add_argument("--no-ddp", action="store_true")
    a = p.parse_args()
    if a.quick:
        a.ranks, a.providers, a.reps, a.target_s = "2", "shm", 3, 0.02
    a.reps = max(3, a.reps)
    return a


def job_args(a):
    sz = [8, 64 * 1024, MIB] if a.quick else sizes(a.step, a.max_size, a.min_size)
    return {"colls": a.colls.split(), "sizes": sz, "reps": a.reps, "warmup": 2,
            "target_s": a.target_s, "max_iters": 2000,
            "ddp_steps": 0 if a.no_ddp else (5 if a.quick else 20),
            "ddp_width": 512, "ddp_depth": 4, "ddp_batch": 32, "timeout_s": 600}


def human(n):
    for unit, div in (("MiB", MIB), ("KiB", 1024)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return f"{n}B"


def tables(res, provider):
    n = res["ranks"]
    ours, theirs = [k for k in res["colls"][0]["times"] if k != "gloo"][0], "gloo"
    lines = []
    for coll in dict.fromkeys(c["coll"] for c in res["colls"]):
        what = "float32" + (" sum" if coll != "all_gather" else "")
        lines += [f"# {coll}, {n} ranks, {ours} over {provider} against gloo: {what}, "
                  f"median of {len(res['colls'][0]['times']['gloo'])} alternating runs",
                  f"# {'size':>9} {'count':>9} | {ours + ' time(us)':>20} {'algbw':>7} "
                  f"{'busbw':>7} | {'gloo time(us)':>14} {'algbw':>7} {'busbw':>7} | "
                  f"gloo/{ours}"]
        for row in (c for c in res["colls"] if c["coll"] == coll):
            size = row["size"]
            cells = []
            for name in (ours, theirs):
                t = statistics.median(row["times"][name])
                alg = size / t / 1e9
                cells.append((t, alg, alg * BUS[coll](n)))
            lines.append(f"  {human(size):>9} {size // 4:>9} | {cells[0][0] * 1e6:>20.1f} "
                         f"{cells[0][1]:>7.3f} {cells[0][2]:>7.3f} | {cells[1][0] * 1e6:>14.1f} "
                         f"{cells[1][1]:>7.3f} {cells[1][2]:>7.3f} | "
                         f"{cells[1][0] / cells[0][0]:>8.2f}x")
        lines.append("")
    if "ddp" in res:
        d = res["ddp"]
        t_o, t_g = (statistics.median(d["times"][k]) for k in (ours, theirs))
        lines += [f"# DDP step, {n} ranks over {provider}: MLP of {d['params']} parameters, "
                  f"median step (ms): {ours} {t_o * 1e3:.2f}, gloo {t_g * 1e3:.2f}, "
                  f"gloo/{ours} {t_g / t_o:.2f}x"]
        if "local" in d["times"]:
            # the step's communication: what it costs beyond the same step without DDP
            t_l = statistics.median(d["times"]["local"])
            c_o, c_g = t_o - t_l, t_g - t_l
            ratio = f"{c_g / c_o:.2f}x" if c_o > 0 else "n/a"
            lines += [f"#   without DDP {t_l * 1e3:.2f} ms; communication beyond it: {ours} "
                      f"{c_o * 1e3:.2f} ms, gloo {c_g * 1e3:.2f} ms, gloo/{ours} {ratio}"]
        lines.append("")
    return lines


def main():
    a = parse()
    outdir = os.path.join(harness.target_dir(), "bench-torch")
    os.makedirs(outdir, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S") + ("-quick" if a.quick else "")
    args = job_args(a)
    text, raw, failed = [], [], 0
    head = (f"# bench-torch: backend {harness.BACKEND} against gloo, ranks {a.ranks}, providers "
            f"{a.providers}, sizes {human(args['sizes'][0])}..{human(args['sizes'][-1])}, "
            f"{a.reps} alternating runs of ~{a.target_s}s each, fabricoll's "
            f"{'Python backend alone' if os.environ.get('FABRICOLL_TORCH_EXT') == '0' else 'compiled front'}")
    print(head, flush=True)
    text.append(head)
    for nranks in (int(r) for r in a.ranks.split()):
        for provider in a.providers.split():
            tag = f"{stamp}-{provider}-{nranks}"
            if harness.BACKEND != "gloo" and not harness.provider_offered(provider):
                line = f"# SKIP {nranks} ranks over {provider}: libfabric does not offer it"
                print(line, flush=True)
                text.append(line)
                continue
            env = harness.provider_env(provider)
            env["PYTHONPATH"] = HERE + os.pathsep + os.environ.get("PYTHONPATH", "")
            res = launcher.launch("bench", nranks, tag, env=env, args=args, timeout=3000,
                                  module="bench_rank", outdir=os.path.join(outdir, tag))
            if res.timed_out or any(rc != 0 for rc in res.rcs) or not res.results[0]:
                print(res.describe(), flush=True)
                failed += 1
                continue
            raw.append(dict(res.results[0], provider=provider))
            lines = tables(res.results[0], provider)
            print("\n".join(lines), flush=True)
            text += lines
    with open(os.path.join(outdir, f"{stamp}.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(text) + "\n")
    with open(os.path.join(outdir, f"{stamp}.json"), "w", encoding="utf-8") as f:
        json.dump({"args": args, "results": raw}, f, indent=1)
    print(f"bench-torch: tables in {os.path.join(outdir, stamp + '.txt')}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
