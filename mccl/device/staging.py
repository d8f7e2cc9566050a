"""The staging hand-off, generic over the device: copy to host buffers, ring, copy back.

Why one module: CUDA (always) and MPS (without the shared-memory alias) both stage through
host memory; the order of waits, copies and markers is the part that is easy to get wrong, so
it lives here once and is tested on CPU with a fake device (``tests/test_device_staging.py``).

Per op, with ``ops`` the device half (:class:`DeviceOps`):

* caller's thread, ``prepare``: ``ops.ready()`` records the ready-marker after the kernels
  that produced the inputs (O1). Devices whose comm thread may not touch PyTorch's stream
  (``copy_out_on_caller``) copy device -> host here, before the marker, except when an op
  issued before this one has yet to copy back into a storage this one reads
  (``PendingWrites``): then the comm thread copies out in ``acquire``, after that copy back
  (torch leaves reusing a tensor before its op completed undefined; mccl keeps issue order).
* comm thread, ``acquire``: order after that marker only (``ops.order_after``: CUDA makes its
  side stream wait for it on the GPU, so the copies are enqueued at once); copy device -> host
  on the adapter's own side stream (``ops.copy_context``) and wait for that copy (sleeping on
  the producer's marker first if it has not passed, then on the copy's fence, which may spin:
  ``_await``); return the host tensors.
* comm thread, ``release``: copy host -> device on the side stream and record ``done``;
  host buffers go back to the pool fenced by ``done`` (reused only once the copy finished),
  unfenced where every copy runs in order on one stream (``copies_in_order``: the next op's
  copies queue behind it).
* waiting thread, ``gate``: ``ops.gate(done)`` makes the consumer's stream wait (O2);
  ``result_context`` is where the Future is completed so Future waiters see ``done`` too.

Ranges (where the comm thread does the copies: the one tensor of an all-reduce; a flat
all-gather's output and input; a flat reduce-scatter's input and output): ``pipeline`` on the
caller's thread names one such tensor and takes a function giving ranges of its flat view
(elements, or bytes) in the order the collective first needs them (the ring's pieces,
``collectives.staging_plan``), called only if the tensor is staged by range. An op ranges at
most one tensor it reads and one it writes (an all-reduce's one tensor is both); its other
tensors are staged whole. Of the ranged tensor that is read, ``acquire`` enqueues the first
ranges' device -> host copies, each followed by its own fence, and waits for none of them; the
body calls ``wait_range(i)`` before it first touches range i (that range's fence only), which
also enqueues a few more copies out, up to ``COPY_AHEAD_BYTES`` beyond range i. Of the one
that is written, the body calls ``copy_back(i)`` once range i holds its result, which enqueues
its host -> device copy at once, so it overlaps the rest of the exchange.
Copies out are not all enqueued up front: ranks sharing a device then each flood it with a
whole tensor's copies, and a rank's first range waited behind the others' (7 ms for 64 MB at
8 ranks on one H200, against under 1 ms for one segment each). With the ring's small first
and last pieces, only a small piece's copy out and copy back are not hidden.
``release`` copies back any range of a written tensor not copied back yet (of a tensor also
read, only those copied out: the others hold none of its data) and records ``done`` after the
last, exactly as without ranges (gate, Future and pool fencing unchanged).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

import torch

log = logging.getLogger("mccl.device")

#: Host bytes a pool keeps for reuse (buffers beyond this are dropped after use).
POOL_MAX_BYTES = 2 << 30
#: Buffers of one size a pool keeps (an op holds its buffers only while it runs).
POOL_PER_SIZE = 4
#: A staged op copies its ranged tensor range by range from this many bytes (see the module
#: docstring; and only where the ring's plan cuts a segment into more than one piece,
#: ``collectives.staging_ranges``): each range costs a fence and its waits (tens of
#: microseconds of Python), while the whole copies it hides take ~0.2 ms per 4 MB each way
#: on an H200 (not tuned further).
PIPELINE_MIN_BYTES = 4 << 20
#: Copies out a ranged hand-off keeps enqueued beyond the range the body waits for: enough
#: to stay ahead of a 10 Gbit ring (a few ms), small against a whole tensor.
COPY_AHEAD_BYTES = 8 << 20
#: Ranges whose copies out ``acquire`` enqueues (the ring's first two pieces are small), and
#: the most a wait enqueues: each call costs comm-thread time, and the one before the first
#: send is on the op's critical path.
COPY_FIRST_RANGES = 2
COPY_STEP_RANGES = 2


class Fence(Protocol):
    """A device marker: ``synchronize`` blocks the calling thread until it has passed."""

    def synchronize(self) -> None: ...

    def query(self) -> bool:
        """Has the marker passed? (Never blocks.)"""
        ...


class DeviceOps(Protocol):
    """The device-specific half of the staging hand-off."""

    #: True where the comm thread must not enqueue copies (they run in ``prepare`` instead).
    copy_out_on_caller: bool
    #: True where every copy of a hand-off runs in issue order on one stream (CUDA's side
    #: stream): a host buffer given back behind its copy back may be taken again at once,
    #: since the next op's copies queue behind that copy, and the CPU reads or writes the
    #: buffer only after waiting for a fence recorded after them (``acquire``,
    #: ``wait_range``). Elsewhere ``HostPool.take`` waits for the copy back first.
    copies_in_order: bool

    def ready(self) -> Fence | None:
        """Caller's thread: marker after the work already queued on the current stream."""
        ...

    def order_after(self, marker: Fence) -> None:
        """Comm thread: make the copies enqueued next (``copy_context``) and what reads their
        results come after ``marker``: a wait on the device's side where it has one, else
        ``marker.synchronize()``."""
        ...

    def copy_context(self) -> AbstractContextManager:
        """Context in which copies are enqueued (the adapter's side stream)."""
        ...

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Enqueue ``dst.copy_(src)`` in the current context (may be asynchronous)."""
        ...

    def fence(self) -> Fence | None:
        """Marker after the copies enqueued so far in ``copy_context`` (None: already done).
        Waiting on it may spin: the hand-off waits for the producer's marker (``ready``, which
        must sleep) before it waits for a fence."""
        ...

    def gate(self, done: Fence | None) -> Callable[[], None] | None:
        """What the waiting thread runs so its later device work sees the copied-back result."""
        ...

    def result_context(self) -> Callable[[], AbstractContextManager] | None:
        """Context for completing the Future (so Future waiters sync on the copy back)."""
        ...

    def alloc_host(self, nbytes: int) -> torch.Tensor:
        """A flat uint8 host buffer (pinned where the device can use that)."""
        ...


class HostPool:
    """Host staging buffers keyed by byte size, reused across ops instead of allocated per op.

    A returned buffer carries the fence of the last copy that reads it; ``take`` waits on that
    fence before handing it out again, so a pending host -> device copy never sees new bytes.
    """

    def __init__(self, alloc: Callable[[int], torch.Tensor], max_bytes: int = POOL_MAX_BYTES,
                 per_size: int = POOL_PER_SIZE):
        self._alloc = alloc
        self._free: dict[int, list[tuple[torch.Tensor, Fence | None]]] = {}
        self._held = 0
        self._max = max_bytes
        self._per_size = per_size
        self._lock = threading.Lock()
        self.allocations = 0  # buffers ever allocated (tests and doctor read it)

    def take(self, nbytes: int) -> torch.Tensor:
        with self._lock:
            free = self._free.get(nbytes)
            entry = free.pop() if free else None
            if entry is not None:
                self._held -= nbytes
        if entry is None:
            self.allocations += 1
            return self._alloc(nbytes)
        buf, fence = entry
        if fence is not None:
            fence.synchronize()
        return buf

    def give(self, buf: torch.Tensor, fence: Fence | None) -> None:
        nbytes = buf.numel()
        with self._lock:
            free = self._free.setdefault(nbytes, [])
            if len(free) < self._per_size and self._held + nbytes <= self._max:
                free.append((buf, fence))
                self._held += nbytes

    @property
    def held_bytes(self) -> int:
        return self._held


def _host_like(buf: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """View a flat uint8 buffer as a host tensor of t's dtype and shape."""
    if t.numel() == 0:
        return torch.empty(t.shape, dtype=t.dtype)
    flat = buf.view(t.dtype)
    return flat if t.dim() == 1 else flat.view(t.shape)  # (a view costs ~3 us)


