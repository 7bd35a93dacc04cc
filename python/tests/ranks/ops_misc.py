"""Rank side of the remaining checks (called by tests.ranks.ops_move): send/recv with tags,
batch_isend_irecv, async_op futures and then() chains, new_group subsets, DeviceMesh and
DTensor, functional collectives, Works dropped unwaited or waited with a timeout."""
import datetime
import time

import torch
import torch.distributed as dist

from tests.ranks import common


def check_p2p(ck, rank, ws, seed):
    peer = rank ^ 1  # pairs (0, 1), (2, 3)
    a = common.gen(torch.float32, (100,), rank, seed)
    b = common.gen(torch.int64, (7,), rank, seed + 1)

    def tagged():
        if rank % 2 == 0:
            # two messages on different tags, received in the other order
            w1 = dist.isend(a, peer, tag=7)
            w2 = dist.isend(b, peer, tag=3)
            w1.wait()
            w2.wait()
        else:
            rb = torch.empty(7, dtype=torch.int64)
            dist.recv(rb, peer, tag=3)
            ra = torch.empty(100)
            dist.recv(ra, peer, tag=7)
            common.same(ra, common.gen(torch.float32, (100,), peer, seed), True, "tag 7")
            common.same(rb, common.gen(torch.int64, (7,), peer, seed + 1), True, "tag 3")

    def ping_pong():
        t = torch.zeros(3)
        for i in range(4):
            if (rank + i) % 2 == 0:
                dist.send(torch.zeros(3) + rank + i, peer)
            else:
                dist.recv(t, peer)
                common.same(t, torch.zeros(3) + peer + i, True, f"round {i}")

    def batch():
        ops = [dist.P2POp(dist.isend, a, (rank + 1) % ws),
               dist.P2POp(dist.irecv, buf := torch.empty(100), (rank - 1) % ws)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        common.same(buf, common.gen(torch.float32, (100,), (rank - 1) % ws, seed), True,
                    "batch_isend_irecv ring")

    def any_source():
        if rank == 0:
            t = torch.empty(1)
            src = dist.recv(t)
            common.same(t, torch.tensor([float(src)]), True, "recv from any source")
        elif rank == 1:
            dist.send(torch.tensor([1.0]), 0)

    ck.run("send/recv tags 7 and 3 out of order", tagged)
    ck.run("send/recv ping-pong", ping_pong)
    ck.run("batch_isend_irecv ring", batch)
    ck.run("recv from any source", any_source, ["source", "src", "any"])


def fabricoll_compiled():
    """Whether fabricoll's groups run on its compiled front (fabricoll._c10d)."""
    import fabricoll.torch  # pylint: disable=import-outside-toplevel

    return fabricoll.torch.compiled()


def check_async(ck, gloo, rank, ws, seed):
    xs = [common.gen(torch.float64, (64,), r, seed) for r in range(ws)]
    total = sum(xs)

    def futures():
        t = xs[rank].clone()
        work = dist.all_reduce(t, async_op=True)
        fut = work.get_future().then(lambda f: f.value()[0] * 2).then(lambda f: f.value() + 1)
        got = fut.wait()
        common.same(t, total, ws == 2, "async all_reduce", ws)
        common.same(got, total * 2 + 1, ws == 2, "then() chain", ws)

    def completed():
        t = xs[rank].clone()
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        # torch hands the caller a holder of a Python backend's Work (PyWorkHolder in
        # PyProcessGroup.hpp) that forwards only wait() and get_future(): is_completed() and
        # is_success() read the holder's own flags, which no Python backend can set (returning
        # torch's own Work from a future does not help: it is wrapped too). Completion is what
        # the future says; is_completed() is reported, not required, until torch forwards it.
        assert work.get_future().done(), "the Work's future is not done after Work.wait()"
        common.same(t, total, ws == 2, "all_reduce after wait()", ws)
        if common.BACKEND != "gloo" and not work.is_completed():
            print("known torch limit: Work.is_completed() is False for a Python backend")

    def many_in_flight():
        ts = [xs[rank].clone() * (i + 1) for i in range(8)]
        works = [dist.all_reduce(t, async_op=True) for t in ts]
        futs = [w.get_future() for w in works]
        torch.futures.wait_all(futs)
        for i, t in enumerate(ts):
            common.same(t, total * (i + 1), False, f"in-flight all_reduce {i}", ws)

    def future_only():
        # DDP's way: never wait() on the Work, only on its future
        t = xs[rank].clone()
        fut = dist.all_reduce(t, async_op=True).get_future()
        fut.wait()
        common.same(t, total, ws == 2, "future-only all_reduce", ws)

    def dropped():
        # a Work dropped unwaited still completes (the library finishes it) and frees its buffers
        t = xs[rank].clone()
        dist.all_reduce(t, async_op=True)
        deadline = time.monotonic() + 20
        while not torch.allclose(t, total, rtol=0, atol=1e-9):
            assert time.monotonic() < deadline, "a dropped async all_reduce never completed"
            time.sleep(0.001)

    def timed_wait():
        # wait(timeout) raises while the peers are late, and the operation stays in flight. The
        # peers call only once rank 0's timed wait has failed (rank 0 says so over the gloo
        # group), so no sleep races the timeout on a loaded machine.
        t = xs[rank].clone()
        told = torch.zeros(1)
        if rank != 0:
            dist.broadcast(told, 0, group=gloo)
        work = dist.all_reduce(t, async_op=True)
        if rank == 0:
            try:
                work.wait(datetime.timedelta(milliseconds=200))
                raise AssertionError("wait(200 ms) returned while the peers had not called yet")
            except (TimeoutError, RuntimeError) as e:
                assert common.BACKEND != "fabricoll" or "not complete after" in str(e), e
            dist.broadcast(told, 0, group=gloo)
        assert work.wait(datetime.timedelta(seconds=30))
        common.same(t, total, ws == 2, "all_reduce after a timed-out wait", ws)
        if common.BACKEND != "fabricoll" or fabricoll_compiled():
            assert work.is_completed() and work.is_success(), "done, yet not is_completed()"

    ck.run("async_op future then() chain", futures)
    ck.run("async Work dropped unwaited completes", dropped)
    ck.run("wait(timeout) while the peer is late", timed_wait)
    ck.run("Work's future done after wait()", completed)
    ck.run("8 async all_reduce in flight, wait_all", many_in_flight)
    ck.run("future completes without Work.wait", future_only)


def check_groups(ck, rank, ws, seed):
    def subsets():
        evens = dist.new_group([r for r in range(ws) if r % 2 == 0])
        odds = dist.new_group([r for r in range(ws) if r % 2 == 1])
        mine, members = (evens, range(0, ws, 2)) if rank % 2 == 0 else (odds, range(1, ws, 2))
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t, group=mine)
        common.same(t, torch.tensor([float(sum(r + 1 for r in members))]), True, "subset sum")
        first = min(members)
        b = torch.tensor([rank])
        dist.broadcast(b, src=first, group=mine)  # src is a global rank
        common.same(b, torch.tensor([first]), True, "subset broadcast")

    def single():
        alone = [dist.new_group([r]) for r in range(ws)][rank]
        t = torch.tensor([3.0, rank])
        dist.all_reduce(t, group=alone)
        common.same(t, torch.tensor([3.0, rank]), True, "one-rank group")

    def subgroups():
        sub, _ = dist.new_subgroups(group_size=2)
        t = torch.tensor([rank], dtype=torch.int32)
        dist.all_reduce(t, group=sub)
        base = rank - rank % 2
        common.same(t, torch.tensor([2 * base + 1], dtype=torch.int32), True, "new_subgroups")

    ck.run("new_group even/odd subsets", subsets)
    ck.run("new_group of one rank", single)
    ck.run("new_subgroups of 2", subgroups)


