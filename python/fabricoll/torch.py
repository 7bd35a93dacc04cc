"""torch.distributed backend ``"fabricoll"`` for CPU tensors.

``import fabricoll.torch`` registers it; then::

    dist.init_process_group("fabricoll")                 # every CPU collective on fabricoll
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
timeout passes first. A Work that torch returns to Python reports ``is_completed()`` from
torch's side only (torch's wrapper does not forward it); use ``wait`` or the future.

Environment: ``FABRICOLL_LIB`` (the library to load), ``FABRICOLL_BOOTSTRAP_ADDR`` and
``MASTER_ADDR`` (where rank 0's bootstrap root listens; see :mod:`fabricoll._bootstrap`);
the library itself reads its own variables (``FABRICOLL_PROVIDER``, ``FABRICOLL_ALGO``, ...)
for whatever :class:`Options` leaves unset.
"""

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend


def _check_torch():
    """Older torch (2.11 has been seen) cannot construct a Python subclass of its c10d
    Backend ("No constructor defined"): say so at import, not at the first group."""
    try:
        _C10dBackend(0, 1)
    except TypeError as e:
        raise ImportError(
            f"fabricoll.torch needs a torch whose c10d Backend can be subclassed in Python "
            f"(tested: 2.15); this is torch {torch.__version__}: {e}"
        ) from None


_check_torch()

from ._backend import FabricollBackend  # noqa: E402
from ._bootstrap import Options, create_comm  # noqa: E402

__all__ = ["FabricollBackend", "Options", "NAME"]

NAME = "fabricoll"


def _create(dist_opts, backend_options):
    """torch's creator (extended API): one communicator per group."""
    options = backend_options if isinstance(backend_options, Options) else Options()
    timeout = options.timeout or dist_opts.timeout
    comm = create_comm(dist_opts.store, dist_opts.group_rank, dist_opts.group_size, timeout, options)
    return FabricollBackend(dist_opts.group_rank, dist_opts.group_size, comm, timeout)


def register():
    """Register the backend with torch.distributed (done at import; idempotent)."""
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu"])


register()