def _storages(tensors: Sequence[torch.Tensor], which: Sequence[bool]) -> list[int]:
    return [t.untyped_storage().data_ptr() for t, w in zip(tensors, which, strict=True)
            if w and t.numel()]


class PendingWrites:
    """Device storages that issued staged ops will copy back into and have not yet (counted
    per storage). A later op that reads one of them must not copy it out before that copy
    back: it would read the bytes from before that op's result."""

    def __init__(self) -> None:
        self._count: dict[int, int] = {}
        self._lock = threading.Lock()

    def add(self, reads: list[int], writes: list[int]) -> bool:
        """Register ``writes``; True if one of ``reads`` is written by an op added earlier."""
        with self._lock:
            hit = any(p in self._count for p in reads)
            for p in writes:
                self._count[p] = self._count.get(p, 0) + 1
            return hit

    def remove(self, writes: list[int]) -> None:
        with self._lock:
            for p in writes:
                left = self._count[p] - 1
                if left:
                    self._count[p] = left
                else:
                    del self._count[p]


class _Ranged:
    """One tensor of an op that is staged range by range (``StagingHandoff.pipeline``)."""

    def __init__(self, index: int, ranges: Sequence[tuple[int, int]], in_bytes: bool,
                 itemsize: int):
        self.index = index
        self.in_bytes = in_bytes  # its ranges count bytes, not elements
        self.ranges = list(ranges)
        unit = 1 if in_bytes else itemsize
        offsets = [0]  # bytes before each range, in the ranges' order
        for a, b in self.ranges:
            offsets.append(offsets[-1] + (b - a) * unit)
        self.offsets = offsets
        self.fences: list[Fence | None] = []  # of the ranges whose copy out is enqueued
        self.backed = [False] * len(self.ranges)  # ranges whose copy back is enqueued
        self.flat: tuple[torch.Tensor, torch.Tensor] | None = None  # (device, host) 1-D views

    def view(self, dev: torch.Tensor, host: torch.Tensor) -> None:
        """The two sides' flat views, sliced per range, made once per op."""
        dev, host = dev.view(-1), host.view(-1)
        self.flat = ((dev.view(torch.uint8), host.view(torch.uint8)) if self.in_bytes
                     else (dev, host))