def check_mesh(ck, rank, ws, seed):
    # pylint: disable-next=import-outside-toplevel
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import (  # pylint: disable=import-outside-toplevel
        Replicate, Shard, distribute_tensor)

    full = common.gen(torch.float32, (ws * 4, 6), 0, seed)

    def mesh_groups():
        mesh = init_device_mesh("cpu", (2, ws // 2), mesh_dim_names=("dp", "tp"))
        for dim in ("dp", "tp"):
            t = torch.tensor([float(rank)])
            g = mesh[dim].get_group()
            dist.all_reduce(t, group=g)
            ranks = dist.get_process_group_ranks(g)
            common.same(t, torch.tensor([float(sum(ranks))]), True, f"mesh dim {dim}")

    def dtensor():
        mesh = init_device_mesh("cpu", (ws,))
        d = distribute_tensor(full, mesh, [Shard(0)])
        common.same(d.to_local(), full.chunk(ws)[rank], True, "Shard(0) local block")
        common.same(d.full_tensor(), full, True, "full_tensor (all_gather)")
        common.same(d.redistribute(mesh, [Replicate()]).to_local(), full, True, "Replicate")
        d2 = distribute_tensor(full, mesh, [Shard(1)])
        back = d2.redistribute(mesh, [Shard(0)])  # all_to_all
        common.same(back.to_local(), full.chunk(ws)[rank], True, "Shard(1) -> Shard(0)")
        s = (d2 * 2).sum()  # a Partial reduced to Replicate: all_reduce
        common.same(s.full_tensor(), (full * 2).sum(), False, "sum over shards", ws)

    ck.run("DeviceMesh 2-D groups", mesh_groups)
    ck.run("DTensor shard, gather, redistribute", dtensor)


def check_functional(ck, rank, ws, seed):
    import torch.distributed._functional_collectives as fc  # pylint: disable=C0415

    xs = [common.gen(torch.float32, (ws * 2,), r, seed) for r in range(ws)]
    group = dist.group.WORLD

    def wait(t):
        return fc.wait_tensor(t) if isinstance(t, torch.Tensor) else t

    def funcs():
        s = wait(fc.all_reduce(xs[rank], "sum", group))
        common.same(s, sum(xs), ws == 2, "functional all_reduce", ws)
        gather = getattr(fc, "all_gather_single", fc.all_gather_tensor)
        g = wait(gather(xs[rank], 0, group))
        common.same(g, torch.cat(xs), True, "functional all_gather_tensor")
        scatter = getattr(fc, "reduce_scatter_single", fc.reduce_scatter_tensor)
        rs = wait(scatter(xs[rank], "sum", 0, group))
        common.same(rs, sum(xs)[rank * 2:(rank + 1) * 2], ws == 2, "functional reduce_scatter", ws)
        a = wait(fc.all_to_all_single(xs[rank], None, None, group))
        want = torch.cat([xs[r][rank * 2:(rank + 1) * 2] for r in range(ws)])
        common.same(a, want, True, "functional all_to_all_single")
        b = wait(fc.broadcast(xs[rank], 1, group))
        common.same(b, xs[1], True, "functional broadcast")

    ck.run("functional collectives", funcs)


def run_checks(ck, gloo, rank, ws, seed):
    check_p2p(ck, rank, ws, seed)
    check_async(ck, gloo, rank, ws, seed + 10)
    check_groups(ck, rank, ws, seed + 20)
    check_mesh(ck, rank, ws, seed + 30)
    check_functional(ck, rank, ws, seed + 40)
