"""Rank side of the data-movement checks: broadcast, all_gather (list, tensor, uneven),
all_to_all and all_to_all_single (uneven splits with zeros), gather, scatter, barrier and the
object collectives, over every CPU dtype (no reduction: every type must pass), each against a
reference every rank computes and, where gloo has the form, against gloo in the same job.
Point-to-point, futures, subgroups, DeviceMesh and functional collectives: tests.ranks.ops_misc.
"""
import os

import torch
import torch.distributed as dist

from tests.ranks import common, ops_misc
from tests.ranks.ops_reduce import GLOO_LACKS

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128,
          torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32, torch.uint64]


def short(dtype):
    return str(dtype).rsplit(".", maxsplit=1)[-1]


def split(i, j):
    """Elements rank i sends rank j in the uneven all-to-all: 0, 1 or 2, some zero."""
    return (2 * i + j) % 3


def check_types(ck, gloo, rank, ws, seed):
    for dtype in DTYPES:
        seed += 10
        xs = [common.gen(dtype, (37,), r, seed) for r in range(ws)]

        def bcast(dtype=dtype, xs=xs):
            for root in range(ws):
                t = xs[rank].clone()
                dist.broadcast(t, src=root)
                common.same(t, xs[root], True, f"broadcast from {root}")
                if dtype not in GLOO_LACKS:
                    g = xs[rank].clone()
                    dist.broadcast(g, src=root, group=gloo)
                    common.same(t, g, True, "against gloo")

        def gather_tensor(dtype=dtype, xs=xs):
            out = torch.empty(ws * 37, dtype=dtype)
            dist.all_gather_into_tensor(out, xs[rank].clone())
            common.same(out, torch.cat(xs), True, "all_gather_into_tensor")

        def gather_stacked(dtype=dtype, xs=xs):
            stacked = torch.empty(ws, 37, dtype=dtype)
            dist.all_gather_into_tensor(stacked, xs[rank].clone())
            common.same(stacked, torch.stack(xs), True, "all_gather_into_tensor (stacked)")

        def gather_list(dtype=dtype, xs=xs):
            outs = [torch.empty(37, dtype=dtype) for _ in range(ws)]
            dist.all_gather(outs, xs[rank].clone())
            for r in range(ws):
                common.same(outs[r], xs[r], True, f"all_gather block {r}")
            if dtype not in GLOO_LACKS:
                gouts = [torch.empty(37, dtype=dtype) for _ in range(ws)]
                dist.all_gather(gouts, xs[rank].clone(), group=gloo)
                common.same(torch.stack(outs), torch.stack(gouts), True, "against gloo")

        def a2a_single(dtype=dtype, xs=xs):
            ins = [common.gen(dtype, (ws * 3,), r, seed + 1) for r in range(ws)]
            out = torch.empty(ws * 3, dtype=dtype)
            dist.all_to_all_single(out, ins[rank].clone())
            want = torch.cat([ins[r][rank * 3:(rank + 1) * 3] for r in range(ws)])
            common.same(out, want, True, "all_to_all_single (even)")

        ck.run(f"broadcast {short(dtype)}", bcast)
        ck.run(f"all_gather_into_tensor {short(dtype)}", gather_tensor)
        ck.run(f"all_gather_into_tensor stacked {short(dtype)}", gather_stacked)
        ck.run(f"all_gather list {short(dtype)}", gather_list)
        ck.run(f"all_to_all_single {short(dtype)}", a2a_single)


def check_uneven(ck, gloo, rank, ws, seed):
    # rank r sends its rows [offset(r, j), +split(r, j)) to rank j; rows of 5 int64
    def rows_of(r):
        n = sum(split(r, j) for j in range(ws))
        return common.gen(torch.int64, (n, 5), r, seed)

    def block(r, j):
        off = sum(split(r, k) for k in range(j))
        return rows_of(r)[off:off + split(r, j)]

    want = torch.cat([block(i, rank) for i in range(ws)])

    def a2a_single_uneven():
        ins = [split(rank, j) for j in range(ws)]
        outs = [split(i, rank) for i in range(ws)]
        out = torch.empty(sum(outs), 5, dtype=torch.int64)
        dist.all_to_all_single(out, rows_of(rank), output_split_sizes=outs, input_split_sizes=ins)
        common.same(out, want, True, f"all_to_all_single in {ins} out {outs}")
        g = torch.empty_like(out)
        dist.all_to_all_single(g, rows_of(rank), output_split_sizes=outs, input_split_sizes=ins,
                               group=gloo)
        common.same(out, g, True, "against gloo")

    def a2a_list_uneven():
        ins = [block(rank, j).clone() for j in range(ws)]
        outs = [torch.empty(split(i, rank), 5, dtype=torch.int64) for i in range(ws)]
        dist.all_to_all(outs, ins)
        common.same(torch.cat(outs), want, True, "all_to_all (list)")

    def all_gather_uneven():
        mine = common.gen(torch.float32, (rank + 1, 3), rank, seed + 2)
        outs = [torch.empty(r + 1, 3) for r in range(ws)]
        dist.all_gather(outs, mine)
        for r in range(ws):
            common.same(outs[r], common.gen(torch.float32, (r + 1, 3), r, seed + 2), True,
                        f"uneven all_gather block {r}")

    ck.run("all_to_all_single uneven splits (zeros)", a2a_single_uneven)
    ck.run("all_to_all list uneven (zeros)", a2a_list_uneven)
    ck.run("all_gather list uneven", all_gather_uneven, ["all_gather", "size", "uneven"])


