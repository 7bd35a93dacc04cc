"""Creating a communicator through torch's store, with per-communicator options.

Rank 0 of the group makes the unique id (``fabricoll_get_unique_id_config``; its bootstrap
root listens on the address below) and puts it in the group's store; the other ranks read
it there, then every rank calls ``fabricoll_comm_init_rank_config``. Each creation on one
store takes a new key (a generation counted in the store), so a group re-created on the
same store never reads a stale id.

The root's address, first found: ``Options.bootstrap_addr``, ``FABRICOLL_BOOTSTRAP_ADDR``,
this host's address on the route to ``MASTER_ADDR`` (or to the TCPStore's host), else
127.0.0.1. It must be an IP address of the host that runs the group's rank 0.
"""

import ctypes
import os
import socket
from datetime import timedelta

from . import _capi as c

_MAX_MS = 86_400_000  # fabricoll_config.timeout_ms's upper bound (a day)


class Options:
    """Per-communicator options of the fabricoll backend (pass as ``pg_options`` to
    ``init_process_group`` or ``new_group``). Each None means the library's default, i.e.
    its environment variable:

    - ``provider``: libfabric provider (``FABRICOLL_PROVIDER``), e.g. ``"shm"``, ``"net"``,
      ``"tcp;ofi_rxm"``;
    - ``intra_provider``: provider between ranks of one host (``FABRICOLL_INTRA_PROVIDER``;
      ``"same"``: one fabric);
    - ``algo``: an algorithm name (``"ring"``, ``"tree"``, ...) or ``fabricoll_algo`` value
      (``FABRICOLL_ALGO``; ``"auto"``: the cost model);
    - ``bootstrap_addr``: the IP address rank 0's bootstrap root listens on;
    - ``timeout``: a ``timedelta`` that overrides the group's timeout;
    - ``inplace_restore``: True to have a failed in-place collective (``all_reduce`` is one)
      restore its tensor, at the cost of a copy of it on every such call; None (unless
      ``FABRICOLL_INPLACE_RESTORE`` is set) and False leave it undefined on failure, as gloo
      and NCCL do, and run without the copy;
    - ``compress``: the wire format of the group's compressed collectives
      (``FABRICOLL_COMPRESS``): ``"off"``, ``"bf16"``, ``"fp16"``, ``"fp8e4m3"``, ``"fp8e5m2"``,
      ``"int8"`` or ``"int4"``. all_reduce (sum, avg, premul_sum), reduce_scatter and all_gather of
      float32, bfloat16 and float16 tensors then send block-scaled codes, so DDP's and FSDP2's
      gradients and parameters travel compressed; every other operation and type is sent as
      it is. Every rank of the group must pass the same. Error bounds: docs/compression.md;
    - ``compress_block``: elements per scale of the codes, 1 .. 1048576
      (``FABRICOLL_COMPRESS_BLOCK``, else 256).
    """

    def __init__(self, provider=None, intra_provider=None, algo=None, bootstrap_addr=None,
                 timeout=None, inplace_restore=None, compress=None,
                 compress_block=None):  # fmt: skip
        self.provider = provider
        self.intra_provider = intra_provider
        self.algo = algo
        self.bootstrap_addr = bootstrap_addr
        self.timeout = timeout
        self.inplace_restore = inplace_restore
        # Checked here too, so that a bad name fails where it is written.
        _compress_value(compress)
        _compress_block_value(compress_block)
        self.compress = compress
        self.compress_block = compress_block

    def __repr__(self):
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if v is not None)
        return f"fabricoll.torch.Options({fields})"


def _algo_value(algo):
    if algo is None:
        return 0
    if isinstance(algo, int):
        return algo
    value = c.ALGOS.get(str(algo).strip().lower().replace("-", "_"))
    if value is None:
        raise ValueError(f"fabricoll Options.algo: unknown algorithm {algo!r} (one of {', '.join(c.ALGOS)})")
    return value


def _compress_value(name):
    """``fabricoll_config.compress`` for ``Options.compress`` (None: the environment's)."""
    if name is None:
        return c.COMPRESS_DEFAULT
    value = c.COMPRESS.get(str(name).strip().lower()) if isinstance(name, str) else None
    if value is None:
        raise ValueError(f"fabricoll Options.compress: unknown format {name!r} (one of "
                         f"{', '.join(c.COMPRESS)}, or None for FABRICOLL_COMPRESS)")
    return value


