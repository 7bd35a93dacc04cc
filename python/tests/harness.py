"""Shared settings of the torch tests: paths, the backend under test, providers, strict skips.

FABRICOLL_TEST_BACKEND names the backend under test (default "fabricoll"); "gloo" runs the whole
harness gloo against gloo, which is how it was built before the backend existed.
FABRICOLL_TEST_STRICT=1 turns every skip into a failure (scripts/test.sh sets it).
"""
import os
import shutil
import subprocess
import sys
import unittest

PY_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(PY_DIR)
BACKEND = os.environ.get("FABRICOLL_TEST_BACKEND", "fabricoll")


def target_dir():
    """$CARGO_TARGET_DIR, else the repository's target/."""
    return os.path.abspath(os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target")))


def strict():
    return os.environ.get("FABRICOLL_TEST_STRICT", "0") == "1"


def skip(test, why, stage="torch-tests"):
    """Skip `test` for `why`: unittest.SkipTest, or a failure under FABRICOLL_TEST_STRICT=1.
    The skip log's line starts with `stage` (scripts/test.sh's stage that ran the test)."""
    if strict():
        raise AssertionError(f"{test}: cannot run here: {why} (FABRICOLL_TEST_STRICT=1)")
    log = os.environ.get("FABRICOLL_SKIP_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{stage} {test}: {why}\n")
    raise unittest.SkipTest(why)


def provider_env(provider):
    """Variables that make fabricoll's ranks on this one host talk over `provider`."""
    env = {"FABRICOLL_PROVIDER": provider}
    if provider in ("net", "tcp"):
        # one host: without "same" the ranks would talk over shm, not over `provider`
        env["FABRICOLL_DOMAIN"] = "lo"
        env["FABRICOLL_INTRA_PROVIDER"] = "same"
    return env


_standalone = []


def python_backend_runs_alone():
    """Whether this torch can run fabricoll's Python backend on its own (its c10d Backend can
    be subclassed in Python: 2.15 yes, 2.11 no; fabricoll._backend.STANDALONE), asked of a
    child interpreter so that this one does not import torch."""
    if not _standalone:
        code = "import fabricoll._backend as b; print(b.STANDALONE)"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=PY_DIR), timeout=120, check=False)
        if r.returncode != 0 or r.stdout.strip() not in ("True", "False"):
            raise AssertionError(f"cannot tell whether the Python backend runs alone: {r.stderr}")
        _standalone.append(r.stdout.strip() == "True")
    return _standalone[0]


_offered = {}


def provider_offered(provider):
    """Whether libfabric offers `provider` with reliable datagram endpoints (fi_info)."""
    if provider not in _offered:
        if shutil.which("fi_info") is None:
            # no fi_info tool (libfabric's utilities not installed): the test runs and fails
            # on its own, with the library's error, if the provider is missing
            ok = True
        else:
            try:
                r = subprocess.run(["fi_info", "-p", provider, "-t", "FI_EP_RDM"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   timeout=60, check=False)
                ok = r.returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
        _offered[provider] = ok
    return _offered[provider]


def require(test, provider=None):
    """Skip `test` (strictly) when the backend under test or `provider` cannot run here."""
    if BACKEND == "fabricoll":
        lib = os.environ.get("FABRICOLL_LIB") or os.path.join(
            target_dir(), "release", "libnccl_net_fabricoll.so")
        if not os.path.exists(lib):
            skip(test, f"the library is not built ({lib}); run cargo build --release")
        if not os.path.exists(os.path.join(PY_DIR, "fabricoll", "torch.py")):
            skip(test, "python/fabricoll/torch.py (the backend) is missing")
    if provider is not None and BACKEND != "gloo" and not provider_offered(provider):
        skip(test, f"libfabric does not offer provider {provider}")
