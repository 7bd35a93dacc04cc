"""scripts/bench-torch.sh --overhead: the per-operation cost of an 8 B dist.all_reduce on a 1-rank
group, as the calling thread's CPU time (scheduling on a busy machine does not inflate it), for:

- the C call fabricoll_allreduce through ctypes, on the fabricoll group's communicator;
- dist.all_reduce on fabricoll (the implementation FABRICOLL_TORCH_EXT selects), on gloo, on a
  C++ backend that does nothing (torch's own dispatch of a C++ backend: the floor under the
  compiled front; built once from null_backend.cpp) and on a Python backend that does nothing
  (the floor under the Python backend);
- the same with async_op=True waited through get_future() (DDP's path).

Cases alternate within each of 9 rounds; medians and minimums per op. Run it once with
FABRICOLL_TORCH_EXT=1 and once with 0 to compare the two implementations.
"""
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))


def null_cpp_module(outdir):
    """Build (once) and import the do-nothing C++ backend."""
    os.makedirs(outdir, exist_ok=True)
    src = os.path.join(HERE, "null_backend.cpp")
    if not any(f.startswith("fabricoll_null_backend") and f.endswith(".so") for f in os.listdir(outdir)):
        setup = ("from setuptools import setup\n"
                 "from torch.utils.cpp_extension import CppExtension, BuildExtension\n"
                 f"setup(name='n', ext_modules=[CppExtension('fabricoll_null_backend', [{src!r}], "
                 "extra_compile_args=['-O2', '-g0', '-fvisibility=hidden'])], "
                 "cmdclass={'build_ext': BuildExtension})\n")
        subprocess.run([sys.executable, "-c", setup, "-q", "build_ext", "--build-lib", outdir,
                        "--build-temp", os.path.join(outdir, "tmp")],
                       check=True, cwd=outdir, stdout=subprocess.DEVNULL)
    sys.path.insert(0, outdir)
    import torch  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import  # loads libc10
    import fabricoll_null_backend  # pylint: disable=import-outside-toplevel,import-error

    return fabricoll_null_backend


def main():
    from tests import harness  # pylint: disable=import-outside-toplevel

    null_cpp = null_cpp_module(os.path.join(harness.target_dir(), "bench-torch", "null-ext"))
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1",
                      MASTER_PORT=str(__import__("tests.launcher", fromlist=["x"]).free_port()))
    os.environ.setdefault("FABRICOLL_PROVIDER", "shm")
    import torch  # pylint: disable=import-outside-toplevel
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel
    from torch._C._distributed_c10d import Backend, Work  # pylint: disable=import-outside-toplevel

    import fabricoll._backend as fb  # pylint: disable=import-outside-toplevel
    import fabricoll.torch as ft  # pylint: disable=import-outside-toplevel
    from fabricoll import _capi as c  # pylint: disable=import-outside-toplevel

    class NullPyWork(Work):
        def wait(self, timeout=None):
            return True

        def get_future(self):
            f = torch.futures.Future()
            f.set_result([])
            return f

    class NullPy(Backend):
        def getBackendName(self):
            return "nullpy"

        def allreduce(self, tensors, opts):
            return NullPyWork()

    dist.Backend.register_backend("nullcpp", lambda o, b=None: null_cpp.NullBackend(
        o.group_rank, o.group_size), extended_api=True, devices=["cpu"])
    dist.Backend.register_backend("nullpy", lambda o, b=None: NullPy(o.group_rank, o.group_size),
                                  extended_api=True, devices=["cpu"])
    dist.init_process_group("gloo")
    impl = "compiled front" if ft.compiled() else "Python backend"
    groups = {f"fabricoll ({impl})": dist.new_group(backend="fabricoll"),
              "gloo": dist.group.WORLD,
              "C++ backend doing nothing": dist.new_group(backend="nullcpp"),
              "Python backend doing nothing": dist.new_group(backend="nullpy")}
    comm = next(iter(fb._live))._comm  # pylint: disable=protected-access
    t = torch.zeros(2)
    n = int(os.environ.get("OVERHEAD_ITERS", "20000"))

    def ccall():
        f, p = c.lib().fabricoll_allreduce, t.data_ptr()
        for _ in range(n):
            f(p, p, 2, c.FLOAT32, c.SUM, comm)

    def sync(g):
        def run():
            for _ in range(n):
                dist.all_reduce(t, group=g)
        return run

    def fut(g):
        def run():
            for _ in range(n):
                dist.all_reduce(t, group=g, async_op=True).get_future().wait()
        return run

    cases = {"C fabricoll_allreduce via ctypes": ccall}
    cases.update({f"dist.all_reduce: {k}": sync(g) for k, g in groups.items()})
    cases.update({f"async_op + future: {k}": fut(g) for k, g in groups.items()})
    res = {k: [] for k in cases}
    for _ in range(9):
        for k, fn in cases.items():
            t0 = time.thread_time()
            fn()
            res[k].append((time.thread_time() - t0) / n * 1e6)
    print(f"# 8 B all_reduce on a 1-rank group ({os.environ['FABRICOLL_PROVIDER']}), per op, "
          f"thread CPU (us): median (min) of 9 alternating rounds of {n}; torch {torch.__version__}")
    for k, v in res.items():
        print(f"  {k:58s} {statistics.median(v):7.2f} ({min(v):.2f})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
