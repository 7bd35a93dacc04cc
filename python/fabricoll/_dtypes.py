"""How torch tensors and ReduceOps map onto the engine's datatypes and reductions.

Reductions (allreduce, reduce, reduce_scatter) run in an engine datatype:

- float32/64/16, bfloat16, int8, uint8, int32, int64, uint32, uint64, float8_e4m3fn and
  float8_e5m2 map directly;
- bool runs as uint8 over the same memory: SUM as MAX and PRODUCT as MIN (logical or / and,
  as NCCL does), MIN, MAX, BAND, BOR and BXOR as they are; AVG and PREMUL_SUM are errors;
- complex32/64/128 run as float16/32/64 pairs (``view_as_real``): SUM, AVG and PREMUL_SUM
  only;
- int16 and uint16 (the engine has no 16-bit integers) are widened to int32 on a copy and
  narrowed back: integer arithmetic wraps modulo 2**16 either way, and MIN, MAX, the bitwise
  ops and AVG (truncating) give what 16-bit arithmetic gives;
- PREMUL_SUM multiplies a copy of the input by the op's factor (a number or a tensor),
  then sums; floating types only;
- AVG on integers truncates toward zero (the engine's rule, as NCCL's).

Any other dtype (the fnuz float8s, float8_e8m0fnu, sub-byte, bit and quantized types) is an
error naming the op and the dtype. Data movement (broadcast, gathers, scatters, all-to-all,
send/recv) is byte copying and takes every dtype.

Tensors that are not contiguous are handled on a contiguous copy that is copied back.
"""

import torch
from torch.distributed import ReduceOp

from . import _capi as c

DIRECT = {
    torch.float32: c.FLOAT32,
    torch.float64: c.FLOAT64,
    torch.float16: c.FLOAT16,
    torch.bfloat16: c.BFLOAT16,
    torch.int8: c.INT8,
    torch.uint8: c.UINT8,
    torch.int32: c.INT32,
    torch.int64: c.INT64,
    torch.uint32: c.UINT32,
    torch.uint64: c.UINT64,
    torch.float8_e4m3fn: c.FP8_E4M3,
    torch.float8_e5m2: c.FP8_E5M2,
}
_FLOATS = {c.FLOAT32, c.FLOAT64, c.FLOAT16, c.BFLOAT16, c.FP8_E4M3, c.FP8_E5M2}
_COMPLEX = {torch.complex32, torch.complex64, torch.complex128}
_WIDENED = {torch.int16, torch.uint16}

_RT = ReduceOp.RedOpType
OP_NAMES = {
    int(_RT.SUM): "SUM", int(_RT.AVG): "AVG", int(_RT.PRODUCT): "PRODUCT",
    int(_RT.MIN): "MIN", int(_RT.MAX): "MAX", int(_RT.BAND): "BAND", int(_RT.BOR): "BOR",
    int(_RT.BXOR): "BXOR", int(_RT.PREMUL_SUM): "PREMUL_SUM",
}  # fmt: skip
_C_OPS = {
    int(_RT.SUM): c.SUM, int(_RT.AVG): c.AVG, int(_RT.PRODUCT): c.PROD, int(_RT.MIN): c.MIN,
    int(_RT.MAX): c.MAX, int(_RT.BAND): c.BAND, int(_RT.BOR): c.BOR, int(_RT.BXOR): c.BXOR,
    int(_RT.PREMUL_SUM): c.SUM,
}  # fmt: skip
_BOOL_OPS = {int(_RT.SUM): c.MAX, int(_RT.PRODUCT): c.MIN}
_BITWISE = {c.BAND, c.BOR, c.BXOR}


class Unsupported(ValueError):
    """An op, dtype or form this backend cannot run (the message names them)."""


class Reduction:
    """The engine's side of one reduction: ``dtype`` and ``op`` (C values) and ``factor``
    (PREMUL_SUM's multiplier, else None)."""

    __slots__ = ("dtype", "op", "factor")

    def __init__(self, dtype, op, factor):
        self.dtype, self.op, self.factor = dtype, op, factor


def _factor(reduce_op):
    """PREMUL_SUM's factor: torch 2.15's ReduceOp shows it (``factor``); 2.11's only to C++,
    where the compiled front (always there on 2.11) reads it."""
    f = getattr(reduce_op, "factor", None)
    if f is None and isinstance(reduce_op, ReduceOp) and not hasattr(reduce_op, "factor"):
        try:
            from . import _c10d  # pylint: disable=import-outside-toplevel
        except ImportError:
            _c10d = None
        if _c10d is not None:
            f = _c10d.premul_factor(reduce_op)
    if f is None:
        raise Unsupported("PREMUL_SUM without a factor")
    return f


