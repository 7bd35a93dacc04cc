"""Rank side of tests.test_harness: no torch, only the launcher's contract (environment,
results, the hard timeout)."""
import os
import time


def run(args):
    rank = int(os.environ["RANK"])
    if args.get("hang_rank") == rank:
        time.sleep(3600)  # the launcher must kill this rank at its timeout
    if args.get("fail_rank") == rank:
        raise RuntimeError(f"rank {rank} fails on purpose")
    return {"env": {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                               "MASTER_ADDR", "MASTER_PORT")}}
