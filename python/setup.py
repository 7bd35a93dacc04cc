"""Build hook: ship libnccl_net_fabricoll.so inside the package (fabricoll/lib/), and build
the torch backend's compiled front, ``fabricoll._c10d`` (fabricoll/csrc/), when torch is
importable at build time (``pip install --no-build-isolation ./python`` in an environment
with torch; ``FABRICOLL_TORCH_EXT=0`` skips it). Without it the backend runs in Python alone,
where torch allows that (2.15; on 2.11 the compiled front is required). It is built against
the torch found here, 2.15 or 2.11 (see OPTIONAL_VIRTUALS).

The library comes from ``FABRICOLL_LIB`` when set, else from the repository's
``target/release`` (running ``cargo build --release`` in the repository root first when it
is not built yet). The package's version is the library's (``fabricoll_version()``).
The wheel is platform-specific, since it carries a shared library.
"""

import ctypes
import hashlib
import os
import re
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


# c10d::Backend virtuals that only some supported torch versions declare: torch 2.15 has them
# all (the torchcomms names, with the older names kept as overridable aliases), 2.11 none.
# The compiled front overrides each one where the header declares it (FABRICOLL_C10D_<NAME>).
OPTIONAL_VIRTUALS = (
    "all_gather_single", "reduce_scatter_single", "all_to_all_single",
    "all_gather_single_coalesced", "reduce_scatter_single_coalesced",
    "gather_single", "gather_into_tensor",
)


def c10d_features(include_dirs):
    """-D flags for the OPTIONAL_VIRTUALS that the c10d Backend.hpp under `include_dirs`
    (torch's) declares; SystemExit naming the paths tried when there is none."""
    rel = os.path.join("torch", "csrc", "distributed", "c10d", "Backend.hpp")
    for d in include_dirs:
        path = os.path.join(d, rel)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            found = [name for name in OPTIONAL_VIRTUALS
                     if re.search(r"\bvirtual\s+c10::intrusive_ptr<Work>\s+" + name + r"\s*\(", text)]
            print(f"fabricoll: {path} declares {', '.join(found) or 'none'} of {', '.join(OPTIONAL_VIRTUALS)}")
            return [f"-DFABRICOLL_C10D_{name.upper()}" for name in found]
    raise SystemExit(f"fabricoll: no {rel} under torch's include paths {include_dirs}: this "
                     "torch has no c10d headers to build fabricoll._c10d against "
                     "(FABRICOLL_TORCH_EXT=0 skips it)")


def torch_extension():
    """(cmdclass, ext_modules) for fabricoll._c10d, or ({}, []) when it is not built."""
    if os.environ.get("FABRICOLL_TORCH_EXT") == "0":
        return {}, []
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths
    except ImportError:
        print("fabricoll: torch is not importable here: fabricoll._c10d is not built "
              "(the torch backend runs in Python alone)")
        return {}, []
    features = c10d_features(include_paths())
    built_for = " ".join([torch.__version__, *features])

    class BuildExt(BuildExtension):
        """torch's BuildExtension, keeping builds for different torch versions apart:
        distutils rebuilds by timestamps only, so a module or objects built against one torch
        would otherwise be taken as up to date for another (and fail to load: undefined
        symbols). Objects go to a build_temp per torch version; a module last built for
        another torch (a stamp in build_temp says which) is removed, so it is linked anew."""

        def finalize_options(self):
            super().finalize_options()
            self.stamps = self.build_temp
            self.build_temp = os.path.join(self.build_temp, "torch-" + torch.__version__)

        def build_extension(self, ext):
            path = os.path.abspath(self.get_ext_fullpath(ext.name))
            key = hashlib.sha256(path.encode()).hexdigest()[:16]
            stamp = os.path.join(self.stamps, f"built-for-{key}.txt")
            try:
                with open(stamp, encoding="utf-8") as f:
                    was = f.read()
            except OSError:
                was = None
            if was != built_for and os.path.exists(path):
                os.remove(path)
            super().build_extension(ext)
            os.makedirs(self.stamps, exist_ok=True)
            with open(stamp, "w", encoding="utf-8") as f:
                f.write(built_for)

    csrc = os.path.join("fabricoll", "csrc")
    ext = CppExtension(
        "fabricoll._c10d",
        sources=[os.path.join(csrc, f)
                 for f in ("api.cpp", "convert.cpp", "work.cpp", "stream_work.cpp", "forward.cpp",
                           "backend.cpp", "backend_cuda.cpp", "module.cpp")],
        include_dirs=[os.path.join(REPO, "include")],
        extra_compile_args=["-O2", "-g0", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror",
                            "-Wno-unused-parameter", *features],
        libraries=["dl"],
    )
    return {"build_ext": BuildExt}, [ext]


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
