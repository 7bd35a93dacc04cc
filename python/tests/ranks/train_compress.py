"""Rank side of DDP training with compressed gradients: a small MLP learns a synthetic task (the
classes a fixed random teacher network gives its inputs), its gradients averaged by one of
these exchanges (``args["mode"]``):

- ``off``: fabricoll, uncompressed;
- a format (``bf16``, ``fp16``, ``fp8e4m3``, ``fp8e5m2``, ``int8``, ``int4``): fabricoll with
  ``Options(compress=FMT)``, so DDP's bucket all_reduce travels compressed;
- ``gloo``: gloo, uncompressed;
- ``gloo-bf16``: gloo with PyTorch's own ``bf16_compress_hook`` (what users have today).

Used by tests.test_compress (short runs on one host) and scripts/bench-train-compress.sh
(emulated hosts: the step time and the final loss against the uncompressed run).

Every rank trains on its own shard; the parameters start equal (DDP broadcasts rank 0's). Rank 0
returns: mode, params (the model's parameter count), step_s (each timed step's time, the
slowest rank's), losses (the training loss every ``log_every`` steps, averaged over the ranks),
eval_loss (on a held-out set every rank evaluates alike: the same parameters give the same
value) and same_params (whether every rank ended with bit-identical parameters).
"""
import datetime
import time

import torch
import torch.distributed as dist
from torch import nn

FORMATS = ("bf16", "fp16", "fp8e4m3", "fp8e5m2", "int8", "int4")
MODES = ("off", "gloo", "gloo-bf16") + FORMATS
CLASSES = 10


def mlp(inputs, width, depth, seed):
    """depth x (Linear, ReLU), then Linear(width, CLASSES); weights from `seed`."""
    torch.manual_seed(seed)
    layers, d = [], inputs
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()]
        d = width
    return nn.Sequential(*layers, nn.Linear(d, CLASSES))


def task(args, n, seed):
    """`n` inputs drawn from `seed` and the teacher's class of each."""
    teacher = mlp(args["inputs"], 64, 2, seed=1234)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, args["inputs"], generator=g)
    with torch.no_grad():
        y = teacher(x).argmax(dim=1)
    return x, y


def group(mode, timeout):
    """Initialise the default group for `mode`."""
    if mode in ("gloo", "gloo-bf16"):
        dist.init_process_group("gloo", timeout=timeout)
        return
    import fabricoll.torch  # pylint: disable=import-outside-toplevel
    opts = fabricoll.torch.Options(compress=None if mode == "off" else mode)
    dist.init_process_group("fabricoll", timeout=timeout, pg_options=opts)


def same_everywhere(model):
    """Whether every rank holds bit-identical parameters: the largest and the smallest of each
    rank's parameters, read as integers, agree."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    bits = flat.view(torch.int32).to(torch.int64)
    words = torch.stack([bits.sum(), (bits * torch.arange(1, bits.numel() + 1)).sum()])
    lo, hi = words.clone(), words.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    return bool(torch.equal(lo, hi))


def run(args):
    from torch.nn.parallel import DistributedDataParallel  # pylint: disable=import-outside-toplevel
    mode = args["mode"]
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    torch.set_num_threads(args.get("threads", 1))
    group(mode, datetime.timedelta(seconds=args.get("timeout_s", 300)))
    rank, ws = dist.get_rank(), dist.get_world_size()
    model = mlp(args["inputs"], args["width"], args["depth"], seed=7)
    ddp = DistributedDataParallel(model)
    if mode == "gloo-bf16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # pylint: disable=import-outside-toplevel
        ddp.register_comm_hook(dist.group.WORLD, default_hooks.bf16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.get("lr", 0.05), momentum=0.9)
    batch, steps = args["batch"], args["steps"]
    # a fresh batch for every step (no sample seen twice), so the held-out loss follows the
    # training loss instead of measuring how a run overfits
    x, y = task(args, batch * steps, seed=100 + rank)
    lossf = nn.functional.cross_entropy

    step_s, losses = [], []
    dist.barrier()
    for i in range(steps):
        at = i * batch
        t0 = time.perf_counter()
        loss = lossf(ddp(x[at:at + batch]), y[at:at + batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
        step_s.append(time.perf_counter() - t0)
        if i % args.get("log_every", 10) == 0 or i == steps - 1:
            losses.append(float(loss))
    warm = min(args.get("warmup", 3), steps - 1)
    times = torch.tensor(step_s[warm:], dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    curve = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(curve)
    ex, ey = task(args, 4096, seed=99)
    with torch.no_grad():
        eval_loss = float(lossf(model(ex), ey))
    out = {"mode": mode, "ranks": ws, "params": sum(p.numel() for p in model.parameters()),
           "step_s": times.tolist(), "losses": (curve / ws).tolist(), "eval_loss": eval_loss,
           "same_params": same_everywhere(model)}
    dist.destroy_process_group()
    return out if rank == 0 else {}
