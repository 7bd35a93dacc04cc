"""Rank side of the CUDA-tensor benchmark (needs a GPU; scripts/torch/bench_cuda.py runs it):
all_reduce of float32 CUDA tensors through fabricoll (the default group, stream-ordered on the
current stream), through gloo on the same tensors, and through fabricoll on CPU tensors with the
copies to and from the device around it (what a CPU-only backend makes a user do). The three
alternate per size and repetition; each time is the slowest rank's median of `iters` calls,
each call timed from its start to the device being idle again."""
import time

import torch
import torch.distributed as dist

from tests.ranks import common

WAYS = ("fabricoll", "gloo", "copy+cpu")


def run(args):
    _, ws, dev, gloo = common.init_cuda(120)
    sizes = args.get("sizes", [1 << k for k in range(12, 27, 2)])
    iters, reps = args.get("iters", 20), args.get("reps", 3)
    out = {w: {} for w in WAYS}

    def once(way, t, host):
        if way == "fabricoll":
            dist.all_reduce(t)
        elif way == "gloo":
            dist.all_reduce(t, group=gloo)
        else:
            host.copy_(t)
            dist.all_reduce(host)
            t.copy_(host)
        torch.cuda.synchronize(dev)

    for size in sizes:
        n = size // 4
        t = torch.ones(n, device=dev)
        host = torch.empty(n, pin_memory=True)
        for rep in range(reps):
            k = rep % len(WAYS)
            for way in WAYS[k:] + WAYS[:k]:
                once(way, t, host)  # warm
                times = []
                for _ in range(iters):
                    dist.barrier(group=gloo)
                    t0 = time.perf_counter()
                    once(way, t, host)
                    times.append(time.perf_counter() - t0)
                times.sort()
                mine = torch.tensor([times[len(times) // 2] * 1e6], dtype=torch.float64)
                dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=gloo)
                out[way].setdefault(str(size), []).append(float(mine))
    dist.destroy_process_group()
    return {"checks": [], "us": out, "ranks": ws}
