"""ctypes declarations of fabricoll's C API (include/fabricoll.h).

The library is found, first match wins, at:

1. ``FABRICOLL_LIB`` (a path to ``libnccl_net_fabricoll.so``);
2. this package's own ``fabricoll/lib/libnccl_net_fabricoll.so`` (what a wheel carries);
3. the repository's ``target/release/libnccl_net_fabricoll.so`` (a source checkout).

Every function has its ``argtypes`` and ``restype`` set. A failed call raises
:class:`FabricollError`, carrying the status and ``fabricoll_last_error()`` (read in the
same thread, right after the call, as the C API requires). ctypes releases the GIL for
the duration of each call, so a blocking call does not stall other Python threads.

Functions that this build of the library does not export (older builds lack those added
with the torch backend) raise :class:`NotImplementedError` naming the function when used, never at
import.
"""

import ctypes
import os
import threading
from ctypes import POINTER, c_char, c_char_p, c_int, c_size_t, c_void_p

LIB_NAME = "libnccl_net_fabricoll.so"

# fabricoll_status values (stable; new codes are only appended).
SUCCESS = 0
INVALID_ARGUMENT = 1
INVALID_USAGE = 2
SYSTEM_ERROR = 3
INTERNAL_ERROR = 4
REMOTE_ERROR = 5
TIMEOUT = 6
IN_PROGRESS = 7

# fabricoll_datatype values (NCCL's).
INT8, UINT8, INT32, UINT32, INT64, UINT64 = 0, 1, 2, 3, 4, 5
FLOAT16, FLOAT32, FLOAT64, BFLOAT16, FP8_E4M3, FP8_E5M2 = 6, 7, 8, 9, 10, 11

# fabricoll_redop values.
SUM, PROD, MAX, MIN, AVG, BAND, BOR, BXOR = 0, 1, 2, 3, 4, 5, 6, 7

# Largest tag of fabricoll_send_tagged / fabricoll_recv_tagged (FABRICOLL_MAX_TAG).
MAX_TAG = 1048575

# fabricoll_algo names, for the backend's options (FABRICOLL_ALGO's spelling).
ALGOS = {
    "auto": 0, "ring": 1, "bidir_ring": 2, "mesh": 3, "mesh1": 4, "rdh": 5, "rd": 6,
    "tree": 7, "dbtree": 8, "bruck": 9, "pairwise": 10, "hier": 11, "swizzle": 12,
}  # fmt: skip


class UniqueId(ctypes.Structure):
    """``fabricoll_unique_id``: 128 opaque bytes, copied to every rank."""

    _fields_ = [("internal", c_char * 128)]


class Config(ctypes.Structure):
    """``fabricoll_config``: per-communicator options (``fabricoll_config_init_size`` defaults)."""

    _fields_ = [
        ("size", c_size_t),
        ("timeout_ms", c_int),
        ("algo", c_int),
        ("provider", c_char_p),
        ("intra_provider", c_char_p),
        ("bootstrap_addr", c_char_p),
        ("inplace", c_int),
        ("compress", c_int),
        ("compress_block", c_int),
    ]


# fabricoll_inplace: what a failed in-place collective leaves in the caller's buffer.
INPLACE_DEFAULT = 0  # FABRICOLL_INPLACE_RESTORE decides (unset: undefined)
INPLACE_RESTORE = 1  # the input again (each call copies it aside first)
INPLACE_UNDEFINED = 2  # undefined, as MPI, NCCL and gloo (no copy)


# fabricoll_compress: the wire format of compressed collectives (FABRICOLL_COMPRESS's names;
# docs/compression.md). DEFAULT (0) defers to the environment.
COMPRESS_DEFAULT = 0
COMPRESS = {"off": 1, "bf16": 2, "fp16": 3, "fp8e4m3": 4, "fp8e5m2": 5, "int8": 6, "int4": 7}

# fabricoll_config.compress_block's range (0: FABRICOLL_COMPRESS_BLOCK, else 256).
MAX_COMPRESS_BLOCK = 1 << 20


# void (*fabricoll_callback)(void *user_data, int status)
CALLBACK = ctypes.CFUNCTYPE(None, c_void_p, c_int)

