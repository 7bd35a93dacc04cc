"""The package as users get it: the implementation FABRICOLL_TORCH_EXT chooses, and a wheel (`pip wheel --no-build-isolation ./python`) carries the
library and the compiled front; unpacked away from the repository (FABRICOLL_LIB unset), it
registers the backend, runs on the compiled front and reduces on a 1-rank group."""
import glob
import os
import subprocess
import sys
import tempfile
import unittest
import zipfile

from tests import harness
from tests.launcher import free_port

_PROBE = r"""
import os, sys, torch, torch.distributed as dist
import fabricoll.torch as ft
from fabricoll import _capi
assert os.path.realpath(_capi.lib().path).startswith(os.path.realpath(sys.argv[1])), _capi.lib().path
assert ft.compiled(), "the wheel's compiled front did not load"
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0", WORLD_SIZE="1")
dist.init_process_group("fabricoll")
t = torch.arange(5, dtype=torch.float32)
dist.all_reduce(t)
assert t.tolist() == [0, 1, 2, 3, 4], t
print("probe ok", type(dist.group.WORLD._get_backend(torch.device("cpu"))).__module__)
dist.destroy_process_group()
"""


class Wheel(unittest.TestCase):
    def test_wheel_carries_library_and_compiled_front(self):
        if os.environ.get("FABRICOLL_TORCH_EXT") == "0":
            harness.skip(self.id(), "FABRICOLL_TORCH_EXT=0: the compiled front is not built")
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "dist")
            build = subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
                 "--disable-pip-version-check", harness.PY_DIR, "-w", out],
                capture_output=True, text=True, timeout=900, check=False)
            self.assertEqual(build.returncode, 0, build.stdout + build.stderr)
            wheels = glob.glob(os.path.join(out, "fabricoll-*.whl"))
            self.assertEqual(len(wheels), 1, wheels)
            names = zipfile.ZipFile(wheels[0]).namelist()
            self.assertIn("fabricoll/lib/libnccl_net_fabricoll.so", names)
            self.assertTrue(any(n.startswith("fabricoll/_c10d.") for n in names), names)
            site = os.path.join(tmp, "site")
            zipfile.ZipFile(wheels[0]).extractall(site)
            env = {k: v for k, v in os.environ.items()
                   if k not in ("FABRICOLL_LIB", "PYTHONPATH")}
            env.update(PYTHONPATH=site, FABRICOLL_PROVIDER="shm", FABRICOLL_TORCH_EXT="1")
            probe = subprocess.run([sys.executable, "-c", _PROBE, site, str(free_port())],
                                   env=env, cwd=tmp, capture_output=True, text=True,
                                   timeout=120, check=False)
            self.assertEqual(probe.returncode, 0, probe.stdout + probe.stderr)
            self.assertIn("probe ok fabricoll._c10d", probe.stdout)


class Choice(unittest.TestCase):
    """FABRICOLL_TORCH_EXT: 0 and 1 choose the implementation; anything else is an error naming
    the variable, at import."""

    def _import(self, value):
        env = dict(os.environ, FABRICOLL_TORCH_EXT=value, PYTHONPATH=harness.PY_DIR)
        code = "import fabricoll.torch as ft; print('compiled', ft.compiled())"
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=120, check=False)

    def test_zero_runs_python_alone(self):
        r = self._import("0")
        if harness.python_backend_runs_alone():
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("compiled False", r.stdout)
        else:
            # torch 2.11: the Python backend cannot run alone; the error says what to do
            self.assertNotEqual(r.returncode, 0, r.stdout)
            self.assertIn("FABRICOLL_TORCH_EXT=0 asks for the Python backend alone", r.stderr)
            self.assertIn("unset FABRICOLL_TORCH_EXT", r.stderr)

    def test_unset_needs_the_compiled_front_only_where_python_cannot_run_alone(self):
        # without fabricoll._c10d (hidden by a stand-in that raises ImportError as a missing
        # or mismatched build does): Python alone, or the error naming what to do
        code = ("import sys, importlib.abc\n"
                "class Hide(importlib.abc.MetaPathFinder):\n"
                "    def find_spec(self, name, path, target=None):\n"
                "        if name == 'fabricoll._c10d':\n"
                "            raise ImportError('hidden by the test')\n"
                "sys.meta_path.insert(0, Hide())\n"
                "import fabricoll.torch as ft; print('compiled', ft.compiled())\n")
        env = {k: v for k, v in os.environ.items() if k != "FABRICOLL_TORCH_EXT"}
        env.update(PYTHONPATH=harness.PY_DIR)
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=120, check=False)
        if harness.python_backend_runs_alone():
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("compiled False", r.stdout)
        else:
            self.assertNotEqual(r.returncode, 0, r.stdout)
            self.assertIn("needs its compiled front (fabricoll._c10d), which does not load: "
                          "hidden by the test", r.stderr)
            self.assertIn("build it for this torch", r.stderr)

    def test_bad_value_names_the_variable(self):
        r = self._import("yes")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("FABRICOLL_TORCH_EXT='yes'", r.stderr)


class Attach(unittest.TestCase):
    """The compiled front uses only a library this process already loaded (never a second
    copy): anything else is an error naming the path."""

    def test_a_library_not_loaded_is_refused(self):
        if os.environ.get("FABRICOLL_TORCH_EXT") == "0":
            harness.skip(self.id(), "FABRICOLL_TORCH_EXT=0: the compiled front is not built")
        code = ("import torch, fabricoll._c10d as x\n"
                "try:\n    x.attach('/nonexistent/libnccl_net_fabricoll.so')\n"
                "except RuntimeError as e:\n    print('refused:', e)\n")
        env = dict(os.environ, PYTHONPATH=harness.PY_DIR)
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=120, check=False)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("refused: fabricoll._c10d: /nonexistent/libnccl_net_fabricoll.so is not "
                      "loaded in this process", r.stdout)



_DEVICES = r"""
import os, sys, torch, torch.distributed as dist
import fabricoll.torch  # noqa: F401
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1")
assert dist.Backend.backend_capability["fabricoll"] == ["cpu", "cuda"], dist.Backend.backend_capability
dist.init_process_group("fabricoll")
pg = dist.group.WORLD
names = [type(pg._get_backend(torch.device(d))).__name__ for d in ("cpu", "cuda")]
print("backends", *names)
t = torch.ones(3)
dist.all_reduce(t)
dist.barrier()
dist.destroy_process_group()
"""


class Devices(unittest.TestCase):
    """"fabricoll" registers for CPU and CUDA tensors: one backend serves both devices of a
    group (the CUDA operations themselves run on the GPU machine, tests/gpu_cuda.py), and a
    CPU-only group is unchanged by it."""

    def test_one_backend_for_cpu_and_cuda(self):
        env = dict(os.environ, PYTHONPATH=harness.PY_DIR)
        r = subprocess.run([sys.executable, "-c", _DEVICES, str(free_port())], env=env,
                           capture_output=True, text=True, timeout=120, check=False)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("backends FabricollBackend FabricollBackend", r.stdout)


if __name__ == "__main__":
    unittest.main()
