"""The torch.distributed backend over one fabricoll communicator (CPU tensors).

Every operation starts a non-blocking C call (``fabricoll_i*``) and returns a
:class:`fabricoll._work.Work`. What torch sends a CPU backend, and how it runs:

- ``allreduce``, ``allreduce_coalesced``, ``reduce``: every ReduceOp (see
  :mod:`fabricoll._dtypes` for dtypes and PREMUL_SUM);
- ``allgather`` (lists; uneven sizes through allgatherv), ``all_gather_single``
  (``all_gather_into_tensor``), ``allgather_coalesced``, ``all_gather_single_coalesced``;
- ``reduce_scatter`` (lists; uneven through reducescatterv), ``reduce_scatter_single``
  (``reduce_scatter_tensor``), ``reduce_scatter_single_coalesced``;
- ``broadcast``, ``gather``, ``scatter``, ``barrier``, ``monitored_barrier`` (without the
  names of missing ranks); ``gather_single`` is implemented, but
  torch 2.15's trampoline for Python backends does not forward it, so without the compiled
  front ``dist.gather_into_tensor`` gets torch's own "does not support gather_single" error
  (the compiled front runs it itself; torch 2.11 has no ``gather_into_tensor``);
- ``alltoall`` (lists, uneven sizes) and ``all_to_all_single`` (with split sizes, through
  alltoallv);
- ``send`` / ``recv`` with tags 0 ..= ``FABRICOLL_MAX_TAG`` (``fabricoll_isend_tagged``);
- ``recv_anysource`` raises: the C API receives from a named peer only;
- coalescing blocks (``start_coalescing`` / ``end_coalescing``);
- ``abort`` (``fabricoll_comm_abort``: in-flight operations fail) and ``shutdown``
  (``fabricoll_comm_destroy``).

On a torch whose c10d Backend Python cannot subclass (2.11), :class:`FabricollBackend` is a
plain object that only the compiled front calls (:data:`STANDALONE`).

Data movement copies bytes, so it takes every dtype. A per-call ``opts.timeout`` is not
applied; the communicator's timeout (torch's group timeout) is.
"""

import atexit
import ctypes

import torch
from torch._C._distributed_c10d import Backend as _C10dBackend, ReduceOp

from . import _capi as c
from ._dtypes import DIRECT, Buffer, Unsupported, engine_view, nbytes, reduction, scaled
from ._work import Done, Work, WorkList

_U8 = c.UINT8
_STRIDED = torch.strided
_SUM = ReduceOp.SUM
_SUM_DIRECT = {dt: reduction("allreduce", dt, _SUM) for dt in DIRECT}
_DONE = Done([])
# What runs on CUDA tensors (the compiled front, in stream order), for the errors of the rest.
_CUDA_FORMS = ("; on CUDA tensors the compiled front (fabricoll._c10d) runs all_reduce, "
               "all_gather_into_tensor, reduce_scatter_tensor, broadcast, reduce, "
               "gather_into_tensor, all_to_all_single with equal splits, all_gather and "
               "reduce_scatter of one tensor, send and recv, one tensor per call, outside "
               "coalescing blocks")


def _IALLREDUCE(*args):
    # Bound at the first call (the library loads lazily), then replaced by the C function.
    global _IALLREDUCE
    _IALLREDUCE = c.lib().fabricoll_iallreduce
    return _IALLREDUCE(*args)


def _ALLREDUCE(*args):
    global _ALLREDUCE
    _ALLREDUCE = c.lib().fabricoll_allreduce
    return _ALLREDUCE(*args)


def _sizes(values):
    """A C ``size_t[]`` of ``values``."""
    return (ctypes.c_size_t * len(values))(*values)


def _displs(counts):
    out, acc = [], 0
    for n in counts:
        out.append(acc)
        acc += n
    return out


