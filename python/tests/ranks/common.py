"""Rank-side helpers: process groups, the check recorder, deterministic inputs, comparisons.

Every job's default process group is the backend under test (FABRICOLL_TEST_BACKEND, default
"fabricoll"); `gloo` is a second group over the same ranks, the reference the results are
compared with.
"""
import datetime
import os
import time
import traceback

import torch
import torch.distributed as dist

BACKEND = os.environ.get("FABRICOLL_TEST_BACKEND", "fabricoll")


def _gather_single_missing():
    """Words of the error a backend gives where gather_into_tensor cannot reach it: torch's
    trampoline for Python backends never forwards it, so fabricoll's Python-only backend
    (FABRICOLL_TORCH_EXT=0, or no compiled front) refuses it; the compiled front runs it."""
    if BACKEND == "fabricoll" and os.environ.get("FABRICOLL_TORCH_EXT") == "0":
        return ["does not support gather_single"]
    return None


GATHER_SINGLE_MISSING = _gather_single_missing()


def import_backend():
    """Register the backend under test (`import fabricoll.torch` registers "fabricoll")."""
    if BACKEND == "fabricoll":
        import fabricoll.torch  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import


def init(timeout_s=60, backend=None):
    """Default group = the backend under test; returns (rank, world size, gloo group)."""
    import_backend()
    dist.init_process_group(backend or BACKEND, timeout=datetime.timedelta(seconds=timeout_s))
    gloo = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size(), gloo


def init_cuda(timeout_s=60):
    """Default group = the backend under test, for CPU and CUDA tensors, every rank on CUDA
    device rank % device_count; returns (rank, world size, device, gloo group)."""
    import_backend()
    dist.init_process_group(BACKEND, timeout=datetime.timedelta(seconds=timeout_s))
    rank = dist.get_rank()
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    return rank, dist.get_world_size(), dev, dist.new_group(backend="gloo")


class Checks:
    """Named checks of one rank: each is ok, unsupported (a clear error) or failed."""

    def __init__(self, sync_group=None):
        self.items = []
        self.sync_group = sync_group

    def run(self, name, fn, allow_unsupported=None):
        """Run fn(); a raise fails the check unless `allow_unsupported` (a list of words) has one
        the message names, which makes it `unsupported` (the backend refused it clearly)."""
        t0 = time.monotonic()
        try:
            fn()
            status, msg = "ok", ""
        except Exception as e:  # pylint: disable=broad-except  # recorded as the check's result
            msg = f"{type(e).__name__}: {e}"
            low = msg.lower()
            if allow_unsupported and any(w.lower() in low for w in allow_unsupported):
                status = "unsupported"
            else:
                status = "failed"
                msg += "\n" + traceback.format_exc(limit=6)
        self.items.append({"name": name, "status": status, "msg": msg[:2000],
                           "s": round(time.monotonic() - t0, 3)})
        if status == "failed":
            print(f"CHECK FAILED {name}: {msg}", flush=True)
        if self.sync_group is not None:
            # keep the ranks in step: a rank that failed early must not start the next check
            # while the others still wait in this one's collective
            dist.barrier(group=self.sync_group)

    def result(self):
        return {"checks": self.items}


def gen(dtype, shape, rank, seed, kind="normal"):
    """Rank `rank`'s input of a check: every rank can compute every other rank's."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        real = torch.randn(shape, generator=g, dtype=torch.float64)
        imag = torch.randn(shape, generator=g, dtype=torch.float64)
        return torch.complex(real, imag).to(dtype)
    if dtype.is_floating_point:
        if kind == "prod":
            x = torch.rand(shape, generator=g, dtype=torch.float64) + 0.5
        else:
            x = torch.randn(shape, generator=g, dtype=torch.float64)
        return x.to(dtype)
    info = torch.iinfo(dtype)
    if kind == "prod":
        lo, hi = (-2, 3) if info.min < 0 else (1, 3)
    else:
        lo, hi = max(info.min, -50), min(info.max, 50) + 1
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)


def bits(t):
    """A tensor's bytes, for bitwise comparison (NaNs and signed zeros included)."""
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8) if t.dtype != torch.bool else t.to(torch.uint8)


TOL = {torch.float32: 2e-6, torch.float64: 1e-14, torch.float16: 2e-3, torch.bfloat16: 1.6e-2,
       torch.complex64: 2e-6, torch.complex128: 1e-14}


def tolerance(dtype, nranks):
    """Relative tolerance of a reduction over nranks values of this type (order may differ)."""
    if dtype in TOL:
        return TOL[dtype] * nranks
    if dtype.is_floating_point:  # the float8 types: a few steps of their 2- or 3-bit mantissa
        return 0.25 * nranks
    return 0.0


def same(got, want, bitwise, what, nranks=2):
    """Raise AssertionError naming `what` unless got equals want (bitwise, or within precision)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        raise AssertionError(f"{what}: got {got.dtype}{list(got.shape)}, "
                             f"want {want.dtype}{list(want.shape)}")
    if bitwise or not (got.dtype.is_floating_point or got.dtype.is_complex):
        if not torch.equal(bits(got), bits(want)):
            raise AssertionError(f"{what}: not bitwise equal: {diff(got, want)}")
        return
    rtol = tolerance(got.dtype, nranks)
    g, w = got.to(torch.complex128 if got.dtype.is_complex else torch.float64), \
        want.to(torch.complex128 if got.dtype.is_complex else torch.float64)
    scale = max(1.0, float(w.abs().max()) if w.numel() else 1.0)
    err = (g - w).abs()
    if w.numel() and float(err.max()) > rtol * scale:
        raise AssertionError(f"{what}: beyond tolerance {rtol:g} x {scale:g}: {diff(got, want)}")


def diff(got, want):
    """The first differing element, for messages."""
    g, w = got.reshape(-1), want.reshape(-1)
    if g.numel() != w.numel():
        return f"{g.numel()} elements against {w.numel()}"
    ne = (bits(g).reshape(g.numel(), -1) != bits(w).reshape(w.numel(), -1)).any(dim=-1)
    idx = ne.nonzero()
    if not len(idx):
        return "equal"
    i = int(idx[0])
    return f"{len(idx)} of {g.numel()} differ, first at {i}: {g[i].item()} against {w[i].item()}"
