#!/usr/bin/env python3
"""scripts/torch/bench_cuda.py [--ranks 2] [--provider shm] [--reps 3] [--iters 20]

The torch backend on CUDA tensors, on a machine with a GPU (scripts/gpu-tests.sh runs it with
GPU_BENCH=1): all_reduce of float32 tensors, 4 KiB to 64 MiB, `--ranks` processes sharing the
machine's GPUs, through fabricoll (stream-ordered on the current stream), gloo on the same CUDA
tensors, and fabricoll on CPU tensors with the copies around it; the three alternate
(python/tests/ranks/cuda_bench.py). Prints per size the median over repetitions of each way's
time (the slowest rank's median call, to the device idle) and bus bandwidth as nccl-tests
counts it (2 (n-1)/n x bytes / time), and fabricoll's speedup over the other two. Needs the
compiled front built for this torch (scripts/torch/gpu-check.sh builds it)."""
import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

from tests import harness, launcher  # noqa: E402  pylint: disable=wrong-import-position


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[2])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--provider", default="shm")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--timeout", type=int, default=240)
    a = p.parse_args()
    res = launcher.launch("cuda_bench", a.ranks, f"cuda-bench-{a.ranks}",
                          env=harness.provider_env(a.provider),
                          args={"reps": a.reps, "iters": a.iters}, timeout=a.timeout)
    if res.timed_out or any(rc != 0 for rc in res.rcs) or not res.results or \
            any(r is None for r in res.results):
        print(res.describe())
        return 1
    us, n = res.results[0]["us"], res.results[0]["ranks"]
    print(f"# all_reduce float32 sum, {n} ranks, CUDA tensors, provider {a.provider}; "
          f"median of {a.reps} repetitions of the slowest rank's median of {a.iters} calls")
    print(f"{'bytes':>10} {'fabricoll us':>13} {'busbw GB/s':>11} {'gloo us':>10} "
          f"{'copy+cpu us':>12} {'x gloo':>7} {'x copy':>7}")
    for size in sorted(us["fabricoll"], key=int):
        f, g, c = (statistics.median(us[w][size]) for w in ("fabricoll", "gloo", "copy+cpu"))
        bus = 2 * (n - 1) / n * int(size) / f / 1e3
        print(f"{int(size):>10} {f:>13.1f} {bus:>11.3f} {g:>10.1f} {c:>12.1f} "
              f"{g / f:>7.2f} {c / f:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
