"""Work and Future plumbing: what every mccl op returns at once.

The comm thread completes the Work (and its Future) when the op is done; ``wait`` raises the
op's error, and lets the device adapter gate the consumer (O2) on the caller's thread.
"""

from __future__ import annotations

import collections
import copy
import logging
import os
import queue
import threading
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from .errors import CollectiveError

log = logging.getLogger("mccl.work")


class _Completer:
    """Runs Future completions (and so user callbacks) off the comm thread.

    A callback may issue another op and block on it (PowerSGD's hook does): on the comm
    thread that would deadlock. One idle worker normally does all completions; when every
    worker is stuck in a callback, another is started, so completions never wait behind one.

    Workers are not daemon threads: at interpreter exit they finish the completions queued
    (as ``concurrent.futures`` workers do). A daemon thread cut off inside a callback, which
    torch's Future calls from C++, aborted the process ("terminate called without an active
    exception").
    """

    IDLE_EXIT_S = 30.0

    def __init__(self) -> None:
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._workers = 0
        self._exiting = False
        register = getattr(threading, "_register_atexit", None)  # runs before the join
        self._daemon = register is None
        if register is not None:
            register(self._stop_idle)

    def _forget_workers(self) -> None:
        """In a child made by ``os.fork``: the workers stayed in the parent (and a lock may
        be held by one), so completions start afresh here."""
        self._q = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = self._workers = 0

    def _stop_idle(self) -> None:
        """Interpreter exit: every worker returns once the queue is drained."""
        with self._lock:
            self._exiting = True
            workers = self._workers
        for _ in range(workers):
            self._q.put(None)

    def run(self, fn) -> None:
        with self._lock:
            exiting = self._exiting
            spawn = not exiting and self._idle == 0
            if spawn:
                self._workers += 1
            elif not exiting:
                self._idle -= 1
        if exiting:  # the idle workers are gone: a thread of its own, joined at exit too
            try:
                threading.Thread(target=self._one, args=(fn,), name="mccl-complete").start()
            except RuntimeError:  # past the join: no new threads any more
                self._one(fn)
            return
        self._q.put(fn)
        if spawn:
            threading.Thread(target=self._worker, name="mccl-complete",
                             daemon=self._daemon).start()

    @staticmethod
    def _one(fn) -> None:
        try:
            fn()
        except Exception:  # a failing user callback
            log.exception("future completion failed")

    def _worker(self) -> None:
        while True:
            try:
                fn = self._q.get(timeout=self.IDLE_EXIT_S)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0 and self._q.empty():
                        self._idle -= 1
                        self._workers -= 1
                        return
                continue
            if fn is None:  # interpreter exit (later completions get a thread each)
                with self._lock:
                    self._workers -= 1
                return
            self._one(fn)  # (a failing user callback must not kill the worker)
            # an idle worker holds nothing of the last completion: its result tensors (device
            # memory, on a GPU) would stay allocated while it waits, up to IDLE_EXIT_S
            fn = None
            with self._lock:
                self._idle += 1


_COMPLETER = _Completer()

#: The longest timeout anything waits for: a hundred years is "never" in practice, and a
#: longer one (timedelta(days=10**8), say) overflows the thread waits (threading.TIMEOUT_MAX,
#: about 292 years on Linux) with a bare OverflowError, where gloo takes it.
LONGEST_TIMEOUT_S = min(100 * 365 * 86400.0, threading.TIMEOUT_MAX)


def timeout_seconds(timeout: timedelta | float | None, what: str) -> float:
    """``timeout`` (a timedelta or a number of seconds; None reads 0) in seconds, at most
    ``LONGEST_TIMEOUT_S``; ``what`` names the call in the error for anything else."""
    try:
        secs = (timeout.total_seconds() if isinstance(timeout, timedelta)
                else float(timeout or 0))
    except (TypeError, ValueError):
        raise TypeError(f"{what}: the timeout must be a timedelta or a number of seconds"
                        ) from None
    return min(secs, LONGEST_TIMEOUT_S)

#: How many times this process is a fork's child away from the one that started (see
#: ``Work._orphaned``): a Work made before a fork never completes in the child.
_fork_generation = 0


def _count_fork_in_child() -> None:
    global _fork_generation
    _fork_generation += 1
    _COMPLETER._forget_workers()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_count_fork_in_child)

#: Works that torch's C++ side may still hold after Python dropped them (``Work.__del__``).
KEPT_WORKS = 32
KEPT_MAX_BYTES = 64 << 10
_kept: collections.deque = collections.deque(maxlen=KEPT_WORKS)


def _unwrap(fut: torch.futures.Future):
    """The value of a Work's future, or its error raised (so the chained future fails)."""
    value = fut.value()
    if isinstance(value, BaseException):
        raise fresh(value)
    return value


