"""What moves when: the per-group ordered job queue and its comm thread.

Ops of one group run in the order they were issued, on every rank, so a sequence number
identifies an op across ranks. The first failure breaks the group: the reason goes to every
peer in an error frame (forwarded unchanged, blaming the rank at fault), and every pending or
later op fails with it instead of hanging. Shutting down or aborting fails whatever is queued.

Early start: once a ring all-reduce, reduce-scatter or all-gather has queued its last send
(its last step only receives), the comm thread may issue the first sends of the op queued
behind it (``Job.start``), so the link goes from one
op's bytes to the next op's without waiting for the first op's tail and the second's start
(gloo gets the same from running two ops at once on two threads). Sends of one connection
stay in issue order, so every peer still reads the ops one after the other.

Parked ops: a point-to-point receive (and a device tensor's send) takes its turn in the queue
to get at its tensor, then waits aside (``Job.park``) while the ops behind it run; whichever
read meets its message fills it. While only parked ops are left, the comm thread waits on the
sockets and on a wake-up socket that ``submit`` writes to (``Mesh.serve``).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import queue
import socket
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from .algorithms.base import Scratch
from .device import Handoff
from .device.cpu import CpuHandoff
from .device.strided import SpanIndex, byte_span, spans_meet
from .errors import CollectiveError, InStepError
from .ops import Kind
from .transport.framing import DATA, Signature, pack_header
from .transport.mesh import MISMATCH, Mesh, MismatchError
from .transport.tcp import PeerError
from .work import Work

log = logging.getLogger("mccl.engine")

#: At shutdown after a failure, how long queued error frames get to reach the peers.
ERROR_FLUSH_S = 1.0
#: At a clean shutdown, how long the last bytes get to reach the peers once the ops are done.
FLUSH_S = 5.0
#: How often a shutdown looks whether the ops it waits for have finished.
DRAIN_POLL_S = 0.01
#: At a clean shutdown, how long a rank waits for its peers' BYE to read what they sent and it
#: did not (``Mesh.unread``: a mismatch that no later op would have revealed is reported).
UNREAD_GRACE_S = 1.0
#: How long past the group timeout a shutdown waits for an op to finish before it cuts the
#: connections: the op's own timeout (which names the silent peer) fires first.
DRAIN_MARGIN_S = 2.0
#: Shutdowns that follow one another within this gap share their waits (``_SharedDeadline``).
SWEEP_GAP_S = 0.25


class _SharedDeadline:
    """One deadline for the groups shut down together: torch's destroy_process_group and the
    interpreter's exit shut them down one after another, and a stalled peer would otherwise
    cost each group's wait in full (30 groups took 16 s). A call that comes more than
    ``SWEEP_GAP_S`` after both the deadline and the call before it starts a new one."""

    def __init__(self, span_s: float):
        self.span_s = span_s
        self._until = self._asked = -float("inf")
        self._lock = threading.Lock()

    def left(self) -> float:
        """Seconds left of the current deadline (a new one if none is under way)."""
        with self._lock:
            now = time.monotonic()
            if now > max(self._until, self._asked) + SWEEP_GAP_S:
                self._until = now + self.span_s
            self._asked = now
            return max(0.0, self._until - now)


_FLUSH = _SharedDeadline(FLUSH_S)
_ERROR_FLUSH = _SharedDeadline(ERROR_FLUSH_S)
_UNREAD_GRACE = _SharedDeadline(UNREAD_GRACE_S)
#: Issue a queued op's first sends while the op before it receives its last segment.
EARLY_START = True
#: ``Engine._next`` when no job was taken off the queue ahead of its turn.
_NO_JOB = object()
#: Groups not shut down yet: at interpreter exit they are, so their peers hear a BYE at once
#: (else a message sent meanwhile to this exiting process is lost without an error).
_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _shut_down_at_exit() -> None:
    """After the interpreter joined its non-daemon threads (a user's thread may still be
    training when the main thread returns; callbacks on mccl's completer finish there).

    Every group says BYE before any waits for its peers' BYE: one group at a time, each
    waiting for peers that were shutting another group down first, took up to
    ``UNREAD_GRACE_S`` per group (a set has no order that is the same on every rank)."""
    stopped = []
    for engine in list(_LIVE):
        try:
            if engine.stop(abort=False):
                stopped.append(engine)
        except Exception:  # noqa: BLE001 - never fail the interpreter's exit
            log.debug("mccl group '%s': shutdown at exit failed", engine.label, exc_info=True)
    for engine in stopped:
        try:
            engine.close()
        except Exception:  # noqa: BLE001
            log.debug("mccl group '%s': close at exit failed", engine.label, exc_info=True)


def _disown_in_child() -> None:
    """In a child made by ``os.fork``: the groups copied from the parent are the parent's.
    Their sockets are the parent's too (shared), and shutting one down at the child's exit
    cut the parent's connections (both ranks then blamed a live peer); their threads did not
    come along, so an op would never run. They are dropped from ``_LIVE`` and refuse ops."""
    for engine in list(_LIVE):
        engine._disown()
    _LIVE.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_disown_in_child)


def _without_frames(e: BaseException) -> BaseException:
    """``e`` and the exceptions chained to it, without their tracebacks: the frames of the
    comm thread hold the engine, and a Work's error outlives the group (see ``work.fresh``)."""
    seen: set[int] = set()
    c: BaseException | None = e
    while c is not None and id(c) not in seen:
        seen.add(id(c))
        c.__traceback__ = None
        c = c.__cause__ or c.__context__
    return e


def _shown(logger: logging.Logger) -> bool:
    """Does a record at ERROR from ``logger`` reach a handler that writes it somewhere? (The
    package's own NullHandler keeps Python's last-resort handler quiet.)"""
    if not logger.isEnabledFor(logging.ERROR):
        return False
    c: logging.Logger | None = logger
    while c is not None:
        if any(not isinstance(h, logging.NullHandler) for h in c.handlers):
            return True
        c = c.parent if c.propagate else None
    return False


class OpChannel:
    """The algorithms' Channel for one op: frames tagged with the op's seq and signature."""

    __slots__ = ("mesh", "rank", "size", "chunk_cap", "seq", "sig", "deadline", "_queued",
                 "_started", "_headers", "on_sends_done", "_sealed", "last_from")

    def __init__(self, mesh: Mesh, seq: int, sig: Signature, deadline: float, chunk_cap: int):
        self.mesh = mesh
        self.rank = mesh.rank
        self.size = mesh.size
        self.chunk_cap = chunk_cap
        self.seq = seq
        self.sig = sig
        self.deadline = deadline
        self._queued: set[int] = set()
        self._started: set[int] = set()  # peers this op has sent to
        self._headers: dict[int, bytes] = {}  # payload length -> this op's DATA header
        #: Called once when the algorithm's sends are all queued (the engine's early start).
        self.on_sends_done: Callable[[], None] | None = None
        self._sealed: list | None = None  # mark of this op's sends, taken at sends_done
        self.last_from = -1  # the peer this op last received from (-1: none yet)

    def _header(self, nbytes: int) -> bytes:
        """The frame header of this op for a payload of ``nbytes``: the same for the sender
        and the receiver, and packed once per length (an op's chunks share a few lengths)."""
        h = self._headers.get(nbytes)
        if h is None:
            h = self._headers[nbytes] = pack_header(DATA, self.sig, self.mesh.group, self.seq,
                                                    nbytes)
        return h

    def send(self, peer: int, buf: np.ndarray) -> bool:
        n = buf.nbytes
        start = peer not in self._started  # the op's first send there: written at once
        if start:
            self._started.add(peer)
            # A peer that exited or shut the group down cannot need this op's data: say so
            # now (a root that only sends would otherwise return as if it had been received).
            self.mesh.check_open(peer)
        done = self.mesh.send_frame(peer, self._header(n), buf, n, start=start)
        if not done:
            self._queued.add(peer)
        return done

    def recv(self, peer: int, buf: np.ndarray) -> None:
        self.mesh.recv_data(peer, self.seq, self.sig, buf, self._header(buf.nbytes))
        self.last_from = peer

    def mark(self) -> list:
        """Token for the sends queued so far (a buffer they read may be reused after wait)."""
        return self.mesh.mark(sorted(self._queued)) if self._queued else []

    def wait(self, token: list) -> None:
        if token:
            self.mesh.wait_marks(token)

    def ticket(self, peer: int) -> int:
        return self.mesh.peer(peer).ticket()

    def passed(self, peer: int, ticket: int) -> bool:
        return self.mesh.peer(peer).passed(ticket)

    def sends_done(self) -> None:
        """Mark this op's sends (``flush`` waits for those only, not for sends of the next op
        queued behind them) and let the engine start the next op."""
        cb, self.on_sends_done = self.on_sends_done, None
        if cb is not None:
            self._sealed = self.mark()
            cb()

    def flush(self) -> None:
        if self._sealed is not None:
            token, self._sealed = self._sealed, None
            self.wait(token)
            self._queued.clear()
            return
        if self._queued:
            # No absolute deadline: a large op may take longer than the group timeout; the
            # sender threads fail after the timeout without progress instead.
            self.mesh.flush(sorted(self._queued))
            self._queued.clear()


Body = Callable[[OpChannel, list[torch.Tensor]], None]
#: ``done(error=None, source=-1)``: a parked op finished (``source``: who sent a message).
Done = Callable[..., None]
#: A body that finishes later: it posts a receive or queues a send and calls ``done`` then.
Park = Callable[[OpChannel, list[torch.Tensor], Done], None]


@dataclass(eq=False)
class Job:
    """One op: what to run on the comm thread once the device hand-off is acquired."""

    name: str
    sig: Signature
    body: Body
    work: Work
    handoff: Handoff
    collective: bool = True  # collectives consume a sequence number; p2p receives do not
    seq: int = 0
    #: The part of the body that only sends (run before ``body``, and possibly early: while
    #: the op before it receives its last segment, see the module docstring).
    start: Body | None = None
    #: The device tensors the op reads or writes (an early start needs them disjoint from
    #: the running op's).
    tensors: list[torch.Tensor] = field(default_factory=list)
    #: Set by an early start: the op's channel and host tensors, or what it raised.
    early: tuple[OpChannel, list[torch.Tensor]] | None = None
    early_error: BaseException | None = None
    #: Instead of ``body``: a point-to-point op that finishes later, without holding up the
    #: ops behind it (a receive waits for its message, a device send for its write).
    park: Park | None = None


def _from_every_rank(sig: Signature) -> bool:
    """Does an op of this signature read data from every rank of the group (directly or
    through others) before it completes anywhere? A rooted op or an all-to-all need not."""
    if sig.op == Kind.BARRIER:
        return True
    return sig.count > 0 and sig.op in (Kind.ALL_REDUCE, Kind.ALL_GATHER, Kind.REDUCE_SCATTER)


def _discard(job: Job) -> None:
    """Give back what a failed or never-run op's hand-off holds; a failure here is logged and
    never keeps the op's Work from being failed."""
    try:
        job.handoff.discard()
    except Exception:  # noqa: BLE001
        log.exception("mccl %s: releasing the hand-off of a failed op", job.name)


def _overlap(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Do two ops' tensors overlap in memory? (By byte range: receives into disjoint slices
    of one buffer, as an all-to-all or a halo exchange makes them, are independent.)"""
    theirs = [byte_span(y) for y in b]
    return any(spans_meet(mine, s) for mine in map(byte_span, a) for s in theirs)


class _Parked:
    """The parked jobs, oldest first, with their tensors' byte ranges indexed: whether a new
    op shares memory with one stays cheap with thousands of receives posted."""

    def __init__(self) -> None:
        self._jobs: dict[Job, list[tuple[int, int]]] = {}
        self._index = SpanIndex()

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job: Job) -> bool:
        return job in self._jobs

    def add(self, job: Job) -> None:
        spans = [byte_span(t) for t in job.tensors]
        self._jobs[job] = spans
        self._index.add(spans)

    def remove(self, job: Job) -> bool:
        """Take ``job`` out; False if it was not parked (it failed meanwhile)."""
        spans = self._jobs.pop(job, None)
        if spans is None:
            return False
        self._index.remove(spans)
        return True

    def oldest(self) -> Job:
        return next(iter(self._jobs))

    def take_all(self) -> list[Job]:
        jobs = list(self._jobs)
        self._jobs.clear()
        self._index = SpanIndex()
        return jobs

    def share_memory_with(self, tensors: list[torch.Tensor]) -> bool:
        return bool(self._jobs) and any(self._index.meets(byte_span(t)) for t in tensors)


class Engine:
    """Comm thread + ordered queue of one process group."""

    def __init__(self, mesh: Mesh, label: str, chunk_cap: int,
                 global_ranks: list[int] | None = None):
        self.mesh = mesh
        self.label = label
        #: Group rank -> global rank, for error messages of subgroups.
        self.global_ranks = global_ranks or list(range(mesh.size))
        self.chunk_cap = chunk_cap  # the group's (base.chunk_cap), for every op's channel
        self.scratch = Scratch()
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._seq = 0
        self._seq_lock = threading.Lock()
        self._busy = 0  # jobs submitted and not yet finished (guarded by _seq_lock)
        self._finished = 0  # jobs finished so far (guarded by _seq_lock): shutdown's progress
        # One executor at a time: an inline job on a caller's thread and the comm thread must
        # never read the sockets together (another thread may submit while one runs inline).
        self._exec_lock = threading.Lock()
        self.error: CollectiveError | None = None
        #: Called once with the error when the group breaks, unless by a mismatch (see
        #: ``_fail``): the process group leaves word for ranks still forming the group.
        self.on_break: Callable[[CollectiveError], None] | None = None
        #: An op that needs every rank's data completed here, so every rank formed the group
        #: and none waits in its set-up for word of a break (``ProcessGroupMCCL._leave_word``).
        self.all_formed = False
        self._stopped = False
        self._aborted = False
        self._forked = False  # this process is a fork of the group's (``_disown``)
        self._said_bye = False  # a clean stop told the peers (``close`` then reads to theirs)
        self._next: object = _NO_JOB  # a job taken off the queue by an early start
        self.early_starts = 0  # ops whose first sends went out early (tests read it)
        # Parked jobs (comm thread; counted in _busy until they finish) and those that have
        # finished, with their outcome (appended by any thread, settled by the comm thread).
        self._parked = _Parked()
        self._landed: deque[tuple[Job, BaseException | None, int]] = deque()
        self._serving = False  # the comm thread waits in Mesh.serve (guarded by _seq_lock)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._thread = threading.Thread(target=self._loop, name=f"mccl-comm-{label}", daemon=True)
        self._thread.start()
        _LIVE.add(self)

    @property
    def timeout_s(self) -> float:
        """The group timeout: the mesh's, which ``Mesh.set_timeout`` changes."""
        return self.mesh.timeout_s

    @property
    def seq(self) -> int:
        return self._seq

    def submit(self, job: Job, inline: bool = False) -> Work:
        """Queue ``job``; with ``inline`` (a blocking small collective on host memory) run it
        on the caller's thread instead when nothing else is queued or running, saving two
        thread hand-offs of latency. Ops still run strictly in issue order."""
        with self._seq_lock:  # shutdown() takes it too: no job can land behind the sentinel
            if self._stopped:
                _discard(job)
                self.check_running(job.name)
            if job.collective:
                self._seq += 1
                job.seq = self._seq
            self._busy += 1
            run_here = inline and self._busy == 1
            if not run_here:
                if inline:  # prepared for this thread; the comm thread runs it instead
                    try:
                        job.handoff.queued()
                    except Exception as e:  # noqa: BLE001 - fails the job in its turn
                        job.early_error = e
                self._q.put(job)
                if self._serving:
                    self._wake()
        if run_here:
            self._run_counted(job)
        return job.work

    def fail_outside(self, name: str, sig: Signature, error: BaseException, work: Work) -> None:
        """A failure the queue did not see (a CPU send's, written by its sender thread)
        breaks the group as an op's would: a job that raises it takes its turn, so the ops
        issued after it fail with it and the peers hear why, and ``work`` fails then, as a
        device send's does. An op running meanwhile reads the report the peer may have left
        before closing (only its thread may read the sockets); if it fails with that, the
        group's error is the one ``work`` gives. Any thread."""
        def body(ch: OpChannel, hosts: list[torch.Tensor]) -> None:
            raise error

        try:
            self.submit(Job(name, sig, body, work, CpuHandoff([]), collective=False))
        except CollectiveError as e:  # shut down meanwhile: nothing left to break
            work.fail(e)

    def _disown(self) -> None:
        """This process is a fork of the one that made the group (``_disown_in_child``):
        stop without touching the sockets; a lock held at the fork by another thread of the
        parent would never be released here."""
        self._seq_lock = threading.Lock()
        self._stopped = self._forked = True

    def check_running(self, name: str) -> None:
        """Refuse op ``name`` once the group was shut down or aborted (a CPU send, which
        does not queue, asks here; its sockets are closed by then)."""
        if self._forked:
            raise CollectiveError(f"mccl {name}: process group '{self.label}' belongs to the "
                                  "process this one was forked from; a forked child cannot "
                                  "use it (make a group in the child)", op=name)
        if self._stopped:
            how = "aborted" if self._aborted else "shut down"
            raise CollectiveError(f"mccl {name}: process group '{self.label}' was {how}",
                                  op=name)

    def _wake(self) -> None:
        """Wake the comm thread out of ``Mesh.serve`` (call with ``_seq_lock`` held)."""
        try:
            self._wake_w.send(b"\0")
        except OSError:  # full (a wake-up is pending anyway) or closed at shutdown
            pass

    def _loop(self) -> None:
        while True:
            job, self._next = self._next, _NO_JOB
            if job is _NO_JOB:
                job = self._take()
            if job is None:
                return
            self._run_counted(job)

    def _take(self):
        """The next job; while parked ops wait, serve them until one comes."""
        while True:
            if self._landed:
                self._settle_landed()
            if not self._parked:
                return self._q.get()
            try:
                return self._q.get_nowait()
            except queue.Empty:
                pass
            self._serve(idle=True)

    def _serve(self, idle: bool) -> None:
        """Wait a little for the parked ops' bytes. ``idle``: between jobs (unless one is
        queued); else inside a job's turn, which holds the executor lock already."""
        with self._seq_lock:
            if idle and not self._q.empty():
                return
            self._serving = True
        try:
            with self._exec_lock if idle else contextlib.nullcontext():
                self.mesh.serve(self.mesh.probe_s, self._wake_r)
        except BaseException as e:  # noqa: BLE001 - fails the parked ops and the group
            if self._parked:  # the oldest takes the blame; the rest fail with it
                job = self._parked.oldest()
                self._parked.remove(job)
                self._fail(job, e)
                self._count_done()
        finally:
            with self._seq_lock:
                self._serving = False
        if self._landed:
            self._settle_landed()

    def _land(self, job: Job, error: BaseException | None = None, source: int = -1) -> None:
        """A parked job finished (any thread): the comm thread settles it."""
        self._landed.append((job, error, source))
        with self._seq_lock:
            if self._serving:
                self._wake()

    def _settle_landed(self) -> None:
        """Complete (or fail) the parked jobs that finished: the comm thread, or the thread
        shutting the group down once the comm thread has stopped."""
        while self._landed:
            job, error, source = self._landed.popleft()
            if not self._parked.remove(job):
                continue  # failed meanwhile (the group broke)
            if error is None and self.error is None:
                try:
                    job.handoff.release()
                except BaseException as e:  # noqa: BLE001 - every failure must reach the waiter
                    error = e
            if self.error is not None:
                self._fail_later(job)
            elif error is not None:
                self._fail(job, error)
            else:
                if source >= 0:
                    job.work.set_source_rank(source)
                job.work.complete(job.handoff.gate(), job.handoff.result_context())
            self._count_done()

    def _fail_parked(self, error: CollectiveError | None = None) -> None:
        """Fail every parked job: the group broke (``self.error``) or shut down (``error``)."""
        for job in self._parked.take_all():
            self._fail_later(job, error)
            self._count_done()

    def _fail_later(self, job: Job, error: CollectiveError | None = None) -> None:
        """Fail ``job``, which did not cause the failure: the group broke before it finished
        (``self.error``), or ``error``; what its hand-off holds is given back."""
        _discard(job)
        job.work.fail(error or self._later_error(job))

    def _count_done(self) -> None:
        """A submitted job has finished (``_busy`` counts parked jobs until then)."""
        with self._seq_lock:
            self._busy -= 1
            self._finished += 1

    def _run_counted(self, job: Job) -> None:
        """Run one job (never two at once: the comm thread and an inline caller share the
        sockets), then count it as finished, unless it was parked."""
        finished = True
        try:
            with self._exec_lock:
                finished = self._execute(job)
        finally:
            if finished:
                self._count_done()
        if self._landed and threading.current_thread() is self._thread:
            self._settle_landed()

    def _channel(self, job: Job) -> OpChannel:
        """The op's channel: its frames' seq and signature, its deadline, the group's cap."""
        return OpChannel(self.mesh, job.seq, job.sig, time.monotonic() + self.timeout_s,
                         self.chunk_cap)

    def _execute(self, job: Job) -> bool:
        """Run ``job``; False if it was parked (it finishes later, see ``_settle_landed``)."""
        if self._parked and job.tensors:
            self._await_parked_sharing(job)
        if self.error is not None:
            self._fail_later(job)
            return True
        mesh = self.mesh
        try:
            with np.errstate(all="ignore"):  # overflow wraps/saturates silently, as in torch
                mesh.begin_op(job.seq if job.collective else 0, job.sig)
                if job.early_error is not None:
                    raise job.early_error
                if job.early is not None:
                    ch, hosts = job.early
                    job.early = None
                else:
                    hosts = job.handoff.acquire()
                    ch = self._channel(job)
                    if job.start is not None:
                        job.start(ch, hosts)
                if job.park is not None:
                    self._parked.add(job)
                    job.park(ch, hosts, lambda error=None, source=-1:
                             self._land(job, error, source))
                    mesh.end_op()
                    return False
                if EARLY_START and threading.current_thread() is self._thread:
                    ch.on_sends_done = lambda: self._start_next(job)
                job.body(ch, hosts)
                if ch.last_from >= 0 and job.collective:
                    mesh.check_reports(ch.last_from)  # did the op fail there meanwhile?
                job.handoff.release()
                mesh.end_op()
        except InStepError as e:  # every rank stopped here, its exchanges done: in step
            _discard(job)
            mesh.end_op()
            job.work.fail(e)
            return True
        except BaseException as e:  # noqa: BLE001 - every failure must reach the waiter
            self._parked.remove(job)
            self._fail(job, e)
            if not isinstance(e, Exception) and threading.current_thread() is not self._thread:
                raise  # Ctrl-C (or SystemExit) in an op run inline: the caller's, unwrapped
            return True
        job.work.complete(job.handoff.gate(), job.handoff.result_context())
        if not self.all_formed and job.collective and _from_every_rank(job.sig):
            self.all_formed = True
        return True

    def _await_parked_sharing(self, job: Job) -> None:
        """Ops on one tensor run in issue order: before ``job`` runs, a parked op on a tensor
        it shares waits to finish (serving the sockets meanwhile; a failure there breaks the
        group, and ``job`` then fails in its turn)."""
        while self.error is None and self._parked.share_memory_with(job.tensors):
            self._serve(idle=False)

    def _fail(self, job: Job, e: BaseException) -> None:
        """``job`` failed: the group breaks; its peers and every parked op learn why."""
        mesh = self.mesh
        mesh.op_failed()
        err = self._wrap(job, e)
        first = self.error is None
        self.error = err
        log.error("%s", err)
        _discard(job)
        job.work.fail(err)
        self._fail_parked()
        if not mesh.closed:
            # Forward the original reason (not our wrapper) so messages do not nest; a
            # mismatch's own text names both ops and ranks (and starts with MISMATCH, which
            # tells the peers what it is).
            reason = getattr(e, "origin", None) or (
                str(e) if isinstance(e, MismatchError) else str(err))
            nobody = isinstance(e, PeerError) and e.culprit is None  # (``_wrap``)
            mesh.fail(reason, err.peer, job.seq, nobody=nobody)
        # A mismatch is between ranks that formed the group; one still forming finds it in
        # its own first op (the same op, issued its way), so it gets no word of it.
        mismatch = isinstance(e, MismatchError) or str(getattr(e, "origin", "")).startswith(
            MISMATCH)
        if first and self.on_break is not None and not mismatch:
            try:
                self.on_break(err)
            except Exception:  # noqa: BLE001 - best effort; the op's own error stands
                log.debug("group %s: on_break failed", self.label, exc_info=True)

    def _start_next(self, running: Job) -> None:
        """Comm thread, inside ``running``'s body once its sends are all queued: take the next
        job off the queue and run its ``start`` now, if it has one, its inputs are ready (no
        wait on the device) and it touches none of ``running``'s tensors nor a parked op's.
        What its start raises fails that job, in its turn, not ``running``."""
        if self._next is not _NO_JOB or self.error is not None:
            return
        try:
            job = self._q.get_nowait()
        except queue.Empty:
            return
        self._next = job
        if job is None or job.start is None or not job.collective or job.early_error:
            return
        try:
            if (not job.handoff.ready_now() or _overlap(job.tensors, running.tensors)
                    or self._parked.share_memory_with(job.tensors)):
                return  # (a parked op on its tensor must finish first: issue order)
        except Exception:  # noqa: BLE001 - not started early; its own turn reports any error
            return
        try:
            hosts = job.handoff.acquire()
            ch = self._channel(job)
            job.start(ch, hosts)
        except Exception as e:  # noqa: BLE001 - reported when the job runs
            job.early_error = e
            return
        job.early = (ch, hosts)
        self.early_starts += 1

    def _rank(self, r: int) -> str:
        """A group rank, with its global rank where the two differ (subgroups)."""
        g = self.global_ranks[r] if 0 <= r < len(self.global_ranks) else r
        return f"rank {r}" if g == r else f"rank {r} (global rank {g})"

    def waiting_text(self, seq: int) -> str:
        """What collective ``seq`` waits for now, for a ``Work.wait`` that timed out (any
        thread; a snapshot): the peer its running op has heard nothing from, or the op it is
        queued behind."""
        mesh = self.mesh
        cur, silent = mesh.cur_seq, mesh.silent
        if not seq or seq <= mesh.done_seq:
            return ""
        if not cur or cur > seq:
            return f"op #{seq} is queued"
        head = f"op #{seq} is running" if cur == seq else \
            f"op #{seq} is queued behind op #{cur}, which is running"
        if silent is None:
            return head
        r, since = silent
        return (f"{head} and waits for {self._rank(r)}, silent for "
                f"{time.monotonic() - since:.1f}s")

    def _where(self, job: Job) -> str:
        op = f"op #{job.seq}" if job.collective else "p2p"
        return f"mccl {job.name} ({op}) on {self._rank(self.mesh.rank)} of group '{self.label}'"

    def closed_here(self) -> str | None:
        """What cut the connections when this rank's own shutdown or abort did (the peers did
        nothing wrong then), else None."""
        if self.mesh.closed and not self.mesh.failed:
            return f"the process group was {'aborted' if self._aborted else 'shut down'}"
        return None

    def _wrap(self, job: Job, e: BaseException) -> CollectiveError:
        peer = getattr(e, "culprit", getattr(e, "peer", None))
        here = None if isinstance(e, MismatchError) else self.closed_here()
        if here is not None:
            peer, what = None, here
        else:
            cause = str(e) or type(e).__name__
            kind = MISMATCH if isinstance(e, MismatchError) else (
                "peer failure" if isinstance(e, PeerError) else type(e).__name__)
            what = cause if cause.startswith(kind) else f"{kind}: {cause}"
        if peer is None:
            who = ""
        elif peer == self.mesh.rank:  # the peers gave up on this rank (it stalled, was late,
            who = " [blamed on this rank by a peer]"  # or issued the odd op): not a peer's fault
        else:
            who = f" [peer {self._rank(peer)}]"
        err = CollectiveError(f"{self._where(job)} failed{who}: {what}", op=job.name, peer=peer)
        log.debug("%s: raised here", err, exc_info=e)
        err.__cause__ = _without_frames(e)
        return err

    def _later_error(self, job: Job) -> CollectiveError:
        assert self.error is not None
        return CollectiveError(
            f"{self._where(job)} not run: the group failed earlier: {self.error}",
            op=job.name, peer=self.error.peer)

    def _report_unread(self) -> None:
        """Report what the peers sent that this rank never read (``Mesh.unread``): a mismatch
        that no later op revealed (``_tell``). A scan error never fails the shutdown."""
        mesh = self.mesh
        try:
            findings = mesh.unread(_UNREAD_GRACE.left())
        except Exception:  # noqa: BLE001 - best effort at teardown
            log.debug("mccl group '%s': scan for unread frames failed", self.label,
                      exc_info=True)
            return
        for finding in findings:
            self._tell(f"mccl group '{self.label}', rank {mesh.rank}, at shutdown: {finding}")

    @staticmethod
    def _tell(text: str) -> None:
        """Logged at ERROR where the application's logging shows the 'mccl' logger, else
        issued as a RuntimeWarning, which Python shows by default (never raised: a shutdown
        must not fail halfway through torch's groups)."""
        if not _shown(log):
            try:
                warnings.warn(text, RuntimeWarning, stacklevel=3)
                return
            except Warning:  # warnings made errors (-W error): still never fail here
                pass
        log.error("%s", text)

    def _drain(self, stall_s: float) -> bool:
        """Wait until the queued ops, and one a caller's thread runs inline, have finished
        (parked receives are left: nothing may ever come for them). False once no op has
        finished for ``stall_s``: each op fails on a stalled peer by then, so this only bounds
        an op stuck in a way the group timeout does not cover."""
        last, since = -1, 0.0
        while True:
            alive = self._thread.is_alive()
            with self._seq_lock:
                # After the comm thread's exit only inline and parked jobs stay counted.
                if not alive and self._busy <= len(self._parked):
                    return True
                done = self._finished
            now = time.monotonic()
            if done != last:
                last, since = done, now
            elif now - since >= stall_s:
                return False
            if alive:
                self._thread.join(DRAIN_POLL_S)
            else:
                time.sleep(DRAIN_POLL_S)

    def _abort(self) -> None:
        """Mark the group aborted (with ``_seq_lock`` held): every op left fails with that."""
        self._aborted = True
        self.error = self.error or CollectiveError(
            f"mccl process group '{self.label}' was aborted", op="abort")

    def _aborted_text(self) -> str:
        """What the peers are told when this rank aborts the group."""
        return f"rank {self.mesh.rank} aborted process group '{self.label}'"

    def shutdown(self, abort: bool = False, drain_s: float | None = None) -> None:
        """Stop the comm thread. Without ``abort``, queued ops (and one running inline on a
        caller's thread) finish first, for as long as they make progress: the connections are
        cut once none has finished for ``drain_s`` (default: the group timeout plus
        ``DRAIN_MARGIN_S``). With ``abort`` (also while another thread's shutdown drains) they
        fail at once. Either way every queued op's Work completes and no thread stays blocked
        on this group."""
        if self.stop(abort, drain_s):
            self.close()

    def stop(self, abort: bool = False, drain_s: float | None = None) -> bool:
        """``shutdown``'s first part, up to the BYE sent to the peers; False if the group
        was stopped already."""
        drain_s = self.timeout_s + DRAIN_MARGIN_S if drain_s is None else drain_s
        with self._seq_lock:
            if self._forked:
                return False  # the parent's sockets: never shut down from here
            if self._stopped:
                if abort and not self._aborted:  # a shutdown drains: cut it short
                    self._abort()
                    self.mesh.close(self._aborted_text())
                return False
            self._stopped = True
            if abort:
                self._abort()
            self._q.put(None)
            self._wake()
        mesh = self.mesh
        if abort:
            mesh.close(self._aborted_text())
        if not abort and not self._drain(drain_s):
            self._tell(f"mccl group '{self.label}': at shutdown, no op finished for "
                       f"{drain_s:g}s; cutting the connections (the ops left fail)")
            mesh.close()
        self._thread.join(timeout=FLUSH_S)
        if self._thread.is_alive():
            log.error("mccl group '%s': comm thread did not stop", self.label)
        # After a failure only our error frames are left to go out: a short, bounded wait.
        deadline = time.monotonic() + (_FLUSH if self.error is None else _ERROR_FLUSH).left()
        if not mesh.closed:
            peers = [p.rank for p in mesh.peers if p is not None]
            try:  # let queued bytes (or our error frames) reach the peers before we go
                mesh.flush(peers, deadline, poll=False)
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass
        if not self._thread.is_alive():  # else the stuck comm thread still owns them
            self._settle_landed()  # sends the flush let finish
            how = "aborted" if abort else "shut down"
            self._fail_parked(CollectiveError(
                f"mccl process group '{self.label}' was {how} before this op finished",
                op="shutdown"))
        self._said_bye = not mesh.closed and self.error is None
        if self._said_bye:
            mesh.say_bye(deadline)
        return True

    def close(self) -> None:
        """``shutdown``'s second part: after a clean stop, read what the peers sent up to their
        BYE and report what no op read; then free the connections."""
        if self._said_bye:
            self._report_unread()
        self.mesh.dispose()
        self._wake_r.close()
        self._wake_w.close()
