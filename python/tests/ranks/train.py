"""Rank side of the training checks: DDP and FSDP2 (fully_shard on CPU) steps with the backend
under test and with gloo in the same job, from the same seed on the same data; the parameters
after the last step must be equal (bitwise at 2 ranks, within a tight tolerance beyond).
"""
import torch
import torch.distributed as dist
from torch import nn

from tests.ranks import common

STEPS = 5


def model(dtype):
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 10)).to(dtype)


def batch(rank, step, dtype):
    g = torch.Generator().manual_seed(rank * 100 + step)
    return (torch.randn(16, 32, generator=g, dtype=torch.float64).to(dtype),
            torch.randint(0, 10, (16,), generator=g))


def train(module, params, rank, dtype):
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    for step in range(STEPS):
        x, y = batch(rank, step, dtype)
        loss = nn.functional.cross_entropy(module(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def ddp(group, rank, dtype, **kw):
    from torch.nn.parallel import DistributedDataParallel  # pylint: disable=import-outside-toplevel
    m = model(dtype)
    # a small bucket size: several buckets, so several all_reduce in flight per step
    d = DistributedDataParallel(m, process_group=group, bucket_cap_mb=0.005, **kw)
    train(d, d.parameters(), rank, dtype)
    return [p.detach().clone() for p in m.parameters()]


def fsdp(group, rank, dtype):
    from torch.distributed.device_mesh import DeviceMesh  # pylint: disable=import-outside-toplevel
    from torch.distributed.fsdp import fully_shard  # pylint: disable=import-outside-toplevel
    mesh = DeviceMesh.from_group(group, "cpu")
    m = model(dtype)
    for layer in m:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    train(m, m.parameters(), rank, dtype)
    return [p.full_tensor().detach().clone() for p in m.parameters()]


def compare(ours, theirs, ws, what):
    for i, (a, b) in enumerate(zip(ours, theirs)):
        # 4 ranks: the reduction order may differ from gloo's; a few ulps over 5 steps
        common.same(a, b, ws == 2, f"{what}: parameter {i}", ws * 4)


def run(args):
    rank, ws, gloo = common.init(args.get("timeout_s", 60))
    world = dist.group.WORLD
    ck = common.Checks(sync_group=gloo)
    for dtype in (torch.float32, torch.float64):
        name = str(dtype).rsplit(".", maxsplit=1)[-1]
        ck.run(f"DDP {name}", lambda dtype=dtype: compare(
            ddp(world, rank, dtype), ddp(gloo, rank, dtype), ws, "DDP"))
        # fp64 takes FSDP2's SUM-with-divide path, fp32 its ReduceOp.AVG path
        ck.run(f"FSDP2 {name}", lambda dtype=dtype: compare(
            fsdp(world, rank, dtype), fsdp(gloo, rank, dtype), ws, "FSDP2"))
    ck.run("DDP gradient_as_bucket_view, static_graph", lambda: compare(
        ddp(world, rank, torch.float32, gradient_as_bucket_view=True, static_graph=True),
        ddp(gloo, rank, torch.float32, gradient_as_bucket_view=True, static_graph=True),
        ws, "DDP bucket view"))
    dist.destroy_process_group()
    return ck.result()
