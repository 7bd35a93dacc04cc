"""Rank side of the reduction checks: all_reduce over every ReduceOp x CPU dtype, reduce,
reduce_scatter (list, tensor, uneven) and the coalesced forms, each against gloo in the same
job and against a reference every rank computes from all ranks' inputs.

Required: the float types with SUM, PRODUCT, MIN, MAX, AVG, PREMUL_SUM; the integer types the
engines have with SUM, PRODUCT, MIN, MAX, BAND, BOR, BXOR; bool with the ops gloo has. The
other pairs may be refused, but only by an error that names the type or the op.
"""
import torch
import torch.distributed as dist

from tests.ranks import common

R = dist.ReduceOp
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
OPTIONAL_TYPES = [torch.int16, torch.uint16, torch.uint32, torch.uint64, torch.complex64,
                  torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2]
OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "PREMUL_SUM", "BAND", "BOR", "BXOR"]
N = 1027  # not a multiple of the rank count, nor of a vector width


def make_op(name, factor=2.0):
    if name == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(factor)  # pylint: disable=protected-access
    return getattr(R, name)


def required(dtype, op):
    if dtype in FLOATS:
        return op in ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "PREMUL_SUM")
    if dtype in INTS:
        return op in ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
    if dtype == torch.bool:
        return op in ("SUM", "MIN", "MAX", "BAND", "BOR")
    return False


GLOO_LACKS = {torch.int16, torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn,
              torch.float8_e5m2}


def gloo_has(dtype, op):
    """Whether gloo reduces this pair (asking it otherwise can fail its group later, in the
    next call, as PREMUL_SUM does)."""
    if dtype in GLOO_LACKS or op == "PREMUL_SUM":
        return False
    if op == "AVG":
        return dtype.is_floating_point or dtype.is_complex
    if op in ("BAND", "BOR", "BXOR"):
        return not (dtype.is_floating_point or dtype.is_complex)
    return not (dtype.is_complex and op in ("PRODUCT", "MIN", "MAX"))


def wide(t):
    if t.dtype == torch.bool or not (t.dtype.is_floating_point or t.dtype.is_complex):
        return t.to(torch.int64)
    return t.to(torch.complex128 if t.dtype.is_complex else torch.float64)


def reference(xs, op, factor=2.0):
    """The reduction of xs (one per rank), computed in a wide type and cast back."""
    dtype = xs[0].dtype
    w = [wide(x) for x in xs]
    acc = w[0].clone()
    if op == "PREMUL_SUM":
        acc = acc * factor
    for x in w[1:]:
        if op in ("SUM", "AVG"):
            acc = acc + x
        elif op == "PREMUL_SUM":
            acc = acc + x * factor
        elif op == "PRODUCT":
            acc = acc * x
        elif op == "MIN":
            acc = torch.minimum(acc, x)
        elif op == "MAX":
            acc = torch.maximum(acc, x)
        elif op == "BAND":
            acc = acc & x
        elif op == "BOR":
            acc = acc | x
        elif op == "BXOR":
            acc = acc ^ x
    if op == "AVG":
        if acc.dtype == torch.int64:
            # integers: the sum in the type (wrapping), then divided toward zero, as NCCL does
            acc = torch.div(wrap(acc, dtype), len(xs), rounding_mode="trunc")
        else:
            acc = acc / len(xs)
    if dtype == torch.bool:
        return acc != 0
    return wrap(acc, dtype).to(dtype)


def wrap(acc, dtype):
    """An integer result computed in int64, wrapped around as the C type of `dtype` does."""
    if dtype == torch.bool or dtype.is_floating_point or dtype.is_complex or dtype.itemsize >= 8:
        return acc  # (64-bit inputs here are too small to wrap)
    info = torch.iinfo(dtype)
    span = info.max - info.min + 1
    return torch.remainder(acc - info.min, span) + info.min


def exact(dtype, op, ws):
    """Whether the result must equal the reference bit for bit (integer, 2 ranks, order-free)."""
    return (not (dtype.is_floating_point or dtype.is_complex)) or ws == 2 or op in ("MIN", "MAX")


def names(dtype, op):
    d = str(dtype).rsplit(".", maxsplit=1)[-1]
    return [d, d.replace("float8", "fp8"), op, op.replace("PRODUCT", "PROD")]