def _same_dtype(opname, tensors, dtype):
    """Raise unless every tensor has ``dtype`` (lists are moved as one flat buffer)."""
    for t in tensors:
        if t.dtype != dtype:
            raise Unsupported(f"fabricoll {opname}: mixed dtypes ({t.dtype} and {dtype})")


def _flat(tensors, dtype, opname="collective"):
    """One contiguous buffer holding ``tensors`` (all of ``dtype``) back to back."""
    if not tensors:
        return torch.empty(0, dtype=dtype)
    _same_dtype(opname, tensors, dtype)
    return torch.cat([t.reshape(-1) for t in tensors])


def _split_into(flat, outputs):
    """Copy consecutive pieces of ``flat`` into ``outputs``."""
    off = 0
    for o in outputs:
        n = o.numel()
        o.copy_(flat[off : off + n].view(o.shape))
        off += n


# Live backends, held until shutdown: torch may keep only the C++ side of a Python backend
# (TORCH_DISTRIBUTED_DEBUG=DETAIL wraps it in a C++ ProcessGroupWrapper), and without its
# Python object the C++ side no longer finds these methods. Destroyed at exit, before the
# interpreter finalizes, so that no progress thread calls back into a Python that is gone.
_live = set()


@atexit.register
def _shutdown_all():
    for b in list(_live):
        try:
            b.shutdown()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass


def _subclassable():
    """Whether this torch lets Python subclass its c10d Backend (2.15 does; 2.11's binding
    has no constructor: "No constructor defined")."""
    try:
        _C10dBackend(0, 1)
    except TypeError:
        return False
    return True


# Whether this backend can run on its own (registered with torch as it is). Where it cannot,
# it is a plain object that only the compiled front (fabricoll._c10d) calls, by these names.
STANDALONE = _subclassable()


