"""Work objects: the completion of one or more non-blocking C requests.

Each request has exactly one owner at a time, switched under the Work's lock:

- the Work itself, until someone asks for completion;
- the thread in :meth:`Work.wait` (no timeout): it drives ``fabricoll_wait`` itself, in the
  calling thread (ctypes releases the GIL meanwhile);
- the library, once :meth:`Work.get_future` has handed the requests to
  ``fabricoll_request_notify``: the communicator's progress thread completes them and the
  callback completes the future; nothing polls. A later ``wait`` sleeps on an event.

``wait(timeout)`` with a timeout hands the requests to the library too (or, in a library
without ``fabricoll_request_notify``, polls ``fabricoll_test``) and raises ``TimeoutError``
when the deadline passes; the operation then stays in flight.

Post-processing (copying results out of a staging buffer, narrowing, copying back into a
non-contiguous tensor) runs once every request has succeeded and before the future
completes or ``wait`` returns. The first failure is raised by ``wait`` and set on the
future, as a :class:`fabricoll.FabricollError` naming the operation.

A Work dropped while no one has asked for its completion (an ``isend`` never waited)
hands its requests to the library as it is collected, so that they still complete and free
their buffers (which the Work keeps alive until then).
"""

import ctypes
import itertools
import threading
import time

import torch
from torch._C._distributed_c10d import Work as _C10dWork

from . import _capi as c

_PENDING, _WAITING, _NOTIFIED, _DONE = range(4)

# user_data -> Work, for the requests handed to the library.
_notified = {}
_keys = itertools.count(1)


def _on_complete(user_data, status):
    # Runs in the communicator's progress thread (or in the notifying thread); ctypes holds
    # the GIL here. Never lets an exception escape into C.
    try:
        work = _notified.pop(user_data, None)
        if work is not None:
            work._one_done(status)
    except BaseException:  # noqa: BLE001 - nothing may unwind into the library
        pass


_CALLBACK = c.CALLBACK(_on_complete)


def _unwrap(fut):
    err, result = fut.value()
    if err is not None:
        raise err
    return result


def _has_notify():
    return c.lib().has("fabricoll_request_notify")