def check_all_reduce(ck, gloo, rank, ws, dtype, op, seed):
    kind = "prod" if op == "PRODUCT" else "normal"
    xs = [common.gen(dtype, (N,), r, seed, kind) for r in range(ws)]

    def body():
        t = xs[rank].clone()
        dist.all_reduce(t, op=make_op(op))
        # computed after the call: a pair with no meaning (BAND on floats) must have raised
        want = reference(xs, op)
        common.same(t, want, exact(dtype, op, ws), "against the reference", ws)
        if not gloo_has(dtype, op):
            return  # the reference alone decides
        g = xs[rank].clone()
        dist.all_reduce(g, op=make_op(op), group=gloo)
        common.same(t, g, exact(dtype, op, ws) or ws == 2, "against gloo", ws)

    allow = None if required(dtype, op) else names(dtype, op)
    ck.run(f"all_reduce {op} {dtype}", body, allow)


def check_reduce(ck, gloo, rank, ws, seed):
    for root in range(ws):
        for dtype, op in ((torch.float32, "SUM"), (torch.int32, "MAX"), (torch.bfloat16, "AVG"),
                          (torch.float64, "PREMUL_SUM"), (torch.int64, "PRODUCT")):
            xs = [common.gen(dtype, (N,), r, seed + root, "prod" if op == "PRODUCT" else "x")
                  for r in range(ws)]
            want = reference(xs, op)

            def body(dtype=dtype, op=op, xs=xs, want=want, root=root):
                t = xs[rank].clone()
                dist.reduce(t, dst=root, op=make_op(op))
                if rank == root:  # (a non-root's buffer is scratch space, as with gloo)
                    common.same(t, want, exact(dtype, op, ws), "reduce at the root", ws)
                if gloo_has(dtype, op):
                    g = xs[rank].clone()
                    dist.reduce(g, dst=root, op=make_op(op), group=gloo)
                    if rank == root:
                        common.same(t, g, exact(dtype, op, ws), "against gloo", ws)

            ck.run(f"reduce {op} {dtype} root {root}", body)


def check_reduce_scatter(ck, gloo, rank, ws, seed):
    for dtype, op in ((torch.float32, "SUM"), (torch.int64, "PRODUCT"), (torch.float16, "MIN"),
                      (torch.float64, "AVG"), (torch.uint8, "BXOR")):
        kind = "prod" if op == "PRODUCT" else "x"
        per = 333
        xs = [common.gen(dtype, (ws * per,), r, seed, kind) for r in range(ws)]
        want = reference(xs, op)[rank * per:(rank + 1) * per]

        def tensor_form(dtype=dtype, op=op, xs=xs, want=want):
            out = torch.empty(per, dtype=dtype)
            dist.reduce_scatter_tensor(out, xs[rank].clone(), op=make_op(op))
            common.same(out, want, exact(dtype, op, ws), "reduce_scatter_tensor", ws)
            if gloo_has(dtype, op):
                g = torch.empty(per, dtype=dtype)
                dist.reduce_scatter_tensor(g, xs[rank].clone(), op=make_op(op), group=gloo)
                common.same(out, g, exact(dtype, op, ws), "against gloo", ws)

        def list_form(dtype=dtype, op=op, xs=xs, want=want):
            out = torch.empty(per, dtype=dtype)
            dist.reduce_scatter(out, list(xs[rank].clone().chunk(ws)), op=make_op(op))
            common.same(out, want, exact(dtype, op, ws), "reduce_scatter (list)", ws)

        ck.run(f"reduce_scatter_tensor {op} {dtype}", tensor_form)
        ck.run(f"reduce_scatter list {op} {dtype}", list_form)
    # uneven blocks, one of them empty: block i has (i * 5) % 7 elements
    sizes = [(i * 5) % 7 for i in range(ws)]
    xs = [common.gen(torch.float32, (sum(sizes),), r, seed + 7) for r in range(ws)]
    full = reference(xs, "SUM")
    start = sum(sizes[:rank])

    def uneven():
        out = torch.empty(sizes[rank], dtype=torch.float32)
        dist.reduce_scatter(out, list(xs[rank].clone().split(sizes)), op=R.SUM)
        common.same(out, full[start:start + sizes[rank]], ws == 2, "uneven reduce_scatter", ws)

    ck.run(f"reduce_scatter uneven {sizes}", uneven)


