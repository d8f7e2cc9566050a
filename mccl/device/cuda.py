"""CUDA tensors: staged through pinned host buffers on a side stream owned by the adapter.

Why CUDA at all: it is the stand-in accelerator that CI-less development can measure the hand-off on
(an H200 here), and the same staging logic serves MPS without the shared alias.

* ``prepare`` (caller's thread): a CUDA event recorded on the caller's current stream, right after
  the kernels that produced the tensors (O1); ``record_stream`` tells the caching allocator the side
  stream uses the tensors.
* comm thread: the side stream waits for that event on the GPU (never the device), then device ->
  pinned host copies on the side stream; the comm thread sleeps on the producer's event if it has
  not passed and then waits for the copies' completion event (which spins: copies are short, and
  waking from a sleeping wait cost about 0.1 ms), ring on the host copies, host -> device copies on
  the side stream, completion event; it never enqueues on the caller's stream (O3). A blocking op
  (``async_op=False``) runs on the caller's thread instead when the group is idle, as on CPU, and
  copies on that thread's stream (below). A large all-reduce, flat all-gather or flat reduce-scatter
  copies its large tensors piece by piece (``StagingHandoff.pipeline``, ``ring.copy_plan``; of the
  gather and scatter, also the tensor holding this rank's segment): copies out enqueued in the order
  the ring needs them, a bounded distance ahead, with an event each; the ring waits on a piece's
  event just before it first reads it and enqueues its copy back once it is final.
* ``Work.wait()`` makes the waiter's current stream wait on the completion event, and the Future is
  completed inside the side stream's context so ``Future(devices=[dev])`` records its own event
  there: ``fut.wait()``/``then`` (DDP's reducer) sync the same way. Neither blocks the CPU on the
  copy back (O2).

A blocking op that the engine runs on the caller's thread (the group idle: ``inline``) skips the
side stream: its copies go on the caller's current stream, where stream order alone puts the copy
out after the producer's kernels (O1) and the copy back before the consumer's (O2). That saves the
marker, the cross-stream waits, the gate and the side stream's context: 64-92 us of a 1 MB
op's 230-310 on 1-8 ranks sharing an H100 (``benchmarks/handoff_cost.py``, ``direct`` against
``staged``, call s60a). The caller's thread is PyTorch's own, so O3 holds. The two streams meet
where ops of the group follow each other across them: such an op's copies first wait for what the
side stream still has to do, and the side stream waits for the last one's copy back before the next
queued op's copies (``CudaOps.order_after``), so every copy keeps the group's issue order, as on one
stream. Should the engine queue the op after all (another op got there first), ``queued`` turns it
into the side-stream hand-off on the caller's thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch

from .staging import Fence, HostPool, StagingHandoff


class CudaOps:
    """The CUDA half of the staging hand-off (see :mod:`mccl.device.staging`)."""

    copy_out_on_caller = False
    copies_in_order = True  # every copy goes on the adapter's one side stream

    def __init__(self, device: torch.device):
        self.device = torch.device("cuda", device.index if device.index is not None
                                   else torch.cuda.current_device())
        self._side: torch.cuda.Stream | None = None
        #: The copy back of the last op run on a caller's stream (``CallerStreamHandoff``):
        #: the side stream's next copies wait for it (the group's issue order).
        self.after_caller: torch.cuda.Event | None = None

    @property
    def side(self) -> torch.cuda.Stream:
        if self._side is None:
            self._side = torch.cuda.Stream(device=self.device)
        return self._side

    def ready(self) -> Fence:
        ev = torch.cuda.Event(blocking=True)
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def order_after(self, marker: Fence) -> None:
        # The side stream waits on the GPU: the copies can be enqueued at once, and the one
        # wait left on the CPU is for the copy out (O1 without a sleep on the producer).
        side = self.side
        side.wait_event(marker)  # type: ignore[arg-type]
        last = self.after_caller  # (another thread's caller stream need not be behind it)
        if last is not None:
            side.wait_event(last)
            # Once waited for, stream order carries it to every later copy on the side
            # stream. (Ops run one at a time, so the write in ``release`` cannot interleave.)
            self.after_caller = None

    def busy(self) -> bool:
        """Has the side stream work enqueued that has not finished? (Never blocks.)"""
        return self._side is not None and not self._side.query()

    def _on_side(self) -> AbstractContextManager:
        """The side stream made current: a ranged op enters this a few times per
        piece on the comm thread, and every op that completes a Future once. torch's two
        context managers cost ~20 us a time on an H200, a plain switch of the stream ~5 us,
        where the thread is already on the adapter's device (the usual case)."""
        if torch.cuda.current_device() == self.device.index:
            return _SideStream(self.side, self.device)
        return self._on_other_device()

    @contextmanager
    def _on_other_device(self):
        with torch.cuda.device(self.device), torch.cuda.stream(self.side):
            yield

    def copy_context(self) -> AbstractContextManager:
        return self._on_side()

    @staticmethod
    def copy(dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)

    def fence(self) -> Fence:
        # Not a blocking-sync event: waiting for a copy spins in the driver (GIL released)
        # instead of sleeping until an interrupt wakes the thread; with 8 ranks on the H200 a
        # 4 MB all-reduce's body started 0.13 ms sooner (benchmarks/oppath.py, twelfth
        # session, call A). The hand-off sleeps on the producer's marker (``ready``,
        # blocking) before it waits on a copy, so it spins only for copies, which are short.
        ev = torch.cuda.Event()
        ev.record(self.side)
        return ev

    def gate(self, done: Fence | None) -> Callable[[], None] | None:
        if done is None:
            return None
        device = self.device

        def wait_on_done() -> None:
            torch.cuda.current_stream(device).wait_event(done)  # type: ignore[arg-type]

        return wait_on_done

    def result_context(self) -> Callable[[], AbstractContextManager] | None:
        return self._on_side

    @staticmethod
    def alloc_host(nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


class _SideStream:
    """Make ``side`` the current stream of its device, the current one, and restore the
    stream that was current (``torch.cuda.stream`` without its checks for another device)."""

    __slots__ = ("side", "device", "prev")

    def __init__(self, side: torch.cuda.Stream, device: torch.device):
        self.side = side
        self.device = device
        self.prev: torch.cuda.Stream | None = None

    def __enter__(self) -> None:
        self.prev = torch.cuda.current_stream(self.device)
        torch.cuda.set_stream(self.side)

    def __exit__(self, *exc: object) -> None:
        assert self.prev is not None
        torch.cuda.set_stream(self.prev)
        self.prev = None


class CallerStreamOps:
    """The copies of an op run on the caller's thread, on its current stream (see the module
    docstring): no marker, no gate, no Future context; fences are recorded on that stream."""

    copy_out_on_caller = False
    # Ops of other threads copy on the side stream, not behind these: a pooled buffer waits
    # for the copy back that reads it before it is reused.
    copies_in_order = False
    copy = staticmethod(CudaOps.copy)
    alloc_host = staticmethod(CudaOps.alloc_host)

    def __init__(self, side_ops: CudaOps):
        self.device = side_ops.device
        self.side_ops = side_ops

    def ready(self) -> Fence | None:
        return None  # stream order: the copies follow the producer's kernels (O1)

    def order_after(self, marker: Fence) -> None:  # (never called: no marker)
        marker.synchronize()

    def after_side(self) -> None:
        """Order this op's copies after the side stream's (earlier ops' copies back, and
        their reads of pooled buffers this op may reuse); free while it is idle."""
        if self.side_ops.busy():
            torch.cuda.current_stream(self.device).wait_stream(self.side_ops.side)

    def copy_context(self) -> AbstractContextManager:
        return _CURRENT_STREAM

    def fence(self) -> Fence:
        ev = torch.cuda.Event()  # spins when waited on, as the side stream's (``CudaOps``)
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def gate(self, done: Fence | None) -> Callable[[], None] | None:
        # The copy back is on the caller's stream: the consumer's kernels, enqueued after the
        # blocking call returns, follow it (O2), as after a blocking NCCL call.
        return None

    def result_context(self) -> Callable[[], AbstractContextManager] | None:
        return None  # the Future, if asked for, is completed on this thread and stream


_CURRENT_STREAM = nullcontext()


class CallerStreamHandoff(StagingHandoff):
    """A blocking op's hand-off, made for the caller's thread (``CallerStreamOps``);
    ``queued`` makes it the side-stream hand-off if the engine queues the op instead."""

    def __init__(self, adapter: CudaAdapter, tensors: Sequence[torch.Tensor],
                 reads: Sequence[bool], writes: Sequence[bool]):
        super().__init__(adapter.caller_ops, adapter.pool, tensors, reads, writes)
        self._adapter = adapter
        # A tensor made on another stream and freed once the call returns must not be handed
        # out again before this stream's copy back has run (a no-op for a tensor made here).
        live = [t for t in self.tensors if t.numel()]
        if live:
            current = torch.cuda.current_stream(adapter.ops.device)
            for t in live:
                t.record_stream(current)

    @property
    def on_callers_stream(self) -> bool:
        """Not (yet) turned into the side-stream hand-off by ``queued``."""
        return self.ops is not self._adapter.ops

    def queued(self) -> None:
        if not self.on_callers_stream:
            return
        ops = self.ops = self._adapter.ops
        self._adapter.use_on_side(self.tensors)
        self._ready = ops.ready()

    def acquire(self) -> list[torch.Tensor]:
        if self.on_callers_stream:
            self._adapter.caller_ops.after_side()
        return super().acquire()

    def release(self) -> None:
        super().release()
        if self.on_callers_stream and self._done is not None:
            self._adapter.ops.after_caller = self._done  # type: ignore[assignment]


class CudaAdapter:
    """One per process group and CUDA device: owns the side stream and the pinned pool."""

    device_type = "cuda"

    def __init__(self, device: torch.device, pool: HostPool | None = None):
        self.ops = CudaOps(device)
        self.caller_ops = CallerStreamOps(self.ops)
        self.pool = pool if pool is not None else HostPool(self.ops.alloc_host)

    def prepare(self, tensors: Sequence[torch.Tensor], reads: Sequence[bool],
                writes: Sequence[bool], inline: bool = False) -> StagingHandoff:
        """``inline``: the op is blocking and the engine may run it on this thread (it then
        copies on this thread's stream; ``queued`` if the engine queues it instead)."""
        if inline:
            return CallerStreamHandoff(self, tensors, reads, writes)
        self.use_on_side(tensors)
        return StagingHandoff(self.ops, self.pool, tensors, reads, writes)

    def use_on_side(self, tensors: Sequence[torch.Tensor]) -> None:
        """Tell the caching allocator the side stream uses ``tensors`` (made here, on the
        caller's thread, before the comm thread uses it)."""
        side = self.ops.side
        for t in tensors:
            if t.numel():
                t.record_stream(side)