def check_rooted(ck, gloo, rank, ws, seed):
    for root in range(ws):
        xs = [common.gen(torch.float64, (11,), r, seed + root) for r in range(ws)]

        def gather(root=root, xs=xs):
            outs = [torch.empty(11, dtype=torch.float64) for _ in range(ws)] \
                if rank == root else None
            dist.gather(xs[rank].clone(), outs, dst=root)
            gouts = [torch.empty(11, dtype=torch.float64) for _ in range(ws)] \
                if rank == root else None
            dist.gather(xs[rank].clone(), gouts, dst=root, group=gloo)
            if rank == root:
                for r in range(ws):
                    common.same(outs[r], xs[r], True, f"gather block {r}")
                    common.same(outs[r], gouts[r], True, f"gather block {r} against gloo")

        def scatter(root=root):
            blocks = [common.gen(torch.int32, (9,), 100 + i, seed + root) for i in range(ws)]
            out = torch.empty(9, dtype=torch.int32)
            dist.scatter(out, blocks if rank == root else None, src=root)
            common.same(out, blocks[rank], True, "scatter")

        def gather_tensor(root=root, xs=xs):
            # torch's gather_into_tensor(input, output): a flat and a stacked output
            flat = torch.full((ws * 11,), -1.0, dtype=torch.float64)
            dist.gather_into_tensor(xs[rank].clone(), flat if rank == root else None, dst=root)
            stacked = torch.full((ws, 11), -1.0, dtype=torch.float64)
            dist.gather_into_tensor(xs[rank].clone(), stacked if rank == root else None, dst=root)
            if rank == root:
                common.same(flat, torch.cat(xs), True, "gather_into_tensor")
                common.same(stacked, torch.stack(xs), True, "gather_into_tensor (stacked)")

        ck.run(f"gather to {root}", gather)
        if hasattr(dist, "gather_into_tensor"):  # torch 2.11 has none
            ck.run(f"gather_into_tensor to {root}", gather_tensor, common.GATHER_SINGLE_MISSING)
        ck.run(f"scatter from {root}", scatter)

    def barriers():
        for _ in range(5):
            dist.barrier()
        w = dist.barrier(async_op=True)
        w.wait()

    def objects():
        got = [None] * ws
        dist.all_gather_object(got, {"rank": rank, "pad": "x" * (rank * 100)})
        assert got == [{"rank": r, "pad": "x" * (r * 100)} for r in range(ws)], got
        objs = [f"from {rank}", list(range(rank))] if rank == 0 else [None, None]
        dist.broadcast_object_list(objs, src=0)
        assert objs == ["from 0", []], objs
        out = [None] * ws if rank == ws - 1 else None
        dist.gather_object(("g", rank), out, dst=ws - 1)
        if rank == ws - 1:
            assert out == [("g", r) for r in range(ws)], out
        box = [None]
        dist.scatter_object_list(box, [("s", r) for r in range(ws)] if rank == 0 else None, src=0)
        assert box == [("s", rank)], box

    ck.run("barrier (5 blocking, 1 async)", barriers)
    ck.run("object collectives", objects)


def run(args):
    rank, ws, gloo = common.init(args.get("timeout_s", 30))
    ck = common.Checks(sync_group=gloo)

    def implementation():
        # FABRICOLL_TORCH_EXT=1 (scripts/torch-tests.sh): the compiled front; 0: Python alone
        module = type(dist.group.WORLD._get_backend(torch.device("cpu"))).__module__  # pylint: disable=protected-access
        want = {"1": "fabricoll._c10d", "0": "fabricoll._backend"}.get(
            os.environ.get("FABRICOLL_TORCH_EXT", ""), module)
        assert common.BACKEND != "fabricoll" or module == want, f"the backend is {module}, not {want}"

    ck.run("the backend's implementation", implementation)
    check_types(ck, gloo, rank, ws, 10)
    check_uneven(ck, gloo, rank, ws, 400)
    check_rooted(ck, gloo, rank, ws, 500)
    ops_misc.run_checks(ck, gloo, rank, ws, 900)
    dist.destroy_process_group()
    return ck.result()