_ST = c_int  # fabricoll_status
_P = c_void_p  # buffers and opaque handles
_PP = POINTER(c_void_p)  # fabricoll_request ** / fabricoll_comm **
_SZ = c_size_t
_SZP = POINTER(c_size_t)

# name: (restype, argtypes). The non-blocking twin of each call is the same list plus _PP.
_BLOCKING = {
    "allreduce": [_P, _P, _SZ, c_int, c_int, _P],
    "allgather": [_P, _P, _SZ, c_int, _P],
    "reducescatter": [_P, _P, _SZ, c_int, c_int, _P],
    "broadcast": [_P, _P, _SZ, c_int, c_int, _P],
    "reduce": [_P, _P, _SZ, c_int, c_int, c_int, _P],
    "alltoall": [_P, _P, _SZ, c_int, _P],
    "send": [_P, _SZ, c_int, c_int, _P],
    "recv": [_P, _SZ, c_int, c_int, _P],
    "gather": [_P, _P, _SZ, c_int, c_int, _P],
    "scatter": [_P, _P, _SZ, c_int, c_int, _P],
    "barrier": [_P],
    "allgatherv": [_P, _SZ, _P, _SZP, _SZP, c_int, _P],
    "reducescatterv": [_P, _P, _SZP, c_int, c_int, _P],
    "alltoallv": [_P, _SZP, _SZP, _P, _SZP, _SZP, c_int, _P],
    "send_tagged": [_P, _SZ, c_int, c_int, c_int, _P],
    "recv_tagged": [_P, _SZ, c_int, c_int, c_int, _P],
}
_SIGNATURES = {
    "fabricoll_version": (c_char_p, []),
    "fabricoll_status_string": (c_char_p, [c_int]),
    "fabricoll_last_error": (c_char_p, []),
    "fabricoll_test": (_ST, [_P, POINTER(c_int)]),
    "fabricoll_wait": (_ST, [_P]),
    "fabricoll_get_unique_id": (_ST, [POINTER(UniqueId)]),
    "fabricoll_comm_init_rank": (_ST, [_PP, c_int, POINTER(UniqueId), c_int]),
    "fabricoll_comm_destroy": (_ST, [_P]),
    "fabricoll_comm_abort": (_ST, [_P]),
    "fabricoll_comm_rank": (_ST, [_P, POINTER(c_int)]),
    "fabricoll_comm_size": (_ST, [_P, POINTER(c_int)]),
    "fabricoll_comm_set_algo": (_ST, [_P, c_int]),
    "fabricoll_request_notify": (_ST, [_P, CALLBACK, _P]),
    "fabricoll_group_start": (_ST, []),
    "fabricoll_group_end": (_ST, []),
    "fabricoll_config_init_size": (_ST, [POINTER(Config), c_size_t]),
    "fabricoll_get_unique_id_config": (_ST, [POINTER(UniqueId), POINTER(Config)]),
    "fabricoll_comm_init_rank_config": (
        _ST,
        [_PP, c_int, POINTER(UniqueId), c_int, POINTER(Config)],
    ),
}
for _name, _args in _BLOCKING.items():
    _SIGNATURES["fabricoll_" + _name] = (_ST, _args)
    _SIGNATURES["fabricoll_i" + _name] = (_ST, _args + [_PP])


class FabricollError(RuntimeError):
    """A failed C call: ``status`` (a fabricoll_status value), its ``status_name``,
    the library's ``message`` and the ``function`` that failed."""

    def __init__(self, function, status, message):
        self.function = function
        self.status = status
        self.status_name = status_string(status)
        self.message = message
        super().__init__(f"{function} failed: {self.status_name} ({status}): {message}")


class _Missing:
    """Stands for a function this build of the library does not export."""

    def __init__(self, name, path):
        self.__name__ = name
        self._path = path

    def __call__(self, *args):
        raise NotImplementedError(
            f"{self.__name__} is not exported by {self._path}: this build of fabricoll "
            f"predates it (rebuild the library with `cargo build --release`)"
        )

    def __bool__(self):
        return False


