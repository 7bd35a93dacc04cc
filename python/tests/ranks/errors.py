"""Rank side of the error-path checks (args["case"]): mismatched shapes between ranks, an
operation the backend refuses, a rank killed mid-job. Each records how long the failing call
took; the test side (tests.test_errors) judges the results against the configured timeout.
"""
import os
import signal
import time

import torch
import torch.distributed as dist

from tests.ranks import common


def timed(fn):
    """(error message or None, seconds) of fn()."""
    t0 = time.monotonic()
    try:
        fn()
        return None, time.monotonic() - t0
    except Exception as e:  # pylint: disable=broad-except  # the error is the result
        return f"{type(e).__name__}: {e}", time.monotonic() - t0


def shapes(rank, ws):
    out = {}
    t = torch.ones(4 + 4 * rank)  # each rank a different element count
    out["all_reduce"] = timed(lambda: dist.all_reduce(t))
    return out


def shapes_gather(rank, ws):
    n = 4 + 4 * rank
    return {"all_gather_into_tensor": timed(
        lambda: dist.all_gather_into_tensor(torch.empty(ws * n), torch.ones(n)))}


def unsupported(rank, ws):
    out = {}
    out["BAND float32"] = timed(lambda: dist.all_reduce(torch.ones(8), op=dist.ReduceOp.BAND))
    out["BXOR bfloat16"] = timed(lambda: dist.reduce_scatter_tensor(
        torch.empty(4, dtype=torch.bfloat16), torch.ones(4 * ws, dtype=torch.bfloat16),
        op=dist.ReduceOp.BXOR))
    # a refused call must leave the group usable
    t = torch.ones(8)
    out["after"] = timed(lambda: dist.all_reduce(t))
    out["after_value"] = float(t[0])
    return out


def killed(rank, ws, finish="destroy"):
    victim = ws - 1
    t = torch.ones(1024)
    dist.all_reduce(t)  # every rank connected and working
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    out = {"sync": timed(lambda: dist.all_reduce(t))}
    out["async"] = timed(lambda: dist.all_reduce(t, async_op=True).wait())
    # DDP's way: only the future is waited on (the request completes through a notification)
    out["future"] = timed(lambda: dist.all_reduce(t, async_op=True).get_future().wait())
    if finish == "abort":
        # what a job does after a failure: abort the group, failing what is pending
        abort = dist.distributed_c10d._abort_process_group  # pylint: disable=protected-access
        out["finish"] = timed(abort)
    else:
        out["finish"] = timed(dist.destroy_process_group)
    return out


CASES = {"shapes": shapes, "shapes_gather": shapes_gather, "unsupported": unsupported,
         "killed": killed}


def run(args):
    common.import_backend()
    timeout_s = args["timeout_s"]
    import datetime  # pylint: disable=import-outside-toplevel
    dist.init_process_group(common.BACKEND, timeout=datetime.timedelta(seconds=timeout_s))
    rank, ws = dist.get_rank(), dist.get_world_size()
    kw = {"finish": args["finish"]} if "finish" in args else {}
    return {"case": args["case"], "results": CASES[args["case"]](rank, ws, **kw)}
