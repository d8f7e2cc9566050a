"""Non-contiguous tensors (transposed, sliced with a step, channels_last) and lazy negated or
conjugated views (``torch._neg_view``, ``x.conj().imag``): the algorithms work on the raw
bytes of flat buffers, so such a tensor is exchanged through a plain contiguous copy of its
values in logical element order, made on the comm thread in the op's turn and copied back
before the op completes. Every rank then agrees on the values whatever its memory layout."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import torch

from . import Handoff


def needs_copy(t: torch.Tensor) -> bool:
    """Are ``t``'s raw bytes not its values in order (strided, or a lazy neg/conj view)?"""
    return not t.is_contiguous() or t.is_neg() or t.is_conj()


def plain_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor of ``t``'s values (``copy_`` resolves the neg/conj bits)."""
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)


def overlaps_itself(t: torch.Tensor) -> bool:
    """Do two elements of ``t`` share memory (an expanded view)? Then a result cannot be
    written into it element by element."""
    probe = getattr(torch, "_debug_has_internal_overlap", None)
    if probe is not None:
        return probe(t) == 1  # 0: no, 1: yes, 2: too hard to tell (copy_ lets it through)
    return any(stride == 0 and size > 1 for size, stride in zip(t.shape, t.stride(),
                                                                strict=True))


class ContiguousHandoff:
    """Wraps a device hand-off whose host tensors may need a copy (``needs_copy``): ``acquire``
    hands the algorithms plain contiguous copies, ``release`` writes the results back into
    the originals."""

    __slots__ = ("inner", "reads", "writes", "_hosts", "_copies")

    def __init__(self, inner: Handoff, reads: Sequence[bool], writes: Sequence[bool]):
        self.inner = inner
        self.reads = list(reads)
        self.writes = list(writes)
        self._hosts: list[torch.Tensor] = []
        self._copies: list[torch.Tensor] = []

    def acquire(self) -> list[torch.Tensor]:
        self._hosts = self.inner.acquire()
        self._copies = [
            h if not needs_copy(h) else plain_copy(h) if r else torch.empty(h.shape, dtype=h.dtype)
            for h, r in zip(self._hosts, self.reads, strict=True)]
        return self._copies

    def release(self) -> None:
        for h, c, w in zip(self._hosts, self._copies, self.writes, strict=True):
            if w and c is not h:
                h.copy_(c)
        self._hosts, self._copies = [], []
        self.inner.release()

    def discard(self) -> None:
        self._hosts, self._copies = [], []
        self.inner.discard()

    def ready_now(self) -> bool:
        return self.inner.ready_now()

    def gate(self) -> Callable[[], None] | None:
        return self.inner.gate()

    def result_context(self) -> Callable[[], AbstractContextManager] | None:
        return self.inner.result_context()