def _candidates():
    env = os.environ.get("FABRICOLL_LIB")
    if env:
        return [("FABRICOLL_LIB", env)]
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    return [
        ("the package", os.path.join(here, "lib", LIB_NAME)),
        ("the repository", os.path.join(repo, "target", "release", LIB_NAME)),
    ]


# Signals whose handlers loading the library must leave as they were. Debian's libfabric links
# its psm provider, whose libinfinipath installs, in its load-time constructor, handlers for
# these that call exit() inside the handler: a SIGTERM (multiprocessing's terminate of a
# rank's peers) then runs the process's exit handlers and library destructors while its
# threads still run, corrupting the heap; the crash that follows re-enters exit() in the
# same handler and deadlocks, so the process never ends. It also replaces Python's SIGINT
# handler (no KeyboardInterrupt).
_KEPT_SIGNALS = ("SIGSEGV", "SIGBUS", "SIGILL", "SIGABRT", "SIGINT", "SIGTERM")

# Bytes that hold a C `struct sigaction` (152 on x86-64 and aarch64 glibc), with room to spare.
_SIGACTION_BYTES = 512


def _load_keeping_signals(path):
    """``ctypes.CDLL(path)``, with the handlers of ``_KEPT_SIGNALS`` restored afterwards
    to what they were before the load (the library and its dependencies install none of their
    own that the process keeps)."""
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        sigaction = libc.sigaction
        sigaction.argtypes = [c_int, c_void_p, c_void_p]
        sigaction.restype = c_int
    except (OSError, AttributeError):
        return ctypes.CDLL(path)  # no sigaction to call: nothing to save
    saved = []
    for name in _KEPT_SIGNALS:
        num = getattr(signal, name, None)
        if num is None:
            continue
        buf = ctypes.create_string_buffer(_SIGACTION_BYTES)
        if sigaction(int(num), None, buf) == 0:
            saved.append((int(num), buf))
    try:
        return ctypes.CDLL(path)
    finally:
        for num, buf in saved:
            sigaction(num, buf, None)


class _Lib:
    """The loaded library: each C function is an attribute (missing ones are falsy)."""

    def __init__(self):
        tried = []
        for origin, path in _candidates():
            if origin == "FABRICOLL_LIB" or os.path.exists(path):
                try:
                    self.dll = _load_keeping_signals(path)
                except OSError as e:
                    raise OSError(f"cannot load fabricoll from {origin} ({path}): {e}") from e
                self.path = path
                break
            tried.append(path)
        else:
            raise OSError(
                f"fabricoll's library {LIB_NAME} was not found; tried {', '.join(tried)}. "
                "Build it (`cargo build --release` in the repository) or set FABRICOLL_LIB"
            )
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(self.dll, name, None)
            if fn is None:
                setattr(self, name, _Missing(name, self.path))
                continue
            fn.restype = restype
            fn.argtypes = argtypes
            setattr(self, name, fn)

    def has(self, name):
        """Whether the library exports ``name``."""
        return not isinstance(getattr(self, name), _Missing)


_lib = None
_lib_lock = threading.Lock()


def lib():
    """The loaded library (loaded at the first use)."""
    global _lib
    if _lib is None:
        with _lib_lock:
            if _lib is None:
                _lib = _Lib()
    return _lib


def status_string(status):
    """The library's name for a status value."""
    try:
        return lib().fabricoll_status_string(status).decode()
    except OSError:
        return f"status {status}"


def last_error():
    """This thread's last error message ("" if none)."""
    return (lib().fabricoll_last_error() or b"").decode(errors="replace")


def error(function, status):
    """The :class:`FabricollError` of ``function``'s failure (call in the failing thread)."""
    return FabricollError(function, status, last_error())


def check(function, status):
    """Raise :class:`FabricollError` unless ``status`` is SUCCESS."""
    if status != SUCCESS:
        raise error(function, status)


def call(name, *args):
    """Call ``fabricoll_<name>`` and raise on failure."""
    fn = getattr(lib(), "fabricoll_" + name)
    check(fn.__name__, fn(*args))


def version():
    """The library's version string."""
    return lib().fabricoll_version().decode()
