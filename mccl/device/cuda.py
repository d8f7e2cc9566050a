"""CUDA tensors: staged through pinned host buffers on a side stream owned by the adapter.

Why CUDA at all: it is the stand-in accelerator that CI-less development can measure the
hand-off on (an H200 here), and the same staging logic serves MPS without the shared alias.

* ``prepare`` (caller's thread): a CUDA event recorded on the caller's current stream, right
  after the kernels that produced the tensors (O1); ``record_stream`` tells the caching
  allocator the side stream uses the tensors.
* comm thread: the side stream waits for that event on the GPU (never the device), then
  device -> pinned host copies on the side stream; the comm thread sleeps on the producer's
  event if it has not passed and then waits for the copies' completion event (which spins:
  copies are short, and waking from a sleeping wait cost about 0.1 ms), ring on the host
  copies, host -> device copies on the side stream, completion event; it never enqueues on
  the caller's stream (O3). A
  blocking op (``async_op=False``) runs these steps on the caller's thread instead when the
  group is idle, as on CPU (same side stream). A large all-reduce, flat all-gather or flat
  reduce-scatter copies its large tensors piece by piece (``StagingHandoff.pipeline``,
  ``ring.copy_plan``; of the gather and scatter, also the tensor holding this rank's segment):
  copies out enqueued in the order the ring needs them, a bounded distance ahead, with an
  event each; the ring waits on a piece's event just before it first reads it and enqueues
  its copy back once it is final.
* ``Work.wait()`` makes the waiter's current stream wait on the completion event, and the
  Future is completed inside the side stream's context so ``Future(devices=[dev])`` records
  its own event there: ``fut.wait()``/``then`` (DDP's reducer) sync the same way. Neither
  blocks the CPU on the copy back (O2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, contextmanager

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
        self.side.wait_event(marker)  # type: ignore[arg-type]

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

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
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

    def alloc_host(self, nbytes: int) -> torch.Tensor:
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


class CudaAdapter:
    """One per process group and CUDA device: owns the side stream and the pinned pool."""

    device_type = "cuda"

    def __init__(self, device: torch.device, pool: HostPool | None = None):
        self.ops = CudaOps(device)
        self.pool = pool if pool is not None else HostPool(self.ops.alloc_host)

    def prepare(self, tensors: Sequence[torch.Tensor], reads: Sequence[bool],
                writes: Sequence[bool]) -> StagingHandoff:
        side = self.ops.side  # created on the caller's thread, before the comm thread uses it
        for t in tensors:
            if t.numel():
                t.record_stream(side)
        return StagingHandoff(self.ops, self.pool, tensors, reads, writes)
