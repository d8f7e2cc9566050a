"""Tensors the algorithms cannot use as they are, exchanged through plain copies made on the
comm thread in the op's turn (and copied back before the op completes where they are written):

* non-contiguous tensors (transposed, sliced with a step, channels_last) and lazy negated or
  conjugated views (``torch._neg_view``, ``x.conj().imag``): the algorithms work on the raw
  bytes of flat buffers, so such a tensor goes as a contiguous copy of its values in logical
  element order, and every rank agrees on the values whatever its memory layout;
* an input that shares memory with an output of the same op other than in the one layout the
  op is written for (an all-gather's input in its own rank's slot of the output, a
  reduce-scatter's output in its own rank's part of the input): receives into the output
  would overwrite input not yet sent or reduced (``all_to_all_single(t, t)``, an all-gather
  whose input sits in another rank's slot), so the input is read from a copy;
* outputs that share memory with each other (an all-gather into ``[buf] * world``): each
  receives into its own copy, and the copies are written back in the list's order, so every
  rank ends with the last one's value, as on gloo (received in place, each rank's buffer
  would hold whichever slot its ring filled last).
"""

from __future__ import annotations

import bisect
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


def byte_span(t: torch.Tensor) -> tuple[int, int]:
    """The byte range ``t`` spans, from its first to its last element (what lies between
    counts as touched); empty for an empty tensor."""
    lo = t.data_ptr()
    if t.is_contiguous():  # the common case, and the cheap one: its bytes in a row
        return (lo, lo + t.nbytes)
    if not t.numel():
        return (lo, lo)
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return (lo, lo + t.element_size() * (1 + last))


def spans_meet(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Do two ``byte_span`` ranges intersect? (Never an empty one.)"""
    return a[0] < a[1] and b[0] < b[1] and a[0] < b[1] and b[0] < a[1]


class SpanIndex:
    """A multiset of ``byte_span`` ranges, sorted by start, that answers "does this range meet
    any?" in O(log n) (for ranges no longer than the longest held): thousands of posted
    receives each ask it about their buffer, which a scan would make quadratic."""

    def __init__(self) -> None:
        self._spans: list[tuple[int, int]] = []
        self._longest = 0  # of the spans added since the index was last empty

    def add(self, spans: Sequence[tuple[int, int]]) -> None:
        for s in spans:
            if s[0] < s[1]:
                bisect.insort(self._spans, s)
                self._longest = max(self._longest, s[1] - s[0])

    def remove(self, spans: Sequence[tuple[int, int]]) -> None:
        """Take out one of each of ``spans`` (added before)."""
        for s in spans:
            if s[0] < s[1]:
                i = bisect.bisect_left(self._spans, s)
                if i < len(self._spans) and self._spans[i] == s:
                    del self._spans[i]
        if not self._spans:
            self._longest = 0

    def meets(self, span: tuple[int, int]) -> bool:
        lo, hi = span
        if lo >= hi:
            return False
        held = self._spans
        # Only a span that starts after lo - longest can reach past lo.
        i = bisect.bisect_right(held, (lo - self._longest, hi))
        while i < len(held) and held[i][0] < hi:
            if held[i][1] > lo:
                return True
            i += 1
        return False


#: ``(a, b, offset)``: tensor ``a`` of an op may sit exactly at byte ``offset`` of tensor
#: ``b`` (both contiguous): the in-place layout the op is written for.
Placement = tuple[int, int, int]


def clashing_inputs(tensors: Sequence[torch.Tensor], reads: Sequence[bool],
                    writes: Sequence[bool], placements: Sequence[Placement] = ()) -> list[int]:
    """Indices of the inputs (read, not written) that share memory with a written tensor
    other than as one of ``placements`` says: the algorithms must read those from a copy."""
    def placed(i: int, j: int) -> bool:
        for a, b, off in placements:
            if {a, b} == {i, j}:
                ta, tb = tensors[a], tensors[b]
                return (ta.is_contiguous() and tb.is_contiguous()
                        and ta.data_ptr() == tb.data_ptr() + off)
        return False

    inputs = [i for i in range(len(tensors)) if reads[i] and not writes[i]]
    outputs = [j for j in range(len(tensors)) if writes[j]]
    if not inputs or not outputs:
        return []
    # every op checks this on submission: each tensor's span once, then pairs of tuples
    span = {k: byte_span(tensors[k]) for k in inputs + outputs}
    return [i for i in inputs if any(spans_meet(span[i], span[j]) and not placed(i, j)
                                     for j in outputs)]


def clashing_outputs(tensors: Sequence[torch.Tensor], writes: Sequence[bool]) -> list[int]:
    """Indices of the written tensors whose memory meets another written tensor's: each
    must receive into a copy of its own."""
    outputs = [j for j in range(len(tensors)) if writes[j]]
    if len(outputs) < 2:
        return []
    spans = sorted((byte_span(tensors[j]), j) for j in outputs)
    clash: list[int] = []
    group: list[int] = []
    end = 0
    for (lo, hi), j in spans:
        if lo >= hi:  # empty: meets nothing
            continue
        if group and lo < end:
            group.append(j)
        else:
            if len(group) > 1:
                clash += group
            group = [j]
            end = 0
        end = max(end, hi)
    if len(group) > 1:
        clash += group
    return sorted(clash)


def overlaps_itself(t: torch.Tensor) -> bool:
    """Do two elements of ``t`` share memory (an expanded view)? Then a result cannot be
    written into it element by element."""
    probe = getattr(torch, "_debug_has_internal_overlap", None)
    if probe is not None:
        return probe(t) == 1  # 0: no, 1: yes, 2: too hard to tell (copy_ lets it through)
    return any(stride == 0 and size > 1 for size, stride in zip(t.shape, t.stride(),
                                                                strict=True))


class ContiguousHandoff:
    """Wraps a device hand-off whose host tensors may need a copy (``needs_copy``, or a tensor
    that ``clashing_inputs`` or ``clashing_outputs`` names): ``acquire`` hands the algorithms
    plain contiguous copies, ``release`` writes the results back into the originals, in
    order."""

    __slots__ = ("inner", "reads", "writes", "placements", "_hosts", "_copies")

    def __init__(self, inner: Handoff, reads: Sequence[bool], writes: Sequence[bool],
                 placements: Sequence[Placement] = ()):
        self.inner = inner
        self.reads = list(reads)
        self.writes = list(writes)
        self.placements = tuple(placements)
        self._hosts: list[torch.Tensor] = []
        self._copies: list[torch.Tensor] = []

    def acquire(self) -> list[torch.Tensor]:
        # The host tensors decide: a staged hand-off's host buffers share no memory, a CPU or
        # unified one's are the caller's tensors.
        self._hosts = hosts = self.inner.acquire()
        clash = set(clashing_inputs(hosts, self.reads, self.writes, self.placements))
        clash.update(clashing_outputs(hosts, self.writes))
        self._copies = [
            h if not (needs_copy(h) or i in clash) else plain_copy(h) if r
            else torch.empty(h.shape, dtype=h.dtype)
            for i, (h, r) in enumerate(zip(hosts, self.reads, strict=True))]
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

    def queued(self) -> None:
        self.inner.queued()