class Work(_C10dWork):
    """The requests of one operation (``requests``: request handles, possibly none when
    the operation had nothing to do), the tensors its future yields (``result``), the
    post-processing to run on success (``finish``) and the buffers to keep alive
    (``keep``)."""

    def __init__(self, opname, requests, result, finish=None, keep=None):
        super().__init__()
        self._opname = opname
        self._requests = requests
        self._result = result
        self._finish = finish
        self._keep = keep
        self._lock = threading.Lock()
        self._state = _PENDING
        self._future = None
        self._future_out = None
        self._event = None
        self._error = None
        self._remaining = len(requests)
        if not requests:
            self._complete(None)

    def __del__(self):
        # Dropped before anyone asked: let the library finish the requests (this resurrects
        # the Work in _notified until its callbacks have run).
        try:
            if self._state == _PENDING and _has_notify():
                self._state = _NOTIFIED
                self._notify()
        except Exception:  # noqa: BLE001 - at interpreter exit the library may be gone
            pass

    # -- torch's interface --------------------------------------------------------------

    def wait(self, timeout=None):
        """Block until done; raise its error. ``timeout`` (a timedelta; zero or None: the
        communicator's timeout governs) raises ``TimeoutError`` when it passes first."""
        seconds = timeout.total_seconds() if timeout is not None else 0.0
        with self._lock:
            state = self._state
            if state == _PENDING and seconds <= 0:
                self._state = _WAITING
        if state == _PENDING and seconds <= 0:
            self._drive()
        elif state != _DONE:
            self._await(seconds)
        if self._error is not None:
            raise self._error
        return True

    def get_future(self):
        """A future completed by the library when the operation completes (its value: the
        operation's output tensors)."""
        with self._lock:
            if self._future is not None:
                return self._future_out
            fut = self._future = torch.futures.Future()
            self._future_out = fut.then(_unwrap)
            state = self._state
            if state == _PENDING:
                if not _has_notify():
                    self._future = None
                    c.lib().fabricoll_request_notify()  # raises NotImplementedError
                self._state = _NOTIFIED
        if state == _PENDING:
            self._notify()
        elif state == _DONE:
            self._settle(fut)
        return self._future_out

    def is_completed(self):
        return self._state == _DONE

    def is_success(self):
        return self._state == _DONE and self._error is None

    def exception(self):
        return self._error

    def result(self):
        self.wait()
        return self._result

    def synchronize(self):
        pass

    def __repr__(self):
        names = {_PENDING: "pending", _WAITING: "waited", _NOTIFIED: "notified", _DONE: "done"}
        return f"<fabricoll Work {self._opname} {names[self._state]}>"

    # -- completion ------------------------------------------------------------------------

    def _drive(self):
        # This thread owns every request: wait for each, so that all buffers are free even
        # when one fails, and keep the first failure.
        err = None
        wait = c.lib().fabricoll_wait
        for req in self._requests:
            rc = wait(req)
            if rc and err is None:
                err = self._failure(c.error("fabricoll_wait", rc))
        self._complete(err)

    def _notify(self):
        lib = c.lib()
        for req in self._requests:
            key = next(_keys)
            _notified[key] = self
            rc = lib.fabricoll_request_notify(req, _CALLBACK, key)
            if rc:
                # Not taken (bad argument): finish it in this thread instead.
                _notified.pop(key, None)
                err = self._failure(c.error("fabricoll_request_notify", rc))
                rc = lib.fabricoll_wait(req)
                self._one_done(rc, err)

    def _await(self, seconds):
        with self._lock:
            if self._state == _DONE:
                return
            if self._event is None:
                self._event = threading.Event()
            event = self._event
            hand = self._state == _PENDING
            if hand:
                if not _has_notify():
                    self._state = _WAITING
                    hand = None
                else:
                    self._state = _NOTIFIED
        if hand is None:
            self._poll(seconds)
            return
        if hand:
            self._notify()
        if not event.wait(seconds if seconds > 0 else None):
            raise TimeoutError(
                f"fabricoll {self._opname}: not complete after {seconds:g} s "
                "(the operation is still in flight)"
            )

    def _poll(self, seconds):
        # Without fabricoll_request_notify: test until done or until the deadline.
        lib = c.lib()
        deadline = time.monotonic() + seconds
        done = ctypes.c_int(0)
        pause = 1e-6
        err = None
        while self._requests:
            rc = lib.fabricoll_test(self._requests[0], ctypes.byref(done))
            if rc or done.value:
                if rc and err is None:
                    err = self._failure(c.error("fabricoll_test", rc))
                self._requests = self._requests[1:]
                continue
            if time.monotonic() >= deadline:
                with self._lock:
                    self._state = _PENDING
                raise TimeoutError(
                    f"fabricoll {self._opname}: not complete after {seconds:g} s "
                    "(the operation is still in flight)"
                )
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
        self._complete(err)

    def _failure(self, err):
        err.args = (f"fabricoll {self._opname}: {err.args[0]}",)
        return err

    def _one_done(self, status, err=None):
        if status and err is None:
            err = self._failure(
                c.FabricollError(
                    "completion", status, "the library reported this status to the request's callback"
                )
            )
        with self._lock:
            if err is not None and self._error is None:
                self._error = err
            self._remaining -= 1
            last = self._remaining == 0
        if last:
            self._complete(self._error)

    def _complete(self, err):
        if err is None and self._finish is not None:
            try:
                self._finish()
            except Exception as e:  # noqa: BLE001 - reported through wait / the future
                err = e
        with self._lock:
            self._error = err
            self._state = _DONE
            self._keep = None
            self._finish = None
            fut, event = self._future, self._event
        if event is not None:
            event.set()
        if fut is not None:
            self._settle(fut)

    def _settle(self, fut):
        # (error, tensors): _unwrap, chained behind, raises the error, which marks the future
        # that torch sees as failed. Future.set_exception would not: it only makes this
        # Python wrapper raise, and torch's C++ side (DDP) would take the error for a value.
        fut.set_result((self._error, self._result))


class Done(_C10dWork):
    """An operation that already completed (a synchronous call): ``wait`` returns at once."""

    def __init__(self, result):
        super().__init__()
        self._result = result

    def wait(self, timeout=None):
        return True

    def get_future(self):
        fut = torch.futures.Future()
        fut.set_result(self._result)
        return fut

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def exception(self):
        return None

    def result(self):
        return self._result


class WorkList(_C10dWork):
    """Several Works as one (the end of a coalescing block)."""

    def __init__(self, works):
        super().__init__()
        self._works = works

    def wait(self, timeout=None):
        for w in self._works:
            w.wait(timeout)
        return True

    def get_future(self):
        futs = [w.get_future() for w in self._works]
        out = [t for w in self._works for t in w._result]

        def done(all_done):
            for f in all_done.wait():
                f.wait()  # raises the first failure
            return out

        return torch.futures.collect_all(futs).then(done)

    def is_completed(self):
        return all(w.is_completed() for w in self._works)
