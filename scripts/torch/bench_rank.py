"""Rank side of scripts/bench-torch.sh (run through tests.launcher): times dist.all_reduce,
all_gather_into_tensor and reduce_scatter_tensor per size, and a DDP training step, on the
backend under test (the default group) and on gloo (a second group over the same ranks),
alternating the two, `reps` times each. Rank 0 returns the per-rank maximum of every timing.
"""
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch import nn

BACKEND = os.environ.get("FABRICOLL_TEST_BACKEND", "fabricoll")


def time_coll(fn, group, iters):
    """Seconds per call of fn over `iters` calls, the slowest rank's (as nccl-tests reports)."""
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn(group)
    dt = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=group)
    return float(dt)


def make(coll, size, ws):
    """The call of `coll` whose nccl-tests size is about `size` bytes of float32."""
    if coll == "all_reduce":
        n = max(1, size // 4)
        buf = torch.ones(n)
        return n * 4, lambda g: dist.all_reduce(buf, group=g)
    per = max(1, size // 4 // ws)  # per-rank block; the size is the whole buffer
    small, big = torch.ones(per), torch.ones(per * ws)
    if coll == "all_gather":
        return per * ws * 4, lambda g: dist.all_gather_into_tensor(big, small, group=g)
    return per * ws * 4, lambda g: dist.reduce_scatter_tensor(small, big, group=g)


def bench_colls(args, groups, ws):
    out = []
    for coll in args["colls"]:
        for size in args["sizes"]:
            nbytes, fn = make(coll, size, ws)
            iters = {}
            for name, g in groups.items():
                for _ in range(args["warmup"]):
                    fn(g)
                one = time_coll(fn, g, 1)
                iters[name] = max(1, min(args["max_iters"], int(args["target_s"] / max(one, 1e-6))))
            times = {name: [] for name in groups}
            for _ in range(args["reps"]):
                for name, g in groups.items():  # alternating: one run of each in turn
                    times[name].append(time_coll(fn, g, iters[name]))
            out.append({"coll": coll, "size": nbytes, "iters": iters, "times": times})
    return out


def mlp(width, depth):
    """The benchmark's small model: depth x (Linear(width, width), ReLU), then Linear(width, 10)."""
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


LOCAL = "local"  # bench_ddp's step without DDP


def bench_ddp(args, groups, rank):
    from torch.nn.parallel import DistributedDataParallel  # pylint: disable=import-outside-toplevel
    width, depth = args["ddp_width"], args["ddp_depth"]
    models = {}
    for name, grp in groups.items():
        ddp = DistributedDataParallel(mlp(width, depth), process_group=grp)
        models[name] = (ddp, torch.optim.SGD(ddp.parameters(), lr=0.01))
    # the same step without DDP (no communication): the compute every backend pays, so that
    # the tables can tell the step's communication apart
    local = mlp(width, depth)
    models[LOCAL] = (local, torch.optim.SGD(local.parameters(), lr=0.01))
    runs = dict(groups, **{LOCAL: groups["gloo"]})
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args["ddp_batch"], width, generator=g)
    y = torch.randint(0, 10, (args["ddp_batch"],), generator=g)

    def step(name):
        ddp, opt = models[name]
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    times = {name: [] for name in runs}
    for name in runs:
        for _ in range(3):
            step(name)
    for _ in range(args["reps"]):
        for name, grp in runs.items():
            dist.barrier(group=grp)
            steps = []
            for _ in range(args["ddp_steps"]):
                t0 = time.perf_counter()
                step(name)
                steps.append(time.perf_counter() - t0)
            t = torch.tensor([sorted(steps)[len(steps) // 2]], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=grp)
            times[name].append(float(t))
    params = sum(p.numel() for p in models["gloo"][0].parameters())
    return {"params": params, "times": times}


def run(args):
    if BACKEND == "fabricoll":
        import fabricoll.torch  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    timeout = datetime.timedelta(seconds=args.get("timeout_s", 300))
    dist.init_process_group(BACKEND, timeout=timeout)
    gloo = dist.new_group(backend="gloo", timeout=timeout)
    rank, ws = dist.get_rank(), dist.get_world_size()
    groups = {BACKEND if BACKEND != "gloo" else "gloo(default)": dist.group.WORLD, "gloo": gloo}
    out = {"backend": BACKEND, "ranks": ws}
    out["colls"] = bench_colls(args, groups, ws)
    if args.get("ddp_steps"):
        out["ddp"] = bench_ddp(args, groups, rank)
    dist.destroy_process_group()
    return out if rank == 0 else {}