def check_coalesced(ck, gloo, rank, ws, seed):
    shapes = [(5,), (300,), (2, 17)]
    xs = [[common.gen(torch.float32, s, r, seed + i) for i, s in enumerate(shapes)]
          for r in range(ws)]
    wants = [reference([xs[r][i] for r in range(ws)], "SUM") for i in range(len(shapes))]

    def all_reduce_coalesced():
        ts = [x.clone() for x in xs[rank]]
        dist.all_reduce_coalesced(ts, op=R.SUM)
        for t, w in zip(ts, wants):
            common.same(t, w, ws == 2, "all_reduce_coalesced", ws)

    def manager_all_reduce():
        ts = [x.clone() for x in xs[rank]]
        with dist._coalescing_manager(async_ops=True) as cm:  # pylint: disable=protected-access
            for t in ts:
                dist.all_reduce(t)
        cm.wait()
        for t, w in zip(ts, wants):
            common.same(t, w, ws == 2, "coalesced all_reduce", ws)

    def manager_all_gather():
        ins = [common.gen(torch.float32, (n,), rank, seed + n) for n in (3, 64)]
        outs = [torch.empty(ws * t.numel()) for t in ins]
        with dist._coalescing_manager(async_ops=True) as cm:  # pylint: disable=protected-access
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i)
        cm.wait()
        for o, n in zip(outs, (3, 64)):
            want = torch.cat([common.gen(torch.float32, (n,), r, seed + n) for r in range(ws)])
            common.same(o, want, True, "coalesced all_gather_into_tensor")

    def manager_reduce_scatter():
        ins = [common.gen(torch.float64, (ws * n,), rank, seed + n) for n in (2, 40)]
        outs = [torch.empty(n, dtype=torch.float64) for n in (2, 40)]
        with dist._coalescing_manager(async_ops=True) as cm:  # pylint: disable=protected-access
            for o, i in zip(outs, ins):
                dist.reduce_scatter_tensor(o, i)
        cm.wait()
        for o, n in zip(outs, (2, 40)):
            full = reference([common.gen(torch.float64, (ws * n,), r, seed + n)
                              for r in range(ws)], "SUM")
            common.same(o, full[rank * n:(rank + 1) * n], ws == 2,
                        "coalesced reduce_scatter_tensor", ws)

    def all_gather_coalesced():
        ins = [common.gen(torch.int32, s, rank, seed + 50 + i) for i, s in enumerate(shapes)]
        outs = [[torch.empty(s, dtype=torch.int32) for s in shapes] for _ in range(ws)]
        dist.all_gather_coalesced(outs, ins)  # outs[r][i]: rank r's tensor i
        for r in range(ws):
            for i, s in enumerate(shapes):
                common.same(outs[r][i], common.gen(torch.int32, s, r, seed + 50 + i), True,
                            f"all_gather_coalesced rank {r} tensor {i}")

    ck.run("all_reduce_coalesced", all_reduce_coalesced)
    ck.run("all_gather_coalesced", all_gather_coalesced)
    ck.run("coalescing manager all_reduce", manager_all_reduce)
    ck.run("coalescing manager all_gather_into_tensor", manager_all_gather)
    ck.run("coalescing manager reduce_scatter_tensor", manager_reduce_scatter)


def run(args):
    rank, ws, gloo = common.init(args.get("timeout_s", 30))
    ck = common.Checks(sync_group=gloo)
    seed = 1
    for dtype in FLOATS + INTS + [torch.bool] + OPTIONAL_TYPES:
        for op in OPS:
            seed += 1
            check_all_reduce(ck, gloo, rank, ws, dtype, op, seed)
    big = common.gen(torch.float32, (1 << 20,), rank, 99)

    def big_sum():
        t = big.clone()
        dist.all_reduce(t)
        g = big.clone()
        dist.all_reduce(g, group=gloo)
        common.same(t, g, ws == 2, "1 Mi floats against gloo", ws)

    ck.run("all_reduce SUM float32 1Mi elements", big_sum)
    ck.run("all_reduce of 0 elements", lambda: dist.all_reduce(torch.empty(0)))
    check_reduce(ck, gloo, rank, ws, 500)
    check_reduce_scatter(ck, gloo, rank, ws, 600)
    check_coalesced(ck, gloo, rank, ws, 700)
    dist.destroy_process_group()
    return ck.result()
