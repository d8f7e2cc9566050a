"""The one narrow interface every algorithm talks through, and shared index arithmetic."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

#: ``reduce(a, b, out=None)``: ``out = a (op) b`` element-wise; in place into ``a`` by default.
Reducer = Callable[..., None]
Finisher = Callable[[np.ndarray], None] | None

#: Bounds on the chunk size chosen for a segment. The cap depends on where the bottleneck is,
#: agreed per group (``chunk_cap``). Where every rank has cores to spare, the link is the
#: bottleneck and chunks are at most 256 KiB: with 1 MiB chunks a ring lost about one to two
#: chunk times per op on emulated 10 Gbit links (all-reduce 95-99 % of the ceiling at
#: 16-256 MB); 256 KiB chunks read 98.5-99.8 % on 4 and 8 hosts (16 cores, 2-4 per rank),
#: and a bare Python ring (benchmarks/bare_ring.py) behaved the same, gaining partly from
#: smaller writes and partly from smaller receives (thirteenth session,
#: benchmarks/results/h200/call_s13a-c). Each chunk costs the ranks CPU (receives, a reduce
#: call, a hand-off to the sender thread, its write: tens of microseconds), so where ranks
#: share few cores the CPU is the bottleneck and 1 MiB chunks are kept: 4 ranks on 2 cores,
#: unshaped links, moved 1.2x the bytes per second with them (two A/B pairs). The floor is
#: set by the thread that forwards chunks: a 64 KiB chunk is 52 us at 10 Gbit/s, but
#: receiving, reducing and writing it (small writes go inline, see
#: ``mesh.INLINE_MAX_BYTES``) took that thread about 80 us, so 1-2 MB ops ran at the thread's
#: pace; from 128 KiB the writes go to the sender thread (eleventh session,
#: benchmarks/results/h200/call_s11a).
MIN_CHUNK_BYTES = 128 << 10
MAX_CHUNK_BYTES = 256 << 10
#: The cap where ranks have fewer than ``MIN_CORES_PER_RANK`` cores each.
CPU_BOUND_CHUNK_BYTES = 1 << 20
#: Cores per rank from which the link, not the CPU, is taken to be the bottleneck (the
#: emulated 10 Gbit hosts measured had 2-4 per rank, the 2-core machine 0.5).
MIN_CORES_PER_RANK = 2
#: Chunks a segment is cut into between those bounds: at least two, so one is on the wire
#: while the previous one is reduced.
CHUNKS_PER_SEGMENT = 4


class Channel(Protocol):
    """Ordered, reliable messages between the ranks of one group, for one op.

    ``send`` may return before the bytes left: the buffer must then stay unchanged until
    ``flush``; it returns True when the buffer may be reused at once (small sends are copied
    or written inline). ``recv`` blocks until ``buf`` is exactly filled with the next message
    from ``peer``.
    """

    rank: int
    size: int
    #: The group's chunk cap (``chunk_cap``), the same on every rank.
    chunk_cap: int

    def send(self, peer: int, buf: np.ndarray) -> bool: ...

    def recv(self, peer: int, buf: np.ndarray) -> None: ...

    def flush(self) -> None: ...

    def sends_done(self) -> None:
        """The op will only receive from here on (its sends are all queued): the engine may
        queue the next op's first sends behind them."""
        ...

    def mark(self) -> object:
        """A token for every send queued so far."""
        ...

    def wait(self, token: object) -> None:
        """Block until the sends before ``mark`` no longer read their buffers."""
        ...

    def ticket(self, peer: int) -> int:
        """A number for the sends to ``peer`` queued so far; cheaper than ``mark`` (it
        queues nothing), for a check once per chunk."""
        ...

    def passed(self, peer: int, ticket: int) -> bool:
        """Without blocking: do the sends before ``ticket`` no longer read their buffers?"""
        ...


def split(n: int, parts: int) -> list[int]:
    """Offsets of ``parts`` nearly equal pieces of ``n`` (sizes differ by at most one)."""
    q, r = divmod(n, parts)
    offs = [0]
    for i in range(parts):
        offs.append(offs[-1] + q + (1 if i < r else 0))
    return offs


def chunk_cap(cores_per_rank: float) -> int:
    """The chunk cap of a group whose ranks have at least ``cores_per_rank`` cores each (every
    rank of the group must use the same: ``rendezvous.cores_per_rank`` agrees on the value)."""
    return MAX_CHUNK_BYTES if cores_per_rank >= MIN_CORES_PER_RANK else CPU_BOUND_CHUNK_BYTES


def chunk_count(max_bytes: int, chunk_bytes: int | None = None, cap: int | None = None) -> int:
    """Chunks per segment so each is near the target size (every rank computes the same):
    ``chunk_bytes`` if given, else a quarter segment between the floor and ``cap``
    (``MAX_CHUNK_BYTES`` by default)."""
    if max_bytes <= 0:
        return 1
    target = chunk_bytes or max(MIN_CHUNK_BYTES,
                                 min(cap or MAX_CHUNK_BYTES, max_bytes // CHUNKS_PER_SEGMENT))
    return max(1, -(-max_bytes // target))


def chunks(seg: np.ndarray, k: int) -> list[np.ndarray]:
    """``k`` nearly equal, possibly empty, views of a 1-D segment."""
    offs = split(seg.shape[0], k)
    return [seg[offs[i]:offs[i + 1]] for i in range(k)]


class Scratch:
    """Reusable buffers, grown on demand (never allocated per op or per chunk).

    Slot 0 is the chunk-sized receive buffer; out-of-place reduce-scatter also uses
    segment-sized slots from 1 up for the partial sums in flight
    (``ring.REDUCE_SCATTER_SPARES``).
    """

    def __init__(self) -> None:
        self._bufs: dict[int, np.ndarray] = {}

    def get(self, like: np.ndarray, slot: int = 0) -> np.ndarray:
        return self.take(like.nbytes, like.dtype, slot)

    def take(self, nbytes: int, dtype: np.dtype, slot: int = 0) -> np.ndarray:
        buf = self._bufs.get(slot)
        if buf is None or buf.nbytes < nbytes:
            buf = np.empty(max(nbytes, 1), dtype=np.uint8)
            self._bufs[slot] = buf
        return buf[:nbytes].view(dtype)