class StagingHandoff:
    """One op's staged hand-off (see the module docstring for who runs what where)."""

    def __init__(self, ops: DeviceOps, pool: HostPool, tensors: Sequence[torch.Tensor],
                 reads: Sequence[bool], writes: Sequence[bool],
                 pending: PendingWrites | None = None):
        self.ops = ops
        self.pool = pool
        self.tensors = list(tensors)
        self.reads = list(reads)
        self.writes = list(writes)
        self.hosts: list[torch.Tensor] | None = None
        self._pending = pending
        self._written: list[int] = []
        after_writes = False  # an op issued earlier still writes what this one reads
        if pending is not None:
            self._written = _storages(self.tensors, self.writes)
            after_writes = pending.add(_storages(self.tensors, self.reads), self._written)
        self._after_writes = after_writes
        self._bufs: list[torch.Tensor | None] = []
        self._done: Fence | None = None
        self._out_fence: Fence | None = None
        self._in: _Ranged | None = None  # the tensor read range by range (pipeline())
        self._out: _Ranged | None = None  # the one written range by range (may be the same)
        if ops.copy_out_on_caller and not after_writes:
            self._stage_out()  # else acquire copies out, after that op's copy back
        self._ready = ops.ready()
        self._ready_slept = False  # _await has waited for the producer's marker

    def pipeline(self, ranges: Callable[[], Sequence[tuple[int, int]] | None],
                 index: int = 0, in_bytes: bool = False) -> bool:
        """Caller's thread, before submission: stage tensor ``index`` range by range if it is
        large enough and the comm thread does the copies (the op's other tensors are staged
        whole; at most one ranged tensor is read and one written). ``ranges()`` gives ranges
        of its flat view (elements, or bytes if ``in_bytes``) that tile it, in the order the
        body first needs them, or None where the collective gains nothing from ranges; it is
        called only then (most ops are not staged by range, and building the ranges is
        O(ranks) on the caller's thread). True: if the tensor is read, the body must call
        :meth:`wait_range` before it touches a range (``acquire`` no longer waits for its
        data); if written, it may call :meth:`copy_back` once a range is final."""
        if self.ops.copy_out_on_caller or self.hosts is not None:
            return False
        t = self.tensors[index]
        nbytes = t.numel() * t.element_size()
        if nbytes < PIPELINE_MIN_BYTES or not t.is_contiguous():
            return False
        read, written = self.reads[index], self.writes[index]
        if not (read or written) or (read and self._in) or (written and self._out):
            return False
        got = ranges()
        if got is None:
            return False
        ranged = _Ranged(index, got, in_bytes, t.element_size())
        if read:
            self._in = ranged
        if written:
            self._out = ranged
        return True

    def _stage_out(self) -> None:
        """Take host buffers and enqueue the device -> host copies of the inputs (of a ranged
        tensor, only its first ranges': ``_copy_out``)."""
        hosts, bufs = [], []
        # A buffer the CPU touches before a copy out of its own has landed in it must wait
        # for this fence: with copies in order, a pooled buffer is given back before the
        # copy back that reads it has run. Only a ranged tensor that is read has fences of
        # its own (one per range).
        fenced = self._in is None
        copied_by_range = self._in.index if self._in is not None else -1
        with self.ops.copy_context():
            for i, (t, r) in enumerate(zip(self.tensors, self.reads, strict=True)):
                if t.numel() == 0:
                    hosts.append(torch.empty(t.shape, dtype=t.dtype))
                    bufs.append(None)
                    continue
                buf = self.pool.take(t.numel() * t.element_size())
                h = _host_like(buf, t)
                if i != copied_by_range:  # (that one: copied by range, fenced each)
                    if r:
                        self.ops.copy(h, t)
                    fenced = True
                hosts.append(h)
                bufs.append(buf)
            out_fence = self.ops.fence() if fenced else None
        self.hosts, self._bufs = hosts, bufs
        self._out_fence = out_fence
        for ranged in (self._in, self._out):
            if ranged is not None:
                ranged.view(self.tensors[ranged.index], hosts[ranged.index])
        if self._in is not None:
            self._copy_out(min(COPY_FIRST_RANGES, len(self._in.ranges)))

    def _copy_out(self, upto: int) -> None:
        """Enqueue the copies out of the ranges before ``upto`` not enqueued yet, in order,
        each followed by its own fence."""
        ranged = self._in
        assert ranged is not None and ranged.flat is not None
        fences = ranged.fences
        if len(fences) >= upto:
            return
        src, dst = ranged.flat
        with self.ops.copy_context():
            for a, b in ranged.ranges[len(fences):upto]:
                self.ops.copy(dst[a:b], src[a:b])
                fences.append(self.ops.fence())

    def wait_range(self, i: int) -> None:
        """Comm thread, after ``acquire`` (pipelined hand-off only): block until range i's
        device -> host copy has landed (later ranges may still be copying), then enqueue up to
        ``COPY_STEP_RANGES`` more copies, staying within ``COPY_AHEAD_BYTES`` of it."""
        self._copy_out(i + 1)
        assert self._in is not None
        fences, offsets = self._in.fences, self._in.offsets
        fence = fences[i]
        if fence is not None:
            self._await(fence)
            fences[i] = None
        limit = offsets[i + 1] + COPY_AHEAD_BYTES
        upto = len(fences)
        stop = min(len(offsets) - 1, upto + COPY_STEP_RANGES)
        while upto < stop and offsets[upto] < limit:
            upto += 1
        self._copy_out(upto)

    def copy_back(self, i: int) -> None:
        """Comm thread: enqueue range i's host -> device copy now (once per range); the host
        range must not change afterwards."""
        assert self._out is not None
        if self._out.backed[i]:
            return
        with self.ops.copy_context():
            self._copy_range_back(self._out, i)

    def _copy_range_back(self, ranged: _Ranged, i: int) -> None:
        assert ranged.flat is not None
        a, b = ranged.ranges[i]
        dev, host = ranged.flat
        self.ops.copy(dev[a:b], host[a:b])
        ranged.backed[i] = True

    def acquire(self) -> list[torch.Tensor]:
        if self._ready is not None:
            self.ops.order_after(self._ready)  # O1: the producer's marker, never the device
        if self.hosts is None:
            self._stage_out()
        if self._out_fence is not None:
            self._await(self._out_fence)  # our own device -> host copies
        assert self.hosts is not None
        return self.hosts

    def _await(self, fence: Fence) -> None:
        """Block until ``fence``, after some of this op's copies, has passed. Copies that the
        device orders after the producer's marker (``order_after``) may wait long for it (in
        DDP, for backward's kernels); the thread sleeps on that marker first, so a fence that
        is waited for by spinning (CUDA's, see ``DeviceOps.fence``) spins for the copies
        only."""
        if not self._ready_slept:
            self._ready_slept = True
            if self._ready is not None and not self._ready.query():
                self._ready.synchronize()
        fence.synchronize()

    def ready_now(self) -> bool:
        """The producer's marker has passed and no earlier op's copy back is awaited."""
        if self._after_writes:
            return False
        return self._ready is None or bool(self._ready.query())

    def release(self) -> None:
        assert self.hosts is not None
        copied = False
        with self.ops.copy_context():
            out = self._out
            if out is not None:
                # ranges not copied back yet; of a tensor also read, one never copied out
                # holds no data of it
                for i in range(len(out.fences) if out is self._in else len(out.ranges)):
                    if not out.backed[i]:
                        self._copy_range_back(out, i)
                copied = True
            by_range = out.index if out is not None else -1
            for i, (t, h, w) in enumerate(zip(self.tensors, self.hosts, self.writes,
                                              strict=True)):
                if w and t.numel() and i != by_range:
                    self.ops.copy(t, h)
                    copied = True
            self._done = self.ops.fence() if copied else None
        self._unpend()
        bufs, self._bufs = self._bufs, []
        # fenced only where the next op's copies could overtake this copy back
        fence = None if self.ops.copies_in_order else self._done
        for buf, w in zip(bufs, self.writes, strict=True):
            if buf is not None:
                self.pool.give(buf, fence if w else None)
        self._drop_views()  # device tensors again; drop host references

    def discard(self) -> None:
        """The op failed or never ran: its buffers go back to the pool fenced behind every
        copy enqueued so far (one may still be reading or writing them), nothing is copied
        back, and later ops no longer wait for a copy back that will not come."""
        self._unpend()
        bufs, self._bufs = self._bufs, []
        if any(b is not None for b in bufs):
            with self.ops.copy_context():
                fence = self.ops.fence()
            for buf in bufs:
                if buf is not None:
                    self.pool.give(buf, fence)
        self._drop_views()

    def _drop_views(self) -> None:
        self.hosts = None
        for ranged in (self._in, self._out):
            if ranged is not None:
                ranged.flat = None

    def _unpend(self) -> None:
        if self._pending is not None and self._written:
            self._pending.remove(self._written)
            self._written = []

    def gate(self) -> Callable[[], None] | None:
        return self.ops.gate(self._done)

    def result_context(self) -> Callable[[], AbstractContextManager] | None:
        return self.ops.result_context()

    def queued(self) -> None:
        pass  # prepared the same way for either thread (CUDA's caller-stream one is not)


