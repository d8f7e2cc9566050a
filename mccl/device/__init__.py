"""Hand-off adapters: how the comm thread gets at a tensor's bytes, per device type.

One protocol, three small modules (cpu, cuda, mps). ``prepare`` runs on the caller's thread
and records the ready-marker (O1); ``acquire`` and ``release`` run on the comm thread, which
waits on that marker only and never enqueues work on PyTorch's stream (O3); ``gate`` runs on
the thread that waits for the result, so the consumer sees the writes (O2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

import torch


class Handoff(Protocol):
    def acquire(self) -> list[torch.Tensor]:
        """Comm thread: wait for the ready-marker; host (CPU) tensors parallel to the inputs."""
        ...

    def release(self) -> None:
        """Comm thread: publish the host results back to the device (copy back if staged)."""
        ...

    def discard(self) -> None:
        """Comm thread: the op failed or never ran: give back what ``prepare`` and
        ``acquire`` took (host buffers, pending-write entries); no result is published."""
        ...

    def ready_now(self) -> bool:
        """Comm thread: would ``acquire`` go ahead without waiting for the producer's kernels
        (or for an earlier op)? Asked before starting an op early, never waited on."""
        ...

    def gate(self) -> Callable[[], None] | None:
        """What ``Work.wait`` runs on the waiting thread so later device work sees the result."""
        ...

    def result_context(self) -> Callable[[], AbstractContextManager] | None:
        """Context in which the comm thread completes the Future (e.g. a side stream)."""
        ...

    def queued(self) -> None:
        """Caller's thread: an op prepared ``inline`` goes to the comm thread after all."""
        ...


class Adapter(Protocol):
    device_type: str

    def prepare(self, tensors: Sequence[torch.Tensor], reads: Sequence[bool],
                writes: Sequence[bool], inline: bool = False) -> Handoff:
        """Caller's thread: record the ready-marker for ``tensors`` (O1). ``inline``: the
        op is blocking and the engine may run it on this thread (``Engine.submit``), which a
        device may prepare for differently; ``queued`` follows if the engine does not."""
        ...


def adapter_for(device: torch.device, unified: bool = True) -> Adapter:
    """The adapter for a device type; raises a clear error where mccl cannot serve it."""
    kind = device.type
    if kind == "cpu":
        from .cpu import CpuAdapter

        return CpuAdapter()
    if kind == "cuda":
        from .cuda import CudaAdapter

        return CudaAdapter(device)
    if kind == "mps":
        from .mps import MpsAdapter

        return MpsAdapter(unified=unified)
    raise ValueError(f"mccl cannot exchange tensors on device type '{kind}' (cpu, cuda, mps)")
