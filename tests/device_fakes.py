"""Fakes of an asynchronous device for the hand-off tests (CPU only, no accelerator).

A ``FakeStream`` is a worker thread running queued closures in order, like a device stream;
``FakeEvent`` is a marker on it. ``FakeAsyncOps`` is a ``DeviceOps`` whose copies really are
asynchronous, so a missing wait shows up as wrong numbers rather than passing by luck.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

import torch

from mccl.device.staging import HostOps, HostPool, StagingAdapter


class FakeStream:
    def __init__(self, name: str):
        self.name = name
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._t = threading.Thread(target=self._loop, name=f"fake-{name}", daemon=True)
        self._t.start()

    def _loop(self) -> None:
        while True:
            fn = self._q.get()
            fn()

    def enqueue(self, fn: Callable[[], None]) -> None:
        self._q.put(fn)

    def wait_event(self, ev: FakeEvent) -> None:
        self.enqueue(ev.synchronize)

    def synchronize(self) -> None:
        ev = FakeEvent()
        ev.record(self)
        ev.synchronize()


class FakeEvent:
    def __init__(self) -> None:
        self._done = threading.Event()
        self.recorded = False
        self.syncs = 0
        self.sync_threads: list[str] = []

    def record(self, stream: FakeStream) -> None:
        self.recorded = True
        stream.enqueue(self._done.set)

    def synchronize(self) -> None:
        self.syncs += 1
        self.sync_threads.append(threading.current_thread().name)
        if not self._done.wait(30):
            raise TimeoutError("fake event never passed")

    def query(self) -> bool:
        return self._done.is_set()


def slow_fill(stream: FakeStream, t: torch.Tensor, value: float, delay: float = 0.05) -> None:
    """A "kernel" that writes t some time after it was enqueued."""

    def run() -> None:
        time.sleep(delay)
        t.fill_(value)

    stream.enqueue(run)


class FakeAsyncOps(HostOps):
    """Device ops on fake streams: ``current`` is the caller's stream, ``side`` the adapter's.

    With ``copy_out_on_caller`` it models a one-stream device (MPS): copies go on ``current``,
    in order with the producer's kernels. With ``stream_ordered`` the side stream waits for
    the producer's marker itself (CUDA's ``order_after``) instead of the comm thread; with
    ``copies_in_order`` the hand-off relies on the one copy stream's order to reuse pooled
    host buffers (CUDA's ``copies_in_order``).
    """

    def __init__(self, copy_out_on_caller: bool = False, copy_delay: float = 0.0,
                 stream_ordered: bool = False, copies_in_order: bool = False):
        self.copy_out_on_caller = copy_out_on_caller
        self.stream_ordered = stream_ordered
        self.copies_in_order = copies_in_order  # True as CUDA: the pool skips its fence wait
        self.current = FakeStream("current")
        self.side = FakeStream("side")
        self.copy_stream = self.current if copy_out_on_caller else self.side
        self.copy_delay = copy_delay
        self.copies: list[tuple[str, str]] = []  # (direction, thread name)
        self.ready_events: list[FakeEvent] = []
        self.fences: list[FakeEvent] = []
        self.host_allocs = 0
        self.result_ctx_used = 0
        self.host_ptrs: set[int] = set()
        self._in_ctx = threading.local()

    def ready(self) -> FakeEvent:
        ev = FakeEvent()
        ev.record(self.current)
        self.ready_events.append(ev)
        return ev

    def order_after(self, marker: FakeEvent) -> None:  # type: ignore[override]
        if self.stream_ordered:
            self.side.wait_event(marker)
        else:
            marker.synchronize()

    @contextmanager
    def _ctx(self):
        self._in_ctx.on = True
        try:
            yield
        finally:
            self._in_ctx.on = False

    def copy_context(self):
        return self._ctx()

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        assert getattr(self._in_ctx, "on", False), "copy outside the side-stream context"
        direction = "out" if dst.untyped_storage().data_ptr() in self.host_ptrs else "back"
        self.copies.append((direction, threading.current_thread().name))
        delay = self.copy_delay

        def run() -> None:
            if delay:
                time.sleep(delay)
            dst.copy_(src)

        self.copy_stream.enqueue(run)

    def fence(self) -> FakeEvent:
        ev = FakeEvent()
        ev.record(self.copy_stream)
        self.fences.append(ev)
        return ev

    def gate(self, done):
        if done is None:
            return None
        return lambda: self.current.wait_event(done)

    def result_context(self):
        def ctx():
            self.result_ctx_used += 1
            return self._ctx()

        return ctx

    def alloc_host(self, nbytes: int) -> torch.Tensor:
        self.host_allocs += 1
        buf = torch.empty(nbytes, dtype=torch.uint8)
        self.host_ptrs.add(buf.untyped_storage().data_ptr())
        return buf


def fake_staging_adapter(copy_out_on_caller: bool = False, cuda_like: bool = False,
                         ) -> StagingAdapter:
    """``cuda_like``: the side stream waits for the producer's marker and every copy runs in
    order on it, so pooled buffers are reused without a fence (``CudaOps``)."""
    ops = FakeAsyncOps(copy_out_on_caller=copy_out_on_caller, copy_delay=0.002,
                       stream_ordered=cuda_like, copies_in_order=cuda_like)
    return StagingAdapter("cpu", ops, HostPool(ops.alloc_host))


def install_fake_staging(copy_out_on_caller: bool = False,
                         cuda_like: bool = False) -> StagingAdapter:
    """In a rank process: route every op of new adapters through one fake staging adapter."""
    import mccl.process_group as pg

    adapter = fake_staging_adapter(copy_out_on_caller, cuda_like)
    pg.adapter_for = lambda device, unified=True: adapter
    return adapter


class FakeMpsEvent:
    """Stands in for ``torch.mps.Event``: recorded on the caller, synchronized by the comm
    thread; records which threads did what."""

    instances: list[FakeMpsEvent] = []

    def __init__(self, enable_timing: bool = False) -> None:
        self.record_threads: list[str] = []
        self.sync_threads: list[str] = []
        FakeMpsEvent.instances.append(self)

    def record(self) -> None:
        self.record_threads.append(threading.current_thread().name)

    def synchronize(self) -> None:
        if not self.record_threads:
            raise RuntimeError("synchronize before record")
        self.sync_threads.append(threading.current_thread().name)

    def query(self) -> bool:
        return bool(self.record_threads)  # the fake's "kernels" are done once recorded


def fake_alias(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """Stands in for ``torch.mps._host_alias_storage`` on CPU storages: the same bytes."""
    if storage.device.type != "cpu":
        raise RuntimeError("fake alias only serves CPU storages")
    return storage


def install_fake_mps(alias: bool = True) -> None:
    """Patch torch.mps with the fakes (inside a test process or a rank process)."""
    torch.mps.Event = FakeMpsEvent  # type: ignore[misc,assignment]
    if alias:
        torch.mps._host_alias_storage = fake_alias  # type: ignore[attr-defined]
    elif hasattr(torch.mps, "_host_alias_storage"):
        delattr(torch.mps, "_host_alias_storage")
