#!/usr/bin/env python3
"""Real NCCL over fabricoll: PyTorch's NCCL backend with our net (and CollNet) plugin.

Starts R ranks on GPU 0 of this machine, each with its own NCCL_HOSTID, so that NCCL takes every
rank for a separate node and carries all of its traffic through the network plugin: the plugin
is exercised by NCCL's own proxy thread, not by our harness.  Each rank runs AllReduce (several
types, ops and sizes, up to 64 MiB), AllGather, ReduceScatter, Broadcast, AllToAll and Send/Recv,
checks every element against a value computed independently (small integers, exact in every
type), then times a 64 MiB AllReduce.  The parent checks NCCL's log for the lines that prove the
plugin carried the data ("Using network fabricoll", "via NET/fabricoll").

Usage:
    plugin-tests/nccl_torch.py --lib target/release/libnccl-net-fabricoll.so \
        [--ranks 2] [--provider tcp] [--collnet] [--socket] [--mps] [--timeout 300]
        [--sweep 1K:256M] [--tuner on|off] [--gdr auto|on|off] [--gloo]

Without MPS the ranks' processes time-slice GPU 0: a rank's NCCL kernel holds the GPU while it
waits for its peer's data, so every timing becomes a multiple of the driver's time slice (4.5 ms
on an H100), the same for any transport.  --mps starts a private CUDA MPS control daemon for the
run (its pipe and log folders in a fresh temporary folder; stopped at the end), so that the ranks'
kernels run side by side and the timings measure the transport.

--socket runs the same checks and timings over NCCL's own Socket transport instead of the plugin
(the plugin is not loaded): the reference for the plugin's timings on the same machine. --gloo
runs them through PyTorch's gloo backend on the same CUDA tensors (gloo copies them to host memory
and reduces there): the reference a CPU collective library is held to.

--sweep MIN:MAX skips the checks and times AllReduce from MIN to MAX bytes (one exact check per
size); scripts/gpu-nccl.sh runs it for Socket, the plugin and CollNet, alternating, and prints the
medians.  --tuner off sets FABRICOLL_TUNER=0 (CollNet priced by NCCL alone).

--gdr on lets NCCL put its net buffers in device memory whatever the path to the "NIC"
(NCCL_NET_GDR_LEVEL=SYS, NCCL_NET_GDR_READ=1; the plugin must advertise NCCL_PTR_CUDA, which it
does where the provider really registered a CUDA buffer) and fails unless rank 0's channels say
GDRDMA; --gdr off keeps them in host memory (NCCL_NET_GDR_LEVEL=LOC: host-staged) and fails if
any says GDRDMA; auto (the default) leaves NCCL's own choice.

Exit status: 0 passed, 1 failed, 0 with a line starting "SKIP" when there is no PyTorch with CUDA
(this test needs a GPU; CI machines have none and skip it).
"""
import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("--lib", required=True, help="path to libnccl-net-fabricoll.so")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--provider", default="tcp", help="FABRICOLL_PROVIDER of the ranks")
    p.add_argument("--collnet", action="store_true", help="NCCL_COLLNET_ENABLE=1")
    p.add_argument("--mps", action="store_true",
                   help="run the ranks as clients of a private CUDA MPS daemon (real timings)")
    p.add_argument("--socket", action="store_true",
                   help="NCCL's own Socket transport instead of the plugin (timing reference)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole run")
    p.add_argument("--sweep", metavar="MIN:MAX",
                   help="timing only: AllReduce float sum of MIN..MAX bytes (x4 steps, K/M suffixes), "
                        "one exact check per size, rows 'sweep SIZE US' from rank 0")
    p.add_argument("--gloo", action="store_true",
                   help="PyTorch's gloo backend on the CUDA tensors instead of NCCL (timing reference)")
    p.add_argument("--tuner", choices=("on", "off"), default="on",
                   help="FABRICOLL_TUNER of the ranks (off: NCCL prices CollNet alone)")
    p.add_argument("--gdr", choices=("auto", "on", "off"), default="auto",
                   help="on: NCCL's net buffers in device memory (GDRDMA, required); off: host-staged")
    p.add_argument("--child", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    return p.parse_args()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child(a):
    import torch
    import torch.distributed as dist

    rank, n = a.child, a.ranks
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    if a.gloo:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank, world_size=n
        )
    else:
        dist.init_process_group(
            "nccl", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank, world_size=n, device_id=dev
        )
    if a.sweep:
        return sweep(a, rank, n, dev)
    checks = 0
    bad = []

    def expect(name, got, want):
        nonlocal checks
        checks += 1
        if not torch.equal(got.cpu(), want.cpu()):
            diff = (got.cpu().double() != want.cpu().double()).nonzero()
            bad.append(f"{name}: {diff.numel()} wrong elements, first at {diff[0].tolist()}")

    def pattern(r, count, dtype):
        # small integers: exact in every type, sums over <= 8 ranks stay exact in bf16/f16
        return ((torch.arange(count, device=dev) + 3 * r) % 7 + 1).to(dtype)

    sizes = [1, 7, 1000, (1 << 16) + 3, 1 << 20, 16 << 20]  # elements; 16M f32 = 64 MiB
    for count in sizes:
        for dtype in (torch.float32, torch.bfloat16, torch.int32):
            if dtype != torch.float32 and count > (1 << 20):
                continue
            x = pattern(rank, count, dtype)
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
            want = sum(pattern(r, count, torch.int64) for r in range(n)).to(dtype)
            expect(f"allreduce sum {dtype} x{count}", x, want)
        x = pattern(rank, count, torch.int32)
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        want = torch.stack([pattern(r, count, torch.int32) for r in range(n)]).amax(0)
        expect(f"allreduce max int32 x{count}", x, want)

    for per in (1, 1000, 1 << 18):
        x = pattern(rank, per, torch.float32)
        out = torch.empty(per * n, device=dev)
        dist.all_gather_into_tensor(out, x)
        expect(f"allgather x{per}", out, torch.cat([pattern(r, per, torch.float32) for r in range(n)]))

        x = torch.cat([pattern(rank + j, per, torch.float32) for j in range(n)])
        out = torch.empty(per, device=dev)
        dist.reduce_scatter_tensor(out, x)
        want = sum(pattern(r + rank, per, torch.int64) for r in range(n)).to(torch.float32)
        expect(f"reducescatter x{per}", out, want)

        root = n - 1
        x = pattern(rank, per, torch.float32)
        dist.broadcast(x, src=root)
        expect(f"broadcast x{per}", x, pattern(root, per, torch.float32))

        x = torch.cat([pattern(rank * n + j, per, torch.float32) for j in range(n)])
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x)
        want = torch.cat([pattern(j * n + rank, per, torch.float32) for j in range(n)])
        expect(f"alltoall x{per}", out, want)

        # send/recv around a ring
        x = pattern(rank, per, torch.float32)
        out = torch.empty_like(x)
        ops = [
            dist.P2POp(dist.isend, x, (rank + 1) % n),
            dist.P2POp(dist.irecv, out, (rank - 1) % n),
        ]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        expect(f"sendrecv x{per}", out, pattern((rank - 1) % n, per, torch.float32))

    # time AllReduce of 1, 8 and 64 MiB (nccl-tests' busbw: algbw * 2(n-1)/n)
    for mib in (1, 8, 64):
        x = torch.ones(mib << 18, device=dev)
        dt = time_allreduce(x, 10, 3)
        if rank == 0:
            algbw = x.numel() * 4 / dt / 1e9
            print(f"rank 0: allreduce {mib} MiB: {dt * 1e6:.0f} us, algbw {algbw:.2f} GB/s, "
                  f"busbw {algbw * 2 * (n - 1) / n:.2f} GB/s", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    for b in bad:
        print(f"rank {rank}: WRONG {b}", flush=True)
    print(f"rank {rank}: {checks - len(bad)} passed, {len(bad)} failed", flush=True)
    return 1 if bad else 0


def time_allreduce(x, iters, warm):
    """Seconds per in-place AllReduce of `x` (sum), after `warm` untimed ones."""
    import torch
    import torch.distributed as dist

    for _ in range(warm):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def parse_bytes(v):
    v = v.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(v[-1:], 1)
    return int(v[:-1] if mult > 1 else v) * mult


def sweep(a, rank, n, dev):
    """AllReduce times from MIN to MAX bytes (x4): the same sizes and iteration bands for every
    transport, so runs of Socket, the plugin and CollNet compare row by row."""
    import torch
    import torch.distributed as dist

    lo, hi = (parse_bytes(x) for x in a.sweep.split(":"))
    size, bad = lo, 0
    while size <= hi:
        count = max(1, size // 4)
        x = torch.full((count,), float(rank + 1), device=dev)
        dist.all_reduce(x)  # also the exact check: the sum of 1..n
        if not torch.all(x == n * (n + 1) / 2):
            bad += 1
            print(f"rank {rank}: WRONG sweep {size} B", flush=True)
        iters, warm = (50, 5) if size < (1 << 20) else (20, 3) if size < (32 << 20) else (5, 2)
        dt = time_allreduce(x, iters, warm)
        if rank == 0:
            print(f"rank 0: sweep {count * 4} {dt * 1e6:.1f}", flush=True)
        size *= 4
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: {0 if bad else 1} passed, {bad} failed", flush=True)
    return 1 if bad else 0


def start_mps():
    """A private MPS control daemon: returns the environment its clients need, or an error text."""
    ctl = shutil.which("nvidia-cuda-mps-control")
    if ctl is None:
        return None, "--mps: nvidia-cuda-mps-control is not on PATH"
    d = tempfile.mkdtemp(prefix="fabricoll-mps.")
    env = {"CUDA_MPS_PIPE_DIRECTORY": d, "CUDA_MPS_LOG_DIRECTORY": d}
    r = subprocess.run([ctl, "-d"], env={**os.environ, **env}, capture_output=True, text=True,
                       timeout=30)
    if r.returncode != 0:
        return None, f"--mps: nvidia-cuda-mps-control -d exited {r.returncode}: {r.stderr.strip()}"
    return env, None


def stop_mps(env):
    subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env={**os.environ, **env},
                   capture_output=True, text=True, timeout=30)
    shutil.rmtree(env["CUDA_MPS_PIPE_DIRECTORY"], ignore_errors=True)


def parent(a):
    try:
        import torch
    except ImportError:
        print("SKIP: PyTorch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0
    if (a.socket or a.gloo) and a.collnet or (a.socket and a.gloo):
        print("nccl_torch: --socket, --gloo and --collnet exclude each other (no plugin, no CollNet)",
              file=sys.stderr)
        return 2
    lib = os.path.abspath(a.lib)
    if not os.path.isfile(lib):
        print(f"nccl_torch: no plugin library at {lib}", file=sys.stderr)
        return 1
    mps = None
    if a.mps:
        mps, err = start_mps()
        if err:
            print(f"nccl_torch: {err}", file=sys.stderr)
            return 1
    else:
        print("nccl_torch: no --mps: the ranks time-slice GPU 0, timings are multiples of the "
              "time slice, not the transport's", flush=True)
    try:
        return run_ranks(a, lib, mps or {})
    finally:
        if mps:
            stop_mps(mps)


def run_ranks(a, lib, mps_env):
    port = free_port()
    procs = []
    for r in range(a.ranks):
        env = dict(os.environ)
        env.update(mps_env)
        env.update(
            NCCL_NET_PLUGIN="none" if a.socket or a.gloo else lib,
            NCCL_NET="Socket" if a.socket or a.gloo else "fabricoll",
            NCCL_HOSTID=f"fabricoll-node-{r}",  # every rank its own node: all traffic via the plugin
            NCCL_DEBUG="INFO",
            NCCL_DEBUG_SUBSYS="INIT,NET,TUNING,COLL" if a.collnet else "INIT,NET,TUNING",
            FABRICOLL_TUNER="1" if a.tuner == "on" else "0",
            NCCL_SOCKET_IFNAME="lo",  # NCCL's own bootstrap
            FABRICOLL_PROVIDER=a.provider,
            FABRICOLL_TIMEOUT_MS="60000",
        )
        if a.provider in ("tcp", "net"):
            env["FABRICOLL_DOMAIN"] = "lo"  # the IP providers: loopback only
        if a.collnet:
            env["NCCL_COLLNET_ENABLE"] = "1"
        if a.gdr == "on":
            env.update(NCCL_NET_GDR_LEVEL="SYS", NCCL_NET_GDR_READ="1")
        elif a.gdr == "off":
            env["NCCL_NET_GDR_LEVEL"] = "LOC"
        cmd = [sys.executable, os.path.abspath(__file__), "--lib", lib, "--ranks", str(a.ranks),
               "--child", str(r), "--port", str(port)]
        if a.sweep:
            cmd += ["--sweep", a.sweep]
        if a.gloo:
            cmd += ["--gloo"]
        log = open(f"/tmp/nccl_torch.{os.getpid()}.{r}.log", "w+")
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    deadline = time.time() + a.timeout
    rcs = []
    for p, _ in procs:
        try:
            rcs.append(p.wait(timeout=max(1.0, deadline - time.time())))
        except subprocess.TimeoutExpired:
            p.kill()
            rcs.append("timeout")
    failed = 0
    for r, (p, log) in enumerate(procs):
        log.seek(0)
        text = log.read()
        lines = text.splitlines()
        keep = [l for l in lines if any(k in l for k in (
            "fabricoll", "NET/Plugin", "NET/Socket :", "CollNet", "TUNER", "Tuner", "passed", "WRONG",
            "Error", "error", "rank 0:"))]
        print(f"---- rank {r} (exit {rcs[r]}): {len(lines)} log lines, the relevant ones:")
        for l in keep[:60]:
            print("   ", l)
        if rcs[r] != 0:
            failed += 1
            print("    ... last lines:")
            for l in lines[-25:]:
                print("   ", l)
        if r == 0 and a.gloo:
            print("rank 0: gloo on CUDA tensors (the reference, no NCCL)")
        elif r == 0:
            if a.socket:
                used = "via NET/Socket" in text
                print(f"rank 0: NCCL channels via NET/Socket (the reference, no plugin): {used}")
                if not used:
                    failed += 1
            else:
                # with CollNet on, NCCL may carry every channel through CollNet and open no NET one
                net = "via NET/fabricoll" in text
                collnet = "via COLLNET/fabricoll" in text
                loaded = "fabricoll" in text and "NET/Plugin" in text
                print(f"rank 0: plugin loaded by NCCL: {loaded}; "
                      f"NCCL channels via NET/fabricoll: {net}; via COLLNET/fabricoll: {collnet}")
                if not (loaded and (net or collnet)):
                    failed += 1
                if a.collnet and not collnet:
                    print("rank 0: CollNet was asked for (--collnet) but no channel used it")
                    failed += 1
                tuner = [l for l in lines if ("TUNER" in l or "Tuner" in l) and "fabricoll" in l]
                print(f"rank 0: tuner loaded from our library: {bool(tuner)}"
                      + (f" ({tuner[0].strip()})" if tuner else ""))
                if a.tuner == "on" and not tuner:
                    print("rank 0: the tuner was asked for (--tuner on) but NCCL did not load ours")
                    failed += 1
                gdr = sum(1 for l in lines if "via NET/fabricoll" in l and "GDRDMA" in l)
                print(f"rank 0: channels with GDRDMA (device memory on the wire): {gdr}")
                if (a.gdr == "on" and not gdr) or (a.gdr == "off" and gdr):
                    print(f"rank 0: --gdr {a.gdr} asked for, {gdr} GDRDMA channel(s) seen")
                    failed += 1
    ok_ranks = sum(1 for rc in rcs if rc == 0)
    print(f"nccl_torch: {ok_ranks} ranks passed, {failed} failed checks (ranks or plugin use)")
    return 1 if failed else 0


if __name__ == "__main__":
    args = parse()
    sys.exit(child(args) if args.child >= 0 else parent(args))