class FabricollBackend(_C10dBackend if STANDALONE else object):
    """torch's Backend over one fabricoll communicator (``comm``: its handle): a subclass of
    torch's c10d Backend where torch allows one (:data:`STANDALONE`), else a plain object
    that the compiled front forwards to."""

    def __init__(self, rank, size, comm, timeout=None):
        if STANDALONE:
            super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._comm = comm
        self._timeout = timeout
        self._coalescing = None
        self._seq = 0  # collectives issued (torch's sequence number; point-to-point excluded)
        self._front = None  # the compiled front (fabricoll._c10d) over this backend, if any
        _live.add(self)

    # -- identity ------------------------------------------------------------------------

    def getBackendName(self):
        return "fabricoll"

    @property
    def supports_coalescing(self):
        return True

    def comm(self):
        """The communicator's handle (raises once the backend is shut down)."""
        if self._comm is None:
            raise RuntimeError("fabricoll: the communicator is shut down (shutdown or abort)")
        return self._comm

    # -- plumbing ------------------------------------------------------------------------

    def _start(self, opname, fn, *args):
        """Start ``fn(*args, comm, &request)``; the request's handle."""
        req = ctypes.c_void_p()
        rc = fn(*args, self.comm(), ctypes.byref(req))
        if rc:
            raise self._failed(opname, fn.__name__, rc)
        return req.value

    @staticmethod
    def _failed(opname, function, rc):
        err = c.error(function, rc)
        err.args = (f"fabricoll {opname}: {err.args[0]}",)
        return err

    def _get_sequence_number_for_group(self):
        return self._seq

    def _set_sequence_number_for_group(self):
        self._seq = 0

    def _work(self, opname, requests, result, finish=None, keep=None):
        if opname not in ("send", "recv"):
            self._seq += 1
        w = Work(opname, requests, result, finish, keep)
        if self._coalescing is not None:
            self._coalescing.append(w)
        return w

    def _one(self, tensors, opname):
        if len(tensors) != 1:
            raise Unsupported(f"fabricoll {opname}: expects one tensor per call, got {len(tensors)}")
        t = tensors[0]
        if t.device.type != "cpu":
            raise Unsupported(f"fabricoll {opname}: CPU tensors only, got one on {t.device}"
                              + (_CUDA_FORMS if t.device.type == "cuda" else ""))
        if t.is_sparse:
            raise Unsupported(f"fabricoll {opname}: sparse tensors are not supported")
        return t

    @staticmethod
    def _finish_all(bufs, extra=None):
        todo = [b for b in bufs if b.copied]
        if not todo and extra is None:
            return None

        def finish():
            if extra is not None:
                extra()
            for b in todo:
                b.finish()

        return finish

    def _sendbuf(self, buf, red):
        """The engine tensor to send: the buffer itself, or PREMUL_SUM's scaled copy."""
        if red.factor is None:
            return buf.engine
        return engine_view(scaled(buf.contig, red.factor))[0]

    # -- reductions ----------------------------------------------------------------------

    def _allreduce_one(self, opname, t, reduce_op):
        red = reduction(opname, t.dtype, reduce_op)
        buf = Buffer(t)
        send = self._sendbuf(buf, red)
        req = self._start(
            opname, c.lib().fabricoll_iallreduce, send.data_ptr(), buf.engine.data_ptr(),
            buf.engine.numel(), red.dtype, red.op,
        )  # fmt: skip
        return req, buf, send

    def allreduce(self, tensors, opts):
        t = tensors[0] if len(tensors) == 1 else None
        rop = opts.reduceOp
        if t is None:
            red = None
        elif rop == _SUM:  # the most common op, without reduction()'s lookups
            red = _SUM_DIRECT.get(t.dtype)
        else:
            red = reduction("allreduce", t.dtype, rop)
        comm = self._comm
        if (
            red is not None and red.factor is None and t.dtype in DIRECT and t.is_contiguous()
            and t.is_cpu and t.layout is _STRIDED and self._coalescing is None
            and comm is not None
        ):  # fmt: skip
            # The common case, kept short: in place on the caller's own memory; a synchronous
            # call (torch waits at once) runs the blocking C call.
            p = t.data_ptr()
            self._seq += 1
            if not opts.asyncOp:
                rc = _ALLREDUCE(p, p, t.numel(), red.dtype, red.op, comm)
                if rc:
                    raise self._failed("allreduce", "fabricoll_allreduce", rc)
                return _DONE  # torch waits on it and drops it; the caller never sees it
            req = ctypes.c_void_p()
            rc = _IALLREDUCE(p, p, t.numel(), red.dtype, red.op, comm, ctypes.byref(req))
            if rc:
                raise self._failed("allreduce", "fabricoll_iallreduce", rc)
            return Work("allreduce", [req.value], tensors, None, t)
        t = self._one(tensors, "allreduce")
        req, buf, send = self._allreduce_one("allreduce", t, opts.reduceOp)
        return self._work("allreduce", [req], tensors, self._finish_all([buf]), (buf, send))

    def allreduce_coalesced(self, tensors, opts):
        reqs, keep = [], []
        for t in tensors:
            self._one([t], "allreduce_coalesced")
            req, buf, send = self._allreduce_one("allreduce_coalesced", t, opts.reduceOp)
            reqs.append(req)
            keep.append((buf, send))
        finish = self._finish_all([b for b, _ in keep])
        return self._work("allreduce_coalesced", reqs, tensors, finish, keep)

    def reduce(self, tensors, opts):
        t = self._one(tensors, "reduce")
        red = reduction("reduce", t.dtype, opts.reduceOp)
        buf = Buffer(t)
        send = self._sendbuf(buf, red)
        req = self._start(
            "reduce", c.lib().fabricoll_ireduce, send.data_ptr(), buf.engine.data_ptr(),
            buf.engine.numel(), red.dtype, red.op, opts.rootRank,
        )  # fmt: skip
        finish = self._finish_all([buf]) if self._rank == opts.rootRank else None
        return self._work("reduce", [req], tensors, finish, (buf, send))

    def _reduce_scatter_flat(self, opname, flat_in, out, reduce_op, counts=None):
        """Reduce-scatter ``flat_in`` (a contiguous buffer of ``out``'s dtype, the ranks'
        blocks back to back) into ``out``; ``counts``: uneven block sizes (elements)."""
        red = reduction(opname, out.dtype, reduce_op)
        if red.factor is not None:
            flat_in = scaled(flat_in, red.factor)
        send, _ = engine_view(flat_in)
        buf = Buffer(out)
        lib = c.lib()
        if counts is None:
            if send.numel() != buf.engine.numel() * self._size:
                raise Unsupported(
                    f"fabricoll {opname}: the input has {flat_in.numel()} elements, not "
                    f"{self._size} x the output's {out.numel()}"
                )
            req = self._start(
                opname, lib.fabricoll_ireducescatter, send.data_ptr(), buf.engine.data_ptr(),
                buf.engine.numel(), red.dtype, red.op,
            )  # fmt: skip
            keep = (send, buf)
        else:
            scale = 2 if flat_in.is_complex() else 1  # complex runs as (re, im) pairs
            recvcounts = _sizes([n * scale for n in counts])
            req = self._start(
                opname, lib.fabricoll_ireducescatterv, send.data_ptr(), buf.engine.data_ptr(),
                recvcounts, red.dtype, red.op,
            )  # fmt: skip
            keep = (send, buf, recvcounts)
        return req, buf, keep

    def reduce_scatter(self, output_tensors, input_tensors, opts):
        out = self._one(output_tensors, "reduce_scatter")
        ins = input_tensors[0]
        if len(ins) != self._size:
            raise Unsupported(f"fabricoll reduce_scatter: {len(ins)} inputs for {self._size} ranks")
        counts = [t.numel() for t in ins]
        uneven = None if len(set(counts)) == 1 else counts
        flat = _flat(ins, out.dtype, "reduce_scatter")
        req, buf, keep = self._reduce_scatter_flat("reduce_scatter", flat, out, opts.reduceOp, uneven)
        return self._work("reduce_scatter", [req], output_tensors, self._finish_all([buf]), keep)

    def reduce_scatter_single(self, output, input, opts):
        self._one([output], "reduce_scatter_tensor")
        flat = input if input.is_contiguous() else input.contiguous()
        req, buf, keep = self._reduce_scatter_flat("reduce_scatter_tensor", flat, output, opts.reduceOp)
        return self._work("reduce_scatter_tensor", [req], [output], self._finish_all([buf]), keep)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        reqs, keep, bufs = [], [], []
        for out, inp in zip(outputs, inputs):
            flat = inp if inp.is_contiguous() else inp.contiguous()
            req, buf, k = self._reduce_scatter_flat(
                "reduce_scatter_tensor_coalesced", flat, out, opts.reduceOp
            )
            reqs.append(req)
            keep.append(k)
            bufs.append(buf)
        return self._work(
            "reduce_scatter_tensor_coalesced", reqs, outputs, self._finish_all(bufs), keep
        )

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- data movement (bytes) -------------------------------------------------------------

    def broadcast(self, tensors, opts):
        t = self._one(tensors, "broadcast")
        buf = Buffer(t, reducing=False)
        p = buf.engine.data_ptr()
        req = self._start("broadcast", c.lib().fabricoll_ibroadcast, p, p, nbytes(t), _U8, opts.rootRank)
        finish = self._finish_all([buf]) if self._rank != opts.rootRank else None
        return self._work("broadcast", [req], tensors, finish, buf)

    def _allgather_flat(self, opname, inp, flat_out, counts=None):
        """All-gather ``inp`` into ``flat_out`` (contiguous); ``counts``: uneven byte counts."""
        src = inp if inp.is_contiguous() else inp.contiguous()
        lib = c.lib()
        if counts is None:
            if nbytes(flat_out) != nbytes(src) * self._size:
                raise Unsupported(
                    f"fabricoll {opname}: the output has {flat_out.numel()} elements, not "
                    f"{self._size} x the input's {inp.numel()}"
                )
            req = self._start(opname, lib.fabricoll_iallgather, src.data_ptr(), flat_out.data_ptr(), nbytes(src), _U8)
            return req, (src, flat_out)
        recvcounts, displs = _sizes(counts), _sizes(_displs(counts))
        req = self._start(
            opname, lib.fabricoll_iallgatherv, src.data_ptr(), nbytes(src), flat_out.data_ptr(),
            recvcounts, displs, _U8,
        )  # fmt: skip
        return req, (src, flat_out, recvcounts, displs)

    def _allgather_list(self, opname, outs, inp):
        if len(outs) != self._size:
            raise Unsupported(f"fabricoll {opname}: {len(outs)} outputs for {self._size} ranks")
        _same_dtype(opname, outs, inp.dtype)
        counts = [nbytes(o) for o in outs]
        flat = torch.empty(sum(o.numel() for o in outs), dtype=inp.dtype)
        uneven = None if len(set(counts)) == 1 else counts
        req, keep = self._allgather_flat(opname, inp, flat, uneven)
        return req, keep, lambda: _split_into(flat, outs)

    def allgather(self, output_tensors, input_tensors, opts):
        inp = self._one(input_tensors, "allgather")
        req, keep, finish = self._allgather_list("allgather", output_tensors[0], inp)
        return self._work("allgather", [req], output_tensors[0], finish, keep)

    def allgather_coalesced(self, output_lists, input_tensors, opts):
        # torch's layout: output_lists[r][i] receives rank r's input_tensors[i].
        if len(output_lists) != self._size or any(len(o) != len(input_tensors) for o in output_lists):
            raise Unsupported(
                f"fabricoll allgather_coalesced: output_tensor_lists must hold {self._size} lists "
                f"(one per rank) of {len(input_tensors)} tensors (one per input)"
            )
        reqs, keep, finishes = [], [], []
        for i, inp in enumerate(input_tensors):
            outs = [output_lists[r][i] for r in range(self._size)]
            req, k, f = self._allgather_list("allgather_coalesced", outs, inp)
            reqs.append(req)
            keep.append(k)
            finishes.append(f)
        result = [t for outs in output_lists for t in outs]
        return self._work("allgather_coalesced", reqs, result, lambda: [f() for f in finishes], keep)

    def all_gather_single(self, output, input, opts):
        buf = Buffer(output, reducing=False)
        req, keep = self._allgather_flat("all_gather_into_tensor", input, buf.engine)
        return self._work("all_gather_into_tensor", [req], [output], self._finish_all([buf]), (keep, buf))

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts):
        reqs, keep, bufs = [], [], []
        for out, inp in zip(outputs, inputs):
            buf = Buffer(out, reducing=False)
            req, k = self._allgather_flat("all_gather_into_tensor_coalesced", inp, buf.engine)
            reqs.append(req)
            keep.append((k, buf))
            bufs.append(buf)
        return self._work(
            "all_gather_into_tensor_coalesced", reqs, outputs, self._finish_all(bufs), keep
        )

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def _gather_flat(self, opname, inp, flat_out, root):
        src = inp if inp.is_contiguous() else inp.contiguous()
        recv = flat_out.data_ptr() if flat_out is not None else None
        if flat_out is not None and nbytes(flat_out) != nbytes(src) * self._size:
            raise Unsupported(
                f"fabricoll {opname}: the root's output has {flat_out.numel()} elements, not "
                f"{self._size} x the input's {inp.numel()} (gather takes equal sizes)"
            )
        req = self._start(opname, c.lib().fabricoll_igather, src.data_ptr(), recv, nbytes(src), _U8, root)
        return req, (src, flat_out)

    def gather(self, output_tensors, input_tensors, opts):
        inp = self._one(input_tensors, "gather")
        root = opts.rootRank
        if self._rank != root:
            req, keep = self._gather_flat("gather", inp, None, root)
            return self._work("gather", [req], [], None, keep)
        outs = output_tensors[0]
        if len(outs) != self._size:
            raise Unsupported(f"fabricoll gather: {len(outs)} outputs for {self._size} ranks")
        _same_dtype("gather", outs, inp.dtype)
        flat = torch.empty(sum(o.numel() for o in outs), dtype=inp.dtype)
        req, keep = self._gather_flat("gather", inp, flat, root)
        return self._work("gather", [req], outs, lambda: _split_into(flat, outs), keep)

    def gather_single(self, output, input, opts):
        root = opts.rootRank
        buf = Buffer(output, reducing=False) if self._rank == root else None
        req, keep = self._gather_flat("gather_into_tensor", input, buf and buf.engine, root)
        finish = self._finish_all([buf]) if buf is not None else None
        return self._work("gather_into_tensor", [req], [output], finish, (keep, buf))

    gather_into_tensor = gather_single

    def scatter(self, output_tensors, input_tensors, opts):
        out = self._one(output_tensors, "scatter")
        root = opts.rootRank
        buf = Buffer(out, reducing=False)
        flat = None
        if self._rank == root:
            ins = input_tensors[0]
            if len(ins) != self._size or any(nbytes(t) != nbytes(out) for t in ins):
                raise Unsupported(
                    f"fabricoll scatter: the root needs {self._size} inputs of the output's "
                    f"{out.numel()} elements"
                )
            flat = _flat(ins, out.dtype, "scatter")
        send = flat.data_ptr() if flat is not None else None
        req = self._start("scatter", c.lib().fabricoll_iscatter, send, buf.engine.data_ptr(), nbytes(out), _U8, root)
        return self._work("scatter", [req], output_tensors, self._finish_all([buf]), (flat, buf))

    def _alltoallv(self, opname, src, dst, scounts, rcounts):
        lib = c.lib()
        sc, sd = _sizes(scounts), _sizes(_displs(scounts))
        rc, rd = _sizes(rcounts), _sizes(_displs(rcounts))
        req = self._start(
            opname, lib.fabricoll_ialltoallv, src.data_ptr(), sc, sd, dst.data_ptr(), rc, rd, _U8
        )
        return req, (src, dst, sc, sd, rc, rd)

    def alltoall(self, output_tensors, input_tensors, opts):
        n = self._size
        if len(output_tensors) != n or len(input_tensors) != n:
            raise Unsupported(f"fabricoll alltoall: {len(input_tensors)} inputs and "
                              f"{len(output_tensors)} outputs for {n} ranks")  # fmt: skip
        dtype = input_tensors[0].dtype
        src = _flat(input_tensors, dtype, "alltoall")
        _same_dtype("alltoall", output_tensors, dtype)
        dst = torch.empty(sum(o.numel() for o in output_tensors), dtype=output_tensors[0].dtype)
        scounts = [nbytes(t) for t in input_tensors]
        rcounts = [nbytes(t) for t in output_tensors]
        if len(set(scounts)) == 1 and scounts == rcounts:
            req = self._start("alltoall", c.lib().fabricoll_ialltoall, src.data_ptr(), dst.data_ptr(), scounts[0], _U8)
            keep = (src, dst)
        else:
            req, keep = self._alltoallv("alltoall", src, dst, scounts, rcounts)
        return self._work("alltoall", [req], output_tensors, lambda: _split_into(dst, output_tensors), keep)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts):
        n, opname = self._size, "all_to_all_single"
        src = input if input.is_contiguous() else input.contiguous()
        buf = Buffer(output, reducing=False)
        if not output_split_sizes and not input_split_sizes:
            if nbytes(src) % n or nbytes(src) != nbytes(output):
                raise Unsupported(
                    f"fabricoll {opname}: without split sizes the input ({input.numel()} "
                    f"elements) and output ({output.numel()}) must be equal and divide by {n}"
                )
            req = self._start(
                opname, c.lib().fabricoll_ialltoall, src.data_ptr(), buf.engine.data_ptr(),
                nbytes(src) // n, _U8,
            )  # fmt: skip
            keep = (src, buf)
        else:
            scounts = self._split_bytes(opname, "input", src, input_split_sizes)
            rcounts = self._split_bytes(opname, "output", output, output_split_sizes)
            req, keep = self._alltoallv(opname, src, buf.engine, scounts, rcounts)
            keep = (keep, buf)
        return self._work(opname, [req], [output], self._finish_all([buf]), keep)

    alltoall_base = all_to_all_single

    def _split_bytes(self, opname, what, t, splits):
        n = self._size
        rows = t.shape[0] if t.dim() else 1
        if not splits:
            if rows % n:
                raise Unsupported(f"fabricoll {opname}: the {what}'s {rows} rows do not divide by {n}")
            splits = [rows // n] * n
        if len(splits) != n or sum(splits) != rows or min(splits) < 0:
            raise Unsupported(
                f"fabricoll {opname}: {what}_split_sizes {list(splits)} must be {n} sizes "
                f"summing to the {what}'s {rows} rows"
            )
        row = nbytes(t) // rows if rows else 0
        return [s * row for s in splits]

    # -- point to point and barrier ----------------------------------------------------------

    def _p2p(self, opname, tensors, peer, tag, send):
        t = self._one(tensors, opname)
        buf = Buffer(t, reducing=False)
        lib = c.lib()
        if tag == 0 and not lib.has("fabricoll_isend_tagged"):
            fn, args = (lib.fabricoll_isend if send else lib.fabricoll_irecv), ()
        else:
            fn = lib.fabricoll_isend_tagged if send else lib.fabricoll_irecv_tagged
            args = (tag,)
        req = self._start(opname, fn, buf.engine.data_ptr(), nbytes(t), _U8, peer, *args)
        finish = None if send else self._finish_all([buf])
        return self._work(opname, [req], tensors, finish, buf)

    def send(self, tensors, dst_rank, tag=0):
        return self._p2p("send", tensors, dst_rank, tag, True)

    def recv(self, tensors, src_rank, tag=0):
        return self._p2p("recv", tensors, src_rank, tag, False)

    def recv_anysource(self, tensors, tag=0):
        raise Unsupported(
            "fabricoll recv_anysource: receiving from any source is not supported (the C API "
            "receives from a named peer); pass src to recv"
        )

    def barrier(self, opts=None):
        req = self._start("barrier", c.lib().fabricoll_ibarrier)
        return self._work("barrier", [req], [])

    def monitored_barrier(self, opts, wait_all_ranks=False):
        """A barrier that raises ``TimeoutError`` after ``opts.timeout`` (the communicator's
        timeout when unset); it cannot name the missing ranks."""
        timeout = opts.timeout if opts.timeout.total_seconds() > 0 else None
        self.barrier(opts).wait(timeout)

    # -- coalescing ------------------------------------------------------------------------

    def start_coalescing(self):
        if self._coalescing is not None:
            raise RuntimeError("fabricoll: start_coalescing inside a coalescing block")
        self._coalescing = []

    def end_coalescing(self):
        works, self._coalescing = self._coalescing, None
        if works is None:
            raise RuntimeError("fabricoll: end_coalescing without start_coalescing")
        return WorkList(works)

    # -- lifetime --------------------------------------------------------------------------

    def abort(self):
        """Fail every operation in flight and every later call (``fabricoll_comm_abort``)."""
        if self._comm is not None:
            c.call("comm_abort", self._comm)

    def shutdown(self):
        """Destroy the communicator: operations still in flight fail (a later ``wait`` on
        one raises: its request is no longer live)."""
        comm, self._comm = self._comm, None
        _live.discard(self)
        if comm is None:
            return
        if self._front is not None:
            self._front._detach()
        c.call("comm_destroy", comm)

    def __del__(self):
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001 - nothing to report to at interpreter exit
            pass