class HostOps:
    """A synchronous "device" whose memory is host memory: every copy is done on return.

    The simplest correct ``DeviceOps``; tests build their asynchronous fakes on top of it.
    """

    copy_out_on_caller = False
    copies_in_order = False

    def ready(self) -> Fence | None:
        return None

    def order_after(self, marker: Fence) -> None:
        marker.synchronize()

    def copy_context(self) -> AbstractContextManager:
        return nullcontext()

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)

    def fence(self) -> Fence | None:
        return None

    def gate(self, done: Fence | None) -> Callable[[], None] | None:
        return None

    def result_context(self) -> Callable[[], AbstractContextManager] | None:
        return None

    def alloc_host(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)


class StagingAdapter:
    """Adapter that stages every op through a :class:`HostPool` using ``ops``."""

    def __init__(self, device_type: str, ops: DeviceOps, pool: HostPool | None = None):
        self.device_type = device_type
        self.ops = ops
        self.pool = pool if pool is not None else HostPool(ops.alloc_host)
        self.pending = PendingWrites()

    def prepare(self, tensors: Sequence[torch.Tensor], reads: Sequence[bool],
                writes: Sequence[bool], inline: bool = False) -> StagingHandoff:
        return StagingHandoff(self.ops, self.pool, tensors, reads, writes, self.pending)
