"""torch.distributed backend ``"fabricoll"`` for CPU and CUDA tensors.

``import fabricoll.torch`` registers it; then::

    dist.init_process_group("fabricoll")                 # CPU and CUDA tensors on fabricoll
    dist.init_process_group("cpu:fabricoll,cuda:nccl")   # CPU tensors here, CUDA on NCCL
    dist.new_group(ranks, backend="fabricoll")
    init_device_mesh("cpu", (2, 2))                      # once fabricoll is the default

Functional collectives (``torch.distributed._functional_collectives``), DDP and FSDP2 on
CPU run through it, also under ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (torch's checking wrapper). Options per group: pass :class:`Options` as ``pg_options``; torch's
``timeout`` becomes the communicator's timeout (``fabricoll_config.timeout_ms``: the most
any operation waits without progress). What each operation supports and how dtypes map:
:mod:`fabricoll._backend` and :mod:`fabricoll._dtypes`.

Works: ``wait()`` blocks in the calling thread; ``get_future()`` hands the operation to the
library, which completes the future from its progress thread, so futures complete by
themselves (DDP only uses futures). ``wait(timeout)`` raises ``TimeoutError`` when the
timeout passes first. On the Python backend alone, a Work that torch returns to Python reports
``is_completed()`` from torch's side only (torch's wrapper does not forward it); use ``wait``
or the future.

Two implementations: ``fabricoll._c10d``, a compiled ``c10d::Backend`` (fabricoll/csrc/), runs
all_reduce, all_gather_into_tensor, reduce_scatter_tensor, broadcast, barrier,
gather_into_tensor, send and recv on plain CPU tensors through the C API without Python, and
hands every other operation and form to the Python backend (:mod:`fabricoll._backend`), which
implements them all on CPU tensors. It is used when it was built for this torch
(``python/setup.py`` builds it when torch is importable); ``FABRICOLL_TORCH_EXT`` = ``0`` runs the Python backend alone, ``1``
requires the compiled front (an error when it does not load), unset: the compiled front where
it loads.

CUDA tensors run on the compiled front only, each operation one stream-ordered call of the C
API on torch's current stream (a side stream bridged by events when that is the legacy default
stream): all_reduce, all_gather_into_tensor, reduce_scatter_tensor, broadcast, reduce,
gather_into_tensor, all_to_all_single (equal splits), all_gather and reduce_scatter (lists
for one tensor), send and recv. The call returns once
enqueued; ``wait()`` makes the current stream wait (the host does not block, as with NCCL),
futures are completed on the device at once, and ``barrier`` first waits on the host for the
CUDA operations issued before it. Other forms on CUDA tensors raise an error naming them.

torch versions: 2.15 (what the tests are written against) and 2.11. On 2.11 torch's c10d
Backend cannot be subclassed in Python, so the Python backend cannot run alone there: the
compiled front is required, and importing this module without it (or with
``FABRICOLL_TORCH_EXT=0``) raises an ImportError that says how to build it.

Environment: ``FABRICOLL_LIB`` (the library to load), ``FABRICOLL_BOOTSTRAP_ADDR`` and
``MASTER_ADDR`` (where rank 0's bootstrap root listens; see :mod:`fabricoll._bootstrap`);
the library itself reads its own variables (``FABRICOLL_PROVIDER``, ``FABRICOLL_ALGO``, ...)
for whatever :class:`Options` leaves unset.
"""

import os

import torch
import torch.distributed as dist

from ._backend import STANDALONE, FabricollBackend
from . import _capi
from ._bootstrap import Options, create_comm

__all__ = ["FabricollBackend", "Options", "NAME", "compiled"]

NAME = "fabricoll"

_BUILD = ("build it for this torch: pip install --no-build-isolation ./python, or "
          "python setup.py build_ext --inplace in python/ (needs g++ and this torch importable)")


def _load_compiled():
    """fabricoll._c10d, or None: FABRICOLL_TORCH_EXT=0, or not built for this torch.
    ImportError naming the reason where the backend cannot run without it
    (FABRICOLL_TORCH_EXT=1, or a torch whose c10d Backend Python cannot subclass)."""
    want = os.environ.get("FABRICOLL_TORCH_EXT", "").strip()
    if want not in ("", "0", "1"):
        raise ValueError(f"FABRICOLL_TORCH_EXT={want!r}: expected 0 (Python only) or 1 (compiled required)")
    alone = ("" if STANDALONE else
             f"torch {torch.__version__}'s c10d Backend cannot be subclassed in Python, so "
             "the Python backend cannot run alone and fabricoll.torch needs its compiled "
             "front (fabricoll._c10d)")
    if want == "0":
        if alone:
            raise ImportError(f"FABRICOLL_TORCH_EXT=0 asks for the Python backend alone, but "
                              f"{alone}: unset FABRICOLL_TORCH_EXT")
        return None
    try:
        from . import _c10d
    except ImportError as e:
        if want == "1":
            raise ImportError(
                f"FABRICOLL_TORCH_EXT=1 but fabricoll._c10d does not load for torch "
                f"{torch.__version__}: {e} ({_BUILD})"
            ) from e
        if alone:
            raise ImportError(f"{alone}, which does not load: {e} ({_BUILD})") from e
        return None
    return _c10d


_compiled = _load_compiled()


def compiled():
    """Whether groups run on the compiled front (fabricoll._c10d)."""
    return _compiled is not None


def _create(dist_opts, backend_options):
    """torch's creator (extended API): one communicator per group."""
    options = backend_options if isinstance(backend_options, Options) else Options()
    timeout = options.timeout or dist_opts.timeout
    rank, size = dist_opts.group_rank, dist_opts.group_size
    comm = create_comm(dist_opts.store, rank, size, timeout, options)
    backend = FabricollBackend(rank, size, comm, timeout)
    if _compiled is None:
        return backend
    _compiled.attach(_capi.lib().path)
    # the front's own host waits (a barrier after CUDA work) take the group's timeout, or
    # torch's default one where the group has none
    wait_s = timeout.total_seconds() if timeout is not None else 1800.0
    front = _compiled.FabricollBackend(backend, comm, rank, size, wait_s)
    backend._front = front  # detached before the communicator is destroyed
    return front


def register():
    """Register the backend with torch.distributed (done at import; idempotent)."""
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu", "cuda"])


register()
