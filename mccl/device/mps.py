"""MPS tensors on Apple Silicon: the ring runs in place on the unified memory (default).

Unified path (torch >= 2.13, ``MCCL_UNIFIED_COLLECTIVE`` unset or 1):

* ``prepare`` (caller's thread): a CPU tensor aliasing each tensor's bytes through
  ``torch.mps._host_alias_storage(storage)`` (a CPU ``UntypedStorage`` sharing the MTLBuffer;
  it keeps the MPS storage alive), then a ``torch.mps.Event`` recorded right after the kernels
  that produced the tensors (recording commits the command buffer, so the marker can pass).
* comm thread: ``event.synchronize()`` (that marker only, O1), then the ring reads and writes
  the shared bytes directly: no copies, no MPS work from the comm thread (O3).
* ``Work.wait()`` and the Future return only once the ring has finished writing, so MPS work
  the caller encodes afterwards reads the result (O2); nothing else to do.

Staging path (``MCCL_UNIFIED_COLLECTIVE=0``, torch without the alias API, or a storage the
alias refuses, e.g. not shared): device -> host copies on the caller's thread in ``prepare``
(blocking MPS copies, so no marker is needed), ring on host buffers, host -> device copy on the
comm thread in ``release``. That copy back is the one place a comm thread enqueues MPS work:
MPS has a single stream and no side stream to use, and the copy must land before the Future
completes, because DDP's reducer waits on the Future and never calls ``Work.wait()``. (One
exception: an op that reads a tensor an op issued before it has not copied back yet is
copied out by the comm thread, after that copy back; see ``staging.PendingWrites``.)

Only the API lookups below are MPS-specific; tests replace them with fakes. This module has
not run on Apple hardware in this repository's CI.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import torch

from .staging import HostOps, HostPool, PendingWrites, StagingHandoff

log = logging.getLogger("mccl.device")

ALIAS_API = "_host_alias_storage"


def alias_api() -> Callable[[torch.UntypedStorage], torch.UntypedStorage] | None:
    """``torch.mps._host_alias_storage`` where this torch has it (>= 2.13), else None."""
    mps = getattr(torch, "mps", None)
    return getattr(mps, ALIAS_API, None) if mps is not None else None


def host_view(t: torch.Tensor,
              alias: Callable[[torch.UntypedStorage], torch.UntypedStorage]) -> torch.Tensor:
    """CPU tensor sharing t's bytes (same dtype, shape, strides, storage offset)."""
    if t.numel() == 0:
        return torch.empty(t.shape, dtype=t.dtype)  # nothing to share (and nothing to alias)
    storage = alias(t.untyped_storage())
    return torch.empty(0, dtype=t.dtype).set_(storage, t.storage_offset(), t.shape, t.stride())


def new_event():
    """A ``torch.mps.Event`` (looked up at call time so tests can substitute it)."""
    return torch.mps.Event()


class UnifiedHandoff:
    """In-place hand-off: host views of the shared storage plus one ready-marker."""

    __slots__ = ("hosts", "event")

    def __init__(self, hosts: list[torch.Tensor], event):
        self.hosts = hosts
        self.event = event

    def acquire(self) -> list[torch.Tensor]:
        self.event.synchronize()
        return self.hosts

    def release(self) -> None:
        self.hosts = []  # writes are already in the shared buffer; drop the aliases

    def discard(self) -> None:
        self.hosts = []

    def ready_now(self) -> bool:
        return bool(self.event.query())

    def gate(self) -> Callable[[], None] | None:
        return None  # Work.wait() returning is the gate: the ring has finished writing

    def result_context(self) -> Callable[[], AbstractContextManager] | None:
        return None

    def queued(self) -> None:
        pass


class MpsStagingOps(HostOps):
    """Staging for MPS: copies are blocking MPS copies; out on the caller, back on release."""

    copy_out_on_caller = True


class MpsAdapter:
    """Chooses per op between the unified (alias) and staging hand-off."""

    device_type = "mps"

    def __init__(self, unified: bool = True, pool: HostPool | None = None):
        self.alias = alias_api() if unified else None
        if unified and self.alias is None:
            log.warning("mccl: torch %s has no torch.mps.%s (needs torch >= 2.13); MPS tensors "
                        "use the staging copies", torch.__version__, ALIAS_API)
        self.ops = MpsStagingOps()
        self.pool = pool if pool is not None else HostPool(self.ops.alloc_host)
        self.pending = PendingWrites()
        self._warned = False

    @property
    def unified(self) -> bool:
        return self.alias is not None

    def prepare(self, tensors: Sequence[torch.Tensor], reads: Sequence[bool],
                writes: Sequence[bool], inline: bool = False):
        # an alias has the raw bytes: a lazy neg/conj view's values need the staging copies
        if self.alias is not None and not any(t.is_neg() or t.is_conj() for t in tensors):
            try:
                hosts = [host_view(t, self.alias) for t in tensors]
            except (RuntimeError, TypeError, ValueError) as e:
                if not self._warned:
                    log.warning("mccl: MPS storage cannot be aliased (%s); staging this op", e)
                    self._warned = True
            else:
                event = new_event()
                event.record()
                return UnifiedHandoff(hosts, event)
        return StagingHandoff(self.ops, self.pool, tensors, reads, writes, self.pending)