# (dtype, op kind) -> Reduction, for the ops without a factor (the hot path's lookup).
_CACHE = {}


def reduction(opname, dtype, reduce_op):
    """The engine datatype and op that run ``reduce_op`` on ``dtype`` tensors (raises
    :class:`Unsupported` naming ``opname`` otherwise)."""
    kind = reduce_op.op.value if hasattr(reduce_op, "op") else int(reduce_op)
    red = _CACHE.get((dtype, kind))
    if red is None:
        red = _reduction(opname, dtype, kind, reduce_op)
        if red.factor is None:
            _CACHE[(dtype, kind)] = red
    return red


def _reduction(opname, dtype, kind, reduce_op):
    name = OP_NAMES.get(kind)
    if name is None:
        raise Unsupported(f"fabricoll {opname}: reduce op {reduce_op} is not supported")
    premul = kind == int(_RT.PREMUL_SUM)
    factor = _factor(reduce_op) if premul else None
    if dtype == torch.bool:
        if kind in (int(_RT.AVG), int(_RT.PREMUL_SUM)):
            raise Unsupported(f"fabricoll {opname}: ReduceOp.{name} is not defined on torch.bool")
        return Reduction(c.UINT8, _BOOL_OPS.get(kind, _C_OPS[kind]), None)
    if dtype in _COMPLEX:
        if kind not in (int(_RT.SUM), int(_RT.AVG), int(_RT.PREMUL_SUM)):
            raise Unsupported(
                f"fabricoll {opname}: ReduceOp.{name} is not defined on {dtype} "
                "(complex tensors take SUM, AVG and PREMUL_SUM)"
            )
        real = torch.view_as_real(torch.empty(0, dtype=dtype)).dtype
        return Reduction(DIRECT[real], _C_OPS[kind], factor)
    if dtype in _WIDENED:
        cdt = c.INT32
    else:
        cdt = DIRECT.get(dtype)
        if cdt is None:
            raise Unsupported(
                f"fabricoll {opname}: dtype {dtype} cannot be reduced "
                f"(the engine reduces {', '.join(sorted(str(d) for d in DIRECT))}, "
                "bool, complex, int16 and uint16)"
            )
    op = _C_OPS[kind]
    if cdt in _FLOATS and op in _BITWISE:
        raise Unsupported(f"fabricoll {opname}: ReduceOp.{name} is not defined on {dtype}")
    if premul and cdt not in _FLOATS and dtype not in _COMPLEX:
        raise Unsupported(f"fabricoll {opname}: ReduceOp.PREMUL_SUM needs a floating dtype, not {dtype}")
    return Reduction(cdt, op, factor)


def engine_view(t):
    """``t`` (contiguous) as a tensor of an engine datatype: a view of the same memory,
    except for int16/uint16 (a widened copy). Returns (tensor, is_copy)."""
    dt = t.dtype
    if dt in DIRECT:
        return t, False
    if dt == torch.bool:
        return t.view(torch.uint8), False
    if dt in _COMPLEX:
        return torch.view_as_real(t), False
    if dt in _WIDENED:
        return t.to(torch.int32), True
    raise Unsupported(f"dtype {dt}")


class Buffer:
    """A tensor's memory as the engine reads or writes it (``engine``: contiguous, of an
    engine datatype) and, after a call, :meth:`finish` copies results back into the
    caller's tensor where ``engine`` is not that tensor's own memory."""

    __slots__ = ("user", "contig", "engine", "widened")

    def __init__(self, user, reducing=True):
        self.user = user
        self.contig = user if user.is_contiguous() else user.contiguous()
        if reducing:
            self.engine, self.widened = engine_view(self.contig)
        else:
            self.engine, self.widened = self.contig, False

    @property
    def copied(self):
        """Whether results must be copied back into the user's tensor."""
        return self.widened or self.contig is not self.user

    def finish(self):
        """Copy results back into the caller's tensor (a no-op when written in place)."""
        if self.widened:
            self.contig.copy_(self.engine)
        if self.contig is not self.user:
            self.user.copy_(self.contig)


def scaled(t, factor):
    """A new tensor: ``t`` (contiguous) times PREMUL_SUM's ``factor``, in ``t``'s dtype
    (float8 multiplies in float32: torch has no float8 arithmetic on CPU)."""
    if isinstance(factor, torch.Tensor):
        factor = factor.to("cpu")
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return (t.float() * factor).to(t.dtype)
    return t * factor


def nbytes(t):
    """The bytes of ``t``'s elements."""
    return t.numel() * t.element_size()
