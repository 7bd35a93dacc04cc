"""Rank side of the CUDA-tensor checks (needs a GPU; tests.gpu_cuda runs it): the default group
is "fabricoll" for CPU and CUDA tensors, every rank on device rank % device_count. Each check
compares with what every rank can compute itself from every rank's input (common.gen), and
reads results back only after more work on the stream, so that stream order is what is tested.
"""
import torch
import torch.distributed as dist
import torch.nn as nn

from tests.ranks import common


def run(args):  # pylint: disable=too-many-locals,too-many-statements
    rank, ws, dev, cpu = common.init_cuda(60)
    ck = common.Checks(sync_group=cpu)
    inputs = lambda dt, n, seed, kind="normal": [common.gen(dt, (n,), r, seed, kind)  # noqa: E731
                                                 for r in range(ws)]

    def backend_is_ours():
        b = dist.group.WORLD._get_backend(dev)  # pylint: disable=protected-access
        assert "fabricoll" in type(b).__module__.lower() + type(b).__name__.lower(), type(b)

    def all_reduce(dt, op, kind="normal", n=1000, stream=None):
        xs = inputs(dt, n, 1, kind)
        want = {dist.ReduceOp.SUM: lambda: sum(x.double() for x in xs),
                dist.ReduceOp.MAX: lambda: torch.stack(xs).amax(0),
                dist.ReduceOp.MIN: lambda: torch.stack(xs).amin(0),
                dist.ReduceOp.PRODUCT: lambda: torch.stack([x.double() for x in xs]).prod(0),
                dist.ReduceOp.AVG: lambda: sum(x.double() for x in xs) / ws}[op]().to(dt)

        def check():
            t = xs[rank].to(dev)
            dist.all_reduce(t, op=op)
            common.same(t.cpu(), want, False, f"all_reduce {dt} {op}", ws)

        if stream is None:
            check()
        else:
            with torch.cuda.stream(stream):
                check()

    def all_reduce_between_kernels():
        # on a stream of its own: a kernel writes the input, the collective sums it, a kernel
        # doubles the output; the host waits once, at the end
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            t = torch.empty(1 << 20, device=dev)
            acc = torch.zeros_like(t)
            for i in range(20):
                t.fill_(float(rank + i))
                dist.all_reduce(t)
                acc.add_(t * 2)
        s.synchronize()
        want = sum(2 * sum(r + i for r in range(ws)) for i in range(20))
        assert torch.all(acc == want), (float(acc.min()), float(acc.max()), want)

    def several_slices():
        xs = inputs(torch.float32, 3 << 20, 2)  # 12 MiB: several staging slices
        t = xs[rank].to(dev)
        dist.all_reduce(t)
        common.same(t.cpu(), sum(x.double() for x in xs).float(), False, "12 MiB", ws)

    def premul_sum():
        xs = inputs(torch.float32, 100, 3)
        t = xs[rank].to(dev)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))  # pylint: disable=protected-access
        common.same(t.cpu(), (sum(x.double() for x in xs) * 0.5).float(), False, "premul", ws)

    def not_contiguous():
        x = torch.arange(12, dtype=torch.float32, device=dev).reshape(3, 4) + rank
        v = x.t()  # a transposed view: made dense on the stream, copied back after
        dist.all_reduce(v)
        want = (torch.arange(12, dtype=torch.float32).reshape(3, 4) * ws
                + sum(range(ws))).t()
        common.same(v.cpu(), want, True, "transposed view")

    def all_gather_and_reduce_scatter():
        xs = inputs(torch.float32, 256, 4)
        out = torch.empty(256 * ws, device=dev)
        dist.all_gather_into_tensor(out, xs[rank].to(dev))
        common.same(out.cpu(), torch.cat(xs), True, "all_gather_into_tensor")
        ys = inputs(torch.bfloat16, 64 * ws, 5)
        o = torch.empty(64, dtype=torch.bfloat16, device=dev)
        dist.reduce_scatter_tensor(o, ys[rank].to(dev), op=dist.ReduceOp.AVG)
        want = (sum(y.double() for y in ys) / ws).to(torch.bfloat16)[64 * rank:64 * (rank + 1)]
        common.same(o.cpu(), want, False, "reduce_scatter_tensor avg", ws)

    def rooted():
        xs = inputs(torch.int32, 300, 6)
        t = xs[rank].to(dev)
        dist.broadcast(t, src=1 % ws)
        common.same(t.cpu(), xs[1 % ws], True, "broadcast")
        t = xs[rank].to(dev)
        dist.reduce(t, dst=0, op=dist.ReduceOp.MAX)
        if rank == 0:
            common.same(t.cpu(), torch.stack(xs).amax(0), True, "reduce")
        root = ws - 1
        out = torch.empty(300 * ws, dtype=torch.int32, device=dev) if rank == root else None
        dist.gather_into_tensor(out, xs[rank].to(dev), dst=root)
        if rank == root:
            common.same(out.cpu(), torch.cat(xs), True, "gather_into_tensor")

    def all_to_all():
        xs = inputs(torch.float64, 10 * ws, 7)
        out = torch.empty(10 * ws, dtype=torch.float64, device=dev)
        dist.all_to_all_single(out, xs[rank].to(dev))
        want = torch.cat([xs[r][10 * rank:10 * (rank + 1)] for r in range(ws)])
        common.same(out.cpu(), want, True, "all_to_all_single")
        out2 = torch.empty(10 * ws, dtype=torch.float64, device=dev)
        dist.all_to_all_single(out2, xs[rank].to(dev), [10] * ws, [10] * ws)
        common.same(out2.cpu(), want, True, "all_to_all_single, equal splits")

    def refused(fn, words):
        try:
            fn()
        except Exception as e:  # pylint: disable=broad-except  # the refusal under test
            assert words in str(e), f"refused with another error: {e}"
            return
        raise AssertionError(f"not refused (expected an error saying {words!r})")

    def uneven_all_to_all():
        splits = [1] * (ws - 1) + [2]
        t = torch.zeros(ws + 1, device=dev)
        dist.all_to_all_single(t, t.clone(), splits, splits)

    def list_forms():
        xs = inputs(torch.float32, 50, 10)
        outs = [torch.empty(50, device=dev) for _ in range(ws)]
        dist.all_gather(outs, xs[rank].to(dev))
        for r in range(ws):
            common.same(outs[r].cpu(), xs[r], True, f"all_gather block {r}")
        ins = [common.gen(torch.float32, (50,), rank, 11 + j).to(dev) for j in range(ws)]
        out = torch.empty(50, device=dev)
        dist.reduce_scatter(out, ins)
        want = sum(common.gen(torch.float32, (50,), r, 11 + rank).double() for r in range(ws))
        common.same(out.cpu(), want.float(), False, "reduce_scatter", ws)

    def scatter():
        t = torch.empty(4, device=dev)
        dist.scatter(t, [torch.ones(4, device=dev)] * ws if rank == 0 else None, src=0)

    def send_recv():
        to, frm = (rank + 1) % ws, (rank - 1) % ws
        x = common.gen(torch.float16, (500,), rank, 8).to(dev)
        y = torch.empty(500, dtype=torch.float16, device=dev)
        if rank == 0:
            dist.send(x, to, tag=3)
            dist.recv(y, frm, tag=3)
        else:
            dist.recv(y, frm, tag=3)
            dist.send(x, to, tag=3)
        common.same(y.cpu(), common.gen(torch.float16, (500,), frm, 8), True, "send/recv")

    def async_and_futures():
        xs = inputs(torch.float32, 1000, 9)
        t = xs[rank].to(dev)
        work = dist.all_reduce(t, async_op=True)
        fut = work.get_future().then(lambda f: f.value()[0] * 2)
        work.wait()  # the current stream waits; the host does not
        doubled = fut.wait()
        want = sum(x.double() for x in xs).float()
        common.same(t.cpu(), want, False, "async all_reduce", ws)
        common.same(doubled.cpu(), want * 2, False, "future's then", ws)

    def barrier_after_cuda_work():
        t = torch.ones(1 << 22, device=dev)
        for _ in range(5):
            dist.all_reduce(t)
        dist.barrier()
        # the barrier waited on the host for the collectives before it, as NCCL's does
        assert torch.cuda.current_stream().query(), "the stream still runs after the barrier"
        assert float(t[0]) == float(ws ** 5), float(t[0])

    def ddp_steps():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(dev)
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(rank)
        for _ in range(5):
            x = torch.randn(32, 64, generator=g).to(dev)
            y = torch.randint(0, 10, (32,), generator=g).to(dev)
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
        every = [torch.empty_like(flat) for _ in range(ws)]
        dist.all_gather(every, flat, group=cpu)
        for r in range(ws):
            common.same(every[r], flat, True, f"DDP parameters of rank {r}")

    ck.run("CUDA tensors go to fabricoll", backend_is_ours)
    for dt, op, kind in [(torch.float32, dist.ReduceOp.SUM, "normal"),
                         (torch.float16, dist.ReduceOp.SUM, "normal"),
                         (torch.bfloat16, dist.ReduceOp.AVG, "normal"),
                         (torch.float64, dist.ReduceOp.MIN, "normal"),
                         (torch.int32, dist.ReduceOp.MAX, "normal"),
                         (torch.int64, dist.ReduceOp.PRODUCT, "prod"),
                         (torch.uint8, dist.ReduceOp.SUM, "normal")]:
        ck.run(f"all_reduce {dt} {op} on the default stream", lambda: all_reduce(dt, op, kind))
    ck.run("all_reduce on a stream of its own",
           lambda: all_reduce(torch.float32, dist.ReduceOp.SUM, stream=torch.cuda.Stream()))
    ck.run("all_reduce between kernels, the host waiting once", all_reduce_between_kernels)
    ck.run("all_reduce of several slices", several_slices)
    ck.run("all_reduce PREMUL_SUM", premul_sum)
    ck.run("all_reduce of a transposed view", not_contiguous)
    ck.run("all_gather_into_tensor, reduce_scatter_tensor", all_gather_and_reduce_scatter)
    ck.run("broadcast, reduce, gather_into_tensor", rooted)
    ck.run("all_to_all_single", all_to_all)
    ck.run("all_to_all_single with uneven splits is refused",
           lambda: refused(uneven_all_to_all, "uneven splits are not supported on CUDA"))
    ck.run("all_gather and reduce_scatter of lists", list_forms)
    ck.run("send and recv with a tag", send_recv)
    ck.run("async all_reduce, wait and futures", async_and_futures)
    ck.run("barrier after CUDA work", barrier_after_cuda_work)
    ck.run("DDP on CUDA", ddp_steps)
    ck.run("scatter is refused, naming what runs on CUDA tensors",
           lambda: refused(scatter, "on CUDA tensors the compiled front"))
    dist.destroy_process_group()
    return ck.result()