def fresh(error: BaseException) -> BaseException:
    """A copy of a stored error, to raise. Raising the stored one would attach the raiser's
    frames to it, and through their locals the Work, the group and its sockets; torch's
    Futures hold the stored error from C++, where the garbage collector cannot see the cycle,
    so a failed group stayed alive for good after it was destroyed (its sockets and store
    too). The copy keeps the type, message, attributes and cause."""
    try:
        copied = copy.copy(error)
    except Exception:  # noqa: BLE001 - an exception type that cannot be copied: raise it
        return error
    copied.__cause__ = error.__cause__
    copied.__suppress_context__ = error.__suppress_context__
    return copied


def _set_result(fut: torch.futures.Future, value, result_ctx) -> None:
    if result_ctx is not None:
        with result_ctx():
            fut.set_result(value)
    else:
        fut.set_result(value)


class Work(dist.Work):
    """Completion handle of one mccl op.

    Cheap to make, since every op makes one: completion is a lock held until the op is done
    (an Event costs several times more), and the torch Future behind ``get_future`` is only
    made when somebody asks for it (blocking ops never do). A device op's Future is completed
    inside the comm side's stream context, so it records its event after the copy back; one
    first asked for after the op completed records it there at that time, which may also
    cover copies of later ops (later than needed, never too early).
    """

    def __init__(self, op: str, result: list[torch.Tensor] | None = None,
                 devices: list[torch.device] | None = None, blocking: bool = False,
                 refused: BaseException | None = None):
        super().__init__()
        #: Why this rank could not take the result of an op it still ran (a result tensor
        #: that is an expanded view, an output autograd refused): the op's completion fails
        #: the Work with it.
        self._refused = refused
        self._blocking = blocking  # waited by torch before the call returns: never escapes
        self.op = op
        self._result: list[torch.Tensor] = result if result is not None else []
        self._latch = threading.Lock()
        self._latch.acquire()  # released once, when the op is done; waiters pass through it
        self._finished = False
        self._error: BaseException | None = None
        self._devices = devices
        self._result_ctx = None  # where a device op's future is completed (see complete)
        self._raw: torch.futures.Future | None = None  # made by _raw_future()
        self._future: torch.futures.Future | None = None  # made by get_future()
        self._gate = None  # callable run on wait() by the waiting thread (device O2)
        #: ``() -> str``: what the op waits for now, named when ``wait(timeout)`` times out.
        self.waiting: Callable[[], str] | None = None
        self._src_rank = -1  # not _source_rank: that name is torch's method (dist.recv calls it)
        self._callbacks_lock = threading.Lock()
        self._generation = _fork_generation

    def __del__(self) -> None:
        """Torch's C++ side can hold a Work after its Python object is gone: DDP's Join
        hands the Work of its async one-element all-reduce to the reducer, which waits on it
        and reads its future in the backward pass. This class's ``wait`` and ``get_future``
        live in the Python object, so C++ would then reach the base Work's, which raise
        ("Work::getFuture not implemented") or never return. A small Work dropped before
        anybody asked for its future may be such a one (not one of a blocking call: torch
        waited on it before returning, and nobody else saw it): it is kept alive until
        ``KEPT_WORKS`` more have been dropped (at most ``KEPT_MAX_BYTES`` of results each,
        so no large buffer outlives its op because of this)."""
        try:
            if (not self._blocking and self._raw is None
                    and sum(t.nbytes for t in self._result) <= KEPT_MAX_BYTES):
                _kept.append(self)
        except Exception:  # noqa: BLE001 - interpreter exit, or a half-made Work
            pass

    # ---- completion (comm thread) ----
    def complete(self, gate=None, result_ctx=None) -> None:
        if self._refused is not None:
            self._settle(self._refused, None)
            return
        self._gate = gate
        self._settle(None, result_ctx)

    def fail(self, error: BaseException) -> None:
        self._settle(error, None)

    def _settle(self, error: BaseException | None, result_ctx) -> None:
        """Mark the op done (the first outcome wins) and complete the raw future if one was
        made: right here while nobody asked for the Future (nothing can block then, and a
        thread hand-off per op is saved), else on the completer."""
        with self._callbacks_lock:
            if self._finished:
                return
            self._error = error
            self._result_ctx = result_ctx
            self._finished = True
            self._latch.release()
            fut, value = self._raw, self._outcome()
            if fut is None:
                return  # get_future() / _raw_future() complete it when they make it
            if self._future is None:
                _set_result(fut, value, result_ctx)
                return
        _COMPLETER.run(lambda: _set_result(fut, value, result_ctx))

    def _raw_future(self) -> torch.futures.Future:
        """The future the comm side completes; made (and completed, if the op is done) on
        first use. Call with ``_callbacks_lock`` held."""
        if self._raw is None:
            self._raw = torch.futures.Future(devices=self._devices)
            if self._finished:
                _set_result(self._raw, self._outcome(), self._result_ctx)
        return self._raw

    def _outcome(self):
        """What the future carries: the result list, or the error (``_unwrap`` raises it in
        the chained future)."""
        return self._error if self._error is not None else self._result

    def set_source_rank(self, rank: int) -> None:
        self._src_rank = rank

    # ---- torch.distributed.Work API ----
    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        self._await_latch(timeout)
        self._await_future()
        if self._error is not None:
            raise fresh(self._error)
        if self._gate is not None:
            self._gate()
        return True

    def _orphaned(self) -> None:
        """In a child made by ``os.fork``, an op the parent issued and had not finished
        fails: the threads that would finish it stayed in the parent, so waiting for it
        here never returned."""
        if not self._finished and self._generation != _fork_generation:
            self.fail(CollectiveError(
                f"mccl {self.op}: this op was issued by the process this one was forked "
                "from, and it finishes only there (a forked child cannot wait for it)",
                op=self.op))

    def _await_latch(self, timeout: timedelta | float | None) -> None:
        """Block until the op has finished, at most ``timeout`` (0 or None: no limit)."""
        secs = timeout_seconds(timeout, f"mccl {self.op}: wait(timeout={timeout!r})")
        if self._finished:
            return
        self._orphaned()
        if not self._latch.acquire(timeout=secs if secs > 0 else -1):
            where = self.waiting() if self.waiting is not None else ""
            raise CollectiveError(f"mccl {self.op}: wait() timed out after {secs:.1f}s"
                                  f"{f' ({where})' if where else ''}", op=self.op)
        self._latch.release()

    def _await_future(self) -> None:
        """A Future asked for before the op finished is completed on another thread (see
        ``_settle``): ``wait`` returns (or raises) only once it is done too, so ``fut.value()``
        may follow and ``is_completed()`` holds (as on gloo, whose futures are completed
        before its Work)."""
        fut = self._made_future()
        if fut is not None and not fut.done():
            try:
                fut.wait()
            except Exception:  # noqa: BLE001 - a failed op: wait raises its own error
                pass

    def _made_future(self) -> torch.futures.Future | None:
        """The Future a caller may hold (the chained one, else the raw one), if made yet."""
        return self._future if self._future is not None else self._raw

    def synchronize(self) -> None:
        self.wait()

    def is_completed(self) -> bool:
        self._orphaned()
        fut = self._made_future()
        return self._finished and (fut is None or fut.done())

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def get_future(self) -> torch.futures.Future:
        """A future chained to the one the comm side completes, so that a failure is a real
        error of this Future in C++ too: ``Future.set_exception`` only stores a Python value,
        which DDP's reducer reads as a result (and crashes on: it finds no tensor in it).
        Made on first use: most ops never ask for their future."""
        self._orphaned()
        with self._callbacks_lock:
            if self._future is None:
                self._future = self._raw_future().then(_unwrap)
            return self._future

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._result

    def source_rank(self) -> int:
        if self._src_rank < 0:
            # RuntimeError, as torch's own Work classes raise
            raise RuntimeError(f"mccl {self.op}: source_rank() is defined only for a "
                               "receive, once it has its message")
        return self._src_rank

    def _source_rank(self) -> int:
        """What ``dist.recv(t)`` (no src) calls to learn the sender's group rank."""
        return self.source_rank()


class GroupWork(Work):
    """Completes when every member Work has (used for coalescing managers)."""

    def __init__(self, op: str, members: list[Work]):
        result = [t for w in members for t in w._result]
        super().__init__(op, result)
        self._members = members
        self._left = len(members)
        if not members:
            self.complete()
            return
        for w in members:
            with w._callbacks_lock:
                raw = w._raw_future()
            raw.add_done_callback(self._member_done)

    def _member_done(self, fut) -> None:
        with self._callbacks_lock:
            self._left -= 1
            last = self._left == 0
        if last:
            errors = [w._error for w in self._members if w._error is not None]
            if errors:
                self.fail(errors[0])
            else:
                self.complete()

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        # One timeout for the whole group (it completes once every member has), then each
        # member's own wait, which no longer blocks, for its error, future and stream gate.
        self._await_latch(timeout)
        for w in self._members:
            w.wait()
        return super().wait()


def completed_work(op: str, result: list[torch.Tensor] | None = None) -> Work:
    w = Work(op, result)
    w.complete()
    return w
