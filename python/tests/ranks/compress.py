"""Rank side of the compressed groups' checks (tests.test_compress): a group made with
``Options(compress=FMT)`` runs float32 all_reduce compressed, blocking, async and through its
future (DDP's way), and the result is the same bits on every rank, within the error bound of
docs/compression.md of the uncompressed group's result, and not that result itself."""
import torch
import torch.distributed as dist

from tests.ranks import common

# (rel, abs) of one round trip (docs/compression.md, "Error of one round trip").
TERMS = {"bf16": (2.0 ** -8, 2.0 ** -134), "int8": (2.0 ** -24, 0.5 + 2.0 ** -16)}
BLOCK = 256  # the default block: every segment is whole blocks, so blocks start at k * 256
COUNT = 5000


def scale(fmt, amax):
    """The largest scale a block whose largest magnitude is ``amax`` gets."""
    if fmt == "bf16":
        return torch.ones_like(amax)
    return torch.clamp(amax / 127.0, min=2.0 ** -126) * (1.0 + 2.0 ** -20)


def once(fmt, x, s):
    """One round trip's bound e(x, s)."""
    rel, ab = TERMS[fmt]
    return rel * x.abs() + ab * s + 2.0 ** -149


def block_amax(x):
    """Each element's block's largest magnitude (blocks of BLOCK from element 0)."""
    n = x.numel()
    pad = (-n) % BLOCK
    a = torch.cat([x.abs(), x.new_zeros(pad)]).reshape(-1, BLOCK).amax(dim=1)
    return a.repeat_interleave(BLOCK)[:n]


def bound(fmt, xs):
    """Per element, the documented bound of an AllReduce sum of ``xs`` (float64 rows) against
    the exact sum, plus the uncompressed float32 sum's own rounding."""
    n = xs.shape[0]
    e = torch.zeros(xs.shape[1], dtype=torch.float64)
    mag, amax = torch.zeros_like(e), torch.zeros_like(e)
    for x in xs:
        a = block_amax(x)
        q = once(fmt, x, scale(fmt, a))
        e += q
        mag += x.abs() + q
        amax += a + once(fmt, a, scale(fmt, a))
    exact = xs.sum(dim=0)
    before = e + (n + 1) * 2.0 ** -24 * mag
    own = n * 2.0 ** -24 * xs.abs().sum(dim=0)
    return before + once(fmt, exact.abs() + before, scale(fmt, amax)) + own


def check_format(checks, fmt, rank, ws):
    from fabricoll.torch import Options  # pylint: disable=import-outside-toplevel
    group = dist.new_group(backend="fabricoll", pg_options=Options(compress=fmt))
    x = common.gen(torch.float32, (COUNT,), rank, seed=7) * (1 + 1000 * (rank % 2))
    plain = x.clone()
    dist.all_reduce(plain)  # the default group: uncompressed
    xs = [torch.empty_like(x) for _ in range(ws)]
    dist.all_gather(xs, x)
    xs = torch.stack(xs).to(torch.float64)
    got = {}

    def blocking():
        got["blocking"] = x.clone()
        dist.all_reduce(got["blocking"], group=group)

    def asynchronous():
        got["async"] = x.clone()
        dist.all_reduce(got["async"], group=group, async_op=True).wait()

    def future():
        got["future"] = x.clone()
        dist.all_reduce(got["future"], group=group, async_op=True).get_future().wait()

    for name, fn in (("blocking", blocking), ("async", asynchronous), ("future", future)):
        checks.run(f"{fmt} all_reduce {name}", fn)

    def identical():
        for name, y in got.items():
            common.same(y, got["blocking"], True, f"{fmt} {name} against blocking")
            ys = [torch.empty_like(y) for _ in range(ws)]
            dist.all_gather(ys, y)
            for r, other in enumerate(ys):
                common.same(other, y, True, f"{fmt} {name}: rank {r} against rank {rank}")

    def within():
        y = got["blocking"]
        err = (y.to(torch.float64) - plain.to(torch.float64)).abs()
        b = bound(fmt, xs)
        if bool((err > b).any()):
            i = int((err - b).argmax())
            raise AssertionError(f"{fmt}: element {i}: {float(y[i])} against uncompressed "
                                 f"{float(plain[i])}, bound {float(b[i])}")
        if torch.equal(common.bits(y), common.bits(plain)):
            raise AssertionError(f"{fmt}: the uncompressed result: nothing was compressed")

    checks.run(f"{fmt} identical on every rank", identical)
    checks.run(f"{fmt} within the bound of the uncompressed result", within)
    dist.destroy_process_group(group)


def run(args):
    rank, ws, gloo = common.init(args.get("timeout_s", 60))
    checks = common.Checks(sync_group=gloo)
    for fmt in args["formats"]:
        check_format(checks, fmt, rank, ws)
    dist.destroy_process_group()
    return checks.result()
