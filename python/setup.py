"""Build hook: ship libnccl_net_fabricoll.so inside the package (fabricoll/lib/), and build
the torch backend's compiled front, ``fabricoll._c10d`` (fabricoll/csrc/), when torch is
importable at build time (``pip install --no-build-isolation ./python`` in an environment
with torch; ``FABRICOLL_TORCH_EXT=0`` skips it). Without it the backend runs in Python alone.

The library comes from ``FABRICOLL_LIB`` when set, else from the repository's
``target/release`` (running ``cargo build --release`` in the repository root first when it
is not built yet). The package's version is the library's (``fabricoll_version()``).
The wheel is platform-specific, since it carries a shared library.
"""

import ctypes
import os
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LIB = "libnccl_net_fabricoll.so"


def library():
    """The path of the library to ship, building it when needed."""
    env = os.environ.get("FABRICOLL_LIB")
    if env:
        if not os.path.isfile(env):
            raise SystemExit(f"FABRICOLL_LIB={env} is not a file")
        return env
    built = os.path.join(REPO, "target", "release", LIB)
    if not os.path.isfile(built):
        if not os.path.isfile(os.path.join(REPO, "Cargo.toml")):
            raise SystemExit(
                f"{LIB} not found: build from the fabricoll repository (python/ inside it) "
                "or set FABRICOLL_LIB to a built library"
            )
        print(f"building {LIB}: cargo build --release in {REPO}")
        subprocess.run(["cargo", "build", "--release"], cwd=REPO, check=True)
    return built


def version():
    lib = ctypes.CDLL(library())
    lib.fabricoll_version.restype = ctypes.c_char_p
    return lib.fabricoll_version().decode()


def torch_extension():
    """(cmdclass, ext_modules) for fabricoll._c10d, or ({}, []) when it is not built."""
    if os.environ.get("FABRICOLL_TORCH_EXT") == "0":
        return {}, []
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        print("fabricoll: torch is not importable here: fabricoll._c10d is not built "
              "(the torch backend runs in Python alone)")
        return {}, []
    csrc = os.path.join("fabricoll", "csrc")
    ext = CppExtension(
        "fabricoll._c10d",
        sources=[os.path.join(csrc, f) for f in ("api.cpp", "work.cpp", "backend.cpp", "module.cpp")],
        include_dirs=[os.path.join(REPO, "include")],
        extra_compile_args=["-O2", "-g0", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter"],
        libraries=["dl"],
    )
    return {"build_ext": BuildExtension}, [ext]


class BuildPy(build_py):
    """Copies the library into the built package."""

    def run(self):
        super().run()
        dest = os.path.join(self.build_lib, "fabricoll", "lib")
        os.makedirs(dest, exist_ok=True)
        shutil.copy2(library(), os.path.join(dest, LIB))


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


_cmdclass, _ext_modules = torch_extension()
setup(
    version=version(),
    cmdclass={"build_py": BuildPy, **_cmdclass},
    ext_modules=_ext_modules,
    distclass=BinaryDistribution,
)