def _compress_block_value(block):
    """``fabricoll_config.compress_block`` for ``Options.compress_block`` (None: 0, the
    environment's)."""
    if block is None:
        return 0
    if isinstance(block, bool) or not isinstance(block, int) or \
            not 1 <= block <= c.MAX_COMPRESS_BLOCK:
        raise ValueError(f"fabricoll Options.compress_block: {block!r} is not an integer "
                         f"1..{c.MAX_COMPRESS_BLOCK} (or None for FABRICOLL_COMPRESS_BLOCK)")
    return block


def timeout_ms(timeout):
    """torch's timeout (a timedelta, or None) as ``fabricoll_config.timeout_ms`` (0: the
    library's default), clamped to 1 ms .. a day (the field's range)."""
    if timeout is None:
        return 0
    ms = int(timeout / timedelta(milliseconds=1))
    return max(1, min(ms, _MAX_MS))


def _store_host(store):
    """The host of the TCPStore under ``store`` (PrefixStores unwrapped), else None."""
    for _ in range(16):
        host = getattr(store, "host", None)
        if isinstance(host, str) and host:
            return host
        store = getattr(store, "underlying_store", None)
        if store is None:
            return None
    return None


def _route_to(host):
    """This host's address on the route to ``host`` (no packet is sent), else None."""
    try:
        info = socket.getaddrinfo(host, 1, type=socket.SOCK_DGRAM)[0]
    except (OSError, IndexError):
        return None
    family, _, _, _, addr = info
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect(addr)
            return s.getsockname()[0]
        except OSError:
            return None


def bootstrap_addr(options, store):
    """The address rank 0's root listens on (see the module's documentation)."""
    if options.bootstrap_addr:
        return options.bootstrap_addr
    env = os.environ.get("FABRICOLL_BOOTSTRAP_ADDR", "").strip()
    if env:
        return env
    for host in (os.environ.get("MASTER_ADDR", "").strip(), _store_host(store)):
        if host:
            addr = _route_to(host)
            if addr:
                return addr
    return "127.0.0.1"


def _inplace_value(restore):
    """``fabricoll_config.inplace`` for ``Options.inplace_restore``. torch's in-place
    collectives promise nothing about a failed call's tensor (gloo leaves it half reduced), so
    None asks for the copy-free path unless the environment chose (FABRICOLL_INPLACE_RESTORE)."""
    if restore is None:
        if os.environ.get("FABRICOLL_INPLACE_RESTORE", "").strip():
            return c.INPLACE_DEFAULT
        return c.INPLACE_UNDEFINED
    return c.INPLACE_RESTORE if restore else c.INPLACE_UNDEFINED


def _config(options, timeout, addr):
    """A ``fabricoll_config`` and the bytes its strings point into (keep both alive)."""
    lib = c.lib()
    if not lib.has("fabricoll_config_init_size"):
        lib.fabricoll_config_init_size()  # raises NotImplementedError naming it
    cfg = c.Config()
    # The struct's size as Python declares it: the library writes no further.
    c.call("config_init_size", ctypes.byref(cfg), ctypes.sizeof(cfg))
    cfg.timeout_ms = timeout_ms(options.timeout or timeout)
    cfg.algo = _algo_value(options.algo)
    cfg.inplace = _inplace_value(getattr(options, "inplace_restore", None))
    cfg.compress = _compress_value(getattr(options, "compress", None))
    cfg.compress_block = _compress_block_value(getattr(options, "compress_block", None))
    keep = []
    for field in ("provider", "intra_provider"):
        value = getattr(options, field)
        if value is not None:
            keep.append(str(value).encode())
            setattr(cfg, field, keep[-1])
    if addr is not None:
        keep.append(str(addr).encode())
        cfg.bootstrap_addr = keep[-1]
    return cfg, keep


def create_comm(store, rank, size, timeout, options):
    """This rank's communicator handle for a group of ``size`` ranks meeting in ``store``."""
    generation = (store.add("fabricoll/created", 1) - 1) // size
    key = f"fabricoll/unique_id/{generation}"
    addr = bootstrap_addr(options, store) if rank == 0 else None
    cfg, keep = _config(options, timeout, addr)
    uid = c.UniqueId()
    if rank == 0:
        c.call("get_unique_id_config", ctypes.byref(uid), ctypes.byref(cfg))
        store.set(key, bytes(uid))
    else:
        data = store.get(key)
        if len(data) != ctypes.sizeof(uid):
            raise RuntimeError(f"fabricoll: the store's {key} holds {len(data)} bytes, not a unique id")
        uid = c.UniqueId.from_buffer_copy(data)
    comm = ctypes.c_void_p()
    c.call("comm_init_rank_config", ctypes.byref(comm), size, ctypes.byref(uid), rank, ctypes.byref(cfg))
    del keep
    return comm.value
