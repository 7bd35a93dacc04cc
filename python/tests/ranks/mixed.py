"""Rank side of the mixed-backend check: init_process_group("cpu:<backend>,cuda:<nccl or gloo>")
sends CPU tensors to the backend under test, in the default group and in a new group; CUDA
tensors (where a GPU is) to NCCL."""
import datetime
import os

import torch
import torch.distributed as dist

from tests.ranks import common


def run(args):
    common.import_backend()
    cuda = "nccl" if torch.cuda.is_available() else "gloo"
    if cuda == "nccl" and os.environ.get("FABRICOLL_MIXED_NCCL_HOSTS") == "1":
        # every rank its own NCCL host, so that NCCL carries the CUDA tensors over the network
        # (the plugin named by NCCL_NET_PLUGIN) instead of shared memory or peer access
        os.environ["NCCL_HOSTID"] = f"fabricoll-mixed-{os.environ['RANK']}"
    spec = f"cpu:{common.BACKEND},cuda:{cuda}"
    dist.init_process_group(spec, timeout=datetime.timedelta(seconds=30))
    rank, ws = dist.get_rank(), dist.get_world_size()
    ck = common.Checks()

    def cpu_backend():
        b = dist.group.WORLD._get_backend(torch.device("cpu"))  # pylint: disable=protected-access
        name = type(b).__name__ + " " + type(b).__module__
        want = "gloo" if common.BACKEND == "gloo" else "fabricoll"
        assert want in name.lower(), f"{spec}: CPU tensors go to {name}, not {want}"

    def default_group():
        t = torch.full((5,), float(rank + 1))
        dist.all_reduce(t)
        common.same(t, torch.full((5,), float(ws * (ws + 1) // 2)), True, "all_reduce")

    def new_group():
        g = dist.new_group()
        t = torch.tensor([rank], dtype=torch.int64)
        dist.all_reduce(t, group=g)
        common.same(t, torch.tensor([ws * (ws - 1) // 2]), True, "new group all_reduce")

    def gpu():
        t = torch.ones(4, device=f"cuda:{rank % torch.cuda.device_count()}")
        dist.all_reduce(t)
        assert float(t.sum()) == 4 * ws, t

    ck.run(f"{spec}: CPU backend", cpu_backend)
    ck.run(f"{spec}: all_reduce", default_group)
    ck.run(f"{spec}: new_group", new_group)
    if cuda == "nccl":
        ck.run(f"{spec}: CUDA tensors through nccl", gpu)
    dist.destroy_process_group()
    return ck.result()
