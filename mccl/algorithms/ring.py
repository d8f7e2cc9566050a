"""Bandwidth-optimal ring collectives, chunked and pipelined.

Rank r sends to r+1 and receives from r-1. Every segment is split into the same number of
chunks on every rank; a chunk is forwarded as soon as it has been received (and reduced), so
the reduction of one chunk overlaps the transfer of the next and both directions of every
link stay busy. In the reduce-scatter phase rank r ends up owning the fully reduced segment r.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .base import (
    Channel,
    Finisher,
    Reducer,
    Scratch,
    chunk_count,
    chunks,
    split,
)

#: ``hook(s, j)``: chunk j of segment s has reached a point of ``all_reduce``'s schedule.
ChunkHook = Callable[[int, int], None] | None
#: A staged all-reduce copies its tensor in pieces of whole chunks, of at most this many bytes
#: and, where a segment is cut finer at its edges, of at least about this many (each piece
#: costs a copy call and a fence, ~0.1 ms of comm-thread time); see ``copy_plan``.
PIECE_MAX_BYTES = 4 << 20
PIECE_MIN_BYTES = 1 << 20
#: Segment-sized buffers ``reduce_scatter``'s partial sums rotate through: before one is
#: overwritten, the sends that read it that many steps earlier must have been written.
REDUCE_SCATTER_SPARES = 2
#: Bytes (at most ``REDUCE_SCATTER_POOL_SLOTS`` chunks) of small buffers, reused often enough
#: to stay in cache, which ``reduce_scatter`` prefers for a partial sum whenever the send that
#: last read the next one has been written. A sum written into a segment-sized buffer lands
#: in memory out of cache, and each line is read before it is written: a 256 KiB add took
#: 58-63 us that way against 32-40 us in place on the 2-core machine; on 8 emulated 10 Gbit
#: hosts reduce-scatter read 94.4-96.8 % of the link at 64-256 MB with the pool against
#: 92.2-94.9 without in the fair pairs (twenty-sixth session, call A; 93.9 against 91.1 on
#: average over three calls). Never waited for: a busy slot falls back to a spare.
REDUCE_SCATTER_POOL_BYTES = 2 << 20
REDUCE_SCATTER_POOL_SLOTS = 16
#: Chunk floor of the chain broadcast: its pipeline fills over w - 2 hops of one chunk time
#: each, so its chunks stay smaller than the ring's (``MIN_CHUNK_BYTES``); its cap is the
#: ring's (``Channel.chunk_cap``).
BROADCAST_MIN_CHUNK_BYTES = 64 << 10


def segment_chunks(n: int, w: int, itemsize: int, chunk_bytes: int | None = None,
                   cap: int | None = None) -> int:
    """Chunks per segment of ``all_reduce`` over ``n`` elements on ``w`` ranks, set by segment
    0, the largest (``copy_plan`` must cut exactly as the ring does)."""
    return chunk_count(-(-n // w) * itemsize, chunk_bytes, cap)


def first_use(i: int, w: int, r: int) -> int:
    """``all_reduce`` on rank ``r`` first touches its segments in this order (its first send,
    then each reduce-scatter step): the i-th is segment (r - 1 - i) % w. The map is its own
    inverse, so it also gives a segment's position in that order."""
    return (r - 1 - i) % w


@dataclass(frozen=True)
class CopyPlan:
    """How a staged ``all_reduce`` copies its tensor between device and host, piece by piece.

    ``ranges``: element ranges of the pieces, in the order the ring first reads them (each
    piece is whole chunks of one segment). ``cuts[s]``: the k + 1 chunk boundaries of segment
    s, as the ring cuts it. ``starts[s][j]`` is the piece that chunk j of segment s begins
    (else -1): the ring must wait for that piece's copy in before reading the chunk.
    ``ends[s][j]`` the piece it ends (else -1): the piece can be copied back once that chunk
    is final. Plans are cached and shared: never modified.
    """

    ranges: tuple[tuple[int, int], ...]
    cuts: tuple[tuple[int, ...], ...]
    starts: tuple[tuple[int, ...], ...]
    ends: tuple[tuple[int, ...], ...]


def _runs(k: int, cap: int, head: bool, tail: bool, least: int = 1) -> list[int]:
    """Chunk counts of a segment's pieces: ``cap`` chunks each, except that they grow m, m,
    2m, 4m... (m = ``least``) from the start (``head``: the segment sent first, whose first
    send waits for only the first piece's copy) and shrink to m at the end (``tail``: the
    segment that is final last, whose last copy back is that small)."""
    front: list[int] = []
    back: list[int] = []
    left = k
    growth: list[int] = []  # m, m, 2m, 4m, ... below cap
    size = max(1, least)
    while size < cap:
        growth.append(size)
        if len(growth) > 1:
            size *= 2
    for size in growth:
        for grow, runs in ((head, front), (tail, back)):
            if grow and left:
                runs.append(min(size, left))
                left -= runs[-1]
    middle = [cap] * (left // cap) + ([left % cap] if left % cap else [])
    return front + middle + back[::-1]


def copy_plan(n: int, w: int, r: int, itemsize: int,
              chunk_bytes: int | None = None, cap: int | None = None,
              own: bool = False) -> CopyPlan:
    """The pieces a staged ``all_reduce`` of ``n`` elements of ``itemsize`` bytes (the dtype
    the ring runs in) copies on rank ``r``: every rank derives the same chunks as the ring.

    Why pieces: copies run on a device that other ranks share. Enqueuing whole segments made
    the first send wait for a whole segment's copy behind every rank's other copies; small
    pieces at both edges and a bounded lookahead (``StagingHandoff``) keep only a piece of
    about ``PIECE_MIN_BYTES`` on the critical path at the op's start and end. Built once per
    shape (DDP's buckets repeat every step) for the caller's and the comm thread. ``cap``: the
    group's chunk cap (``Channel.chunk_cap``).

    ``own``: the pieces of segment r alone, counted from its start, small at both edges: for
    a tensor that holds just that segment, a staged flat all-gather's input (sent first) or
    reduce-scatter's output (final last); the other segments have no pieces."""
    k = segment_chunks(n, w, itemsize, chunk_bytes, cap)
    seg_bytes = -(-n // w) * itemsize  # segment 0, the largest
    return _plan(n, w, r, k, max(1, -(-seg_bytes // k)), PIECE_MIN_BYTES, PIECE_MAX_BYTES,
                 own)


@functools.lru_cache(maxsize=256)
def _plan(n: int, w: int, r: int, k: int, chunk: int, least_bytes: int,
          most_bytes: int, own: bool) -> CopyPlan:
    offs = split(n, w)
    cap = max(1, most_bytes // chunk)
    least = -(-least_bytes // chunk)
    ranges: list[tuple[int, int]] = []
    cuts = [tuple(offs[s] + c for c in split(offs[s + 1] - offs[s], k)) for s in range(w)]
    starts = [[-1] * k for _ in range(w)]
    ends = [[-1] * k for _ in range(w)]
    # (segment, small head, small tail) in the order the pieces are first needed
    segs = [r] if own else [first_use(i, w, r) for i in range(w)]
    order = [(s, own or i == 0, own or s == (r + 1) % w) for i, s in enumerate(segs)]
    base = offs[r] if own else 0
    for s, head, tail in order:
        j = 0
        for run in _runs(k, cap, head=head, tail=tail, least=least):
            starts[s][j] = ends[s][j + run - 1] = len(ranges)
            ranges.append((cuts[s][j] - base, cuts[s][j + run] - base))
            j += run
    return CopyPlan(tuple(ranges), tuple(cuts), tuple(map(tuple, starts)),
                    tuple(map(tuple, ends)))


def all_reduce_start(ch: Channel, buf: np.ndarray, chunk_bytes: int | None = None,
                     ready: ChunkHook = None) -> None:
    """The first sends of ``all_reduce``: this rank's segment r - 1, read as it is. They need
    nothing from a peer, so the engine may issue them while the op before still receives
    (``Channel.sends_done``); ``all_reduce(..., started=True)`` then does the rest."""
    w, r = ch.size, ch.rank
    if w == 1:
        return
    offs = split(buf.shape[0], w)
    prv = (r - 1) % w
    k = segment_chunks(buf.shape[0], w, buf.itemsize, chunk_bytes, ch.chunk_cap)
    for j, c in enumerate(chunks(buf[offs[prv]:offs[prv + 1]], k)):
        if ready is not None:
            ready(prv, j)
        if c.size:
            ch.send((r + 1) % w, c)


def all_reduce(ch: Channel, buf: np.ndarray, reduce: Reducer, finish: Finisher,
               scratch: Scratch, chunk_bytes: int | None = None,
               ready: ChunkHook = None, final: ChunkHook = None, started: bool = False,
               gather: bool = True) -> None:
    """In-place all-reduce of a flat buffer: reduce-scatter then all-gather, one pipeline.

    ``ready(s, j)`` is called before chunk j of segment s is first read, ``final(s, j)`` once
    it holds the result (a staged hand-off copies pieces in and out there, overlapping the
    exchange; ``copy_plan``). Both are called for every chunk, empty ones included.
    ``started``: ``all_reduce_start`` already sent the first segment (with the same
    ``chunk_bytes`` and ``ready``). Before its last step, which only receives, it tells the
    channel that its sends are done. ``gather=False`` stops after the reduce-scatter: rank r
    then holds the reduced segment r (``finish`` applied), the other segments partial sums.
    """
    w, r = ch.size, ch.rank
    if w == 1:
        if finish is not None:
            finish(buf)
        return
    offs = split(buf.shape[0], w)
    nxt, prv = (r + 1) % w, (r - 1) % w
    k = segment_chunks(buf.shape[0], w, buf.itemsize, chunk_bytes, ch.chunk_cap)
    pieces: dict[int, list[np.ndarray]] = {}

    def cut(seg: int) -> list[np.ndarray]:
        """A segment's chunk views, made when first needed: the first send goes out before
        the other segments are cut (that work then overlaps the transfer)."""
        p = pieces.get(seg)
        if p is None:
            p = pieces[seg] = chunks(buf[offs[seg]:offs[seg + 1]], k)
        return p

    if not started:
        all_reduce_start(ch, buf, chunk_bytes, ready)
    # (segment received at this step, reduce it?) in schedule order
    steps = [((r - s - 2) % w, True) for s in range(w - 1)]
    if gather:
        steps += [((r - s - 1) % w, False) for s in range(w - 1)]
    last_reduce, last = w - 2, len(steps) - 1
    for i, (seg, red) in enumerate(steps):
        if i == last:
            ch.sends_done()
        done = i >= last_reduce and final is not None  # chunks final here: reduced or received
        for j, c in enumerate(cut(seg)):
            if red and ready is not None:
                ready(seg, j)
            if c.size:
                if red:
                    tmp = scratch.get(c)
                    ch.recv(prv, tmp)
                    reduce(c, tmp)
                    if i == last_reduce and finish is not None:
                        finish(c)
                else:
                    ch.recv(prv, c)
                if i < last:
                    ch.send(nxt, c)
            if done:
                final(seg, j)
    ch.flush()


def reduce_scatter_start(ch: Channel, src: list[np.ndarray],
                         chunk_bytes: int | None = None, ready: ChunkHook = None) -> None:
    """The first sends of ``reduce_scatter``: input segment r - 1, read as it is (see
    ``all_reduce_start``)."""
    w, r = ch.size, ch.rank
    if w == 1:
        return
    k = chunk_count(max(s.nbytes for s in src), chunk_bytes, ch.chunk_cap)
    prv = (r - 1) % w
    for j, c in enumerate(chunks(src[prv], k)):
        if ready is not None:
            ready(prv, j)
        if c.size:
            ch.send((r + 1) % w, c)


def reduce_scatter(ch: Channel, src: list[np.ndarray], out: np.ndarray, reduce: Reducer,
                   finish: Finisher, scratch: Scratch, chunk_bytes: int | None = None,
                   started: bool = False, ends_op: bool = True, ready: ChunkHook = None,
                   final: ChunkHook = None) -> None:
    """Out of place: ``out`` = reduction over ranks of their ``src[rank]``; ``src`` unchanged.
    ``ready(s, j)`` is called before chunk j of ``src[s]`` is read (every chunk, empty ones
    included; a staged hand-off copies the input in there, see ``all_reduce``), ``final(rank,
    j)`` once chunk j of ``out`` holds its result (every chunk, in order; a staged hand-off
    copies it back).

    A partial sum goes into a pool slot (``REDUCE_SCATTER_POOL_BYTES``) whose last send was
    written, else into one of ``REDUCE_SCATTER_SPARES`` segment-sized buffers, used in turn:
    before one is overwritten, the sends that read it that many steps earlier are waited
    for. (A pool alone, waited for, deadlocks: every rank starts by sending a whole segment,
    so a ring holds w segments in flight.) ``started``: ``reduce_scatter_start`` already sent
    the first segment. ``ends_op``: nothing is sent after this call in the op, so it tells
    the channel before its last step (which only receives) that its sends are done.
    """
    w, r = ch.size, ch.rank
    if w == 1:
        out[...] = src[0]
        if finish is not None:
            finish(out)
        return
    nxt, prv = (r + 1) % w, (r - 1) % w
    k = chunk_count(max(s.nbytes for s in src), chunk_bytes, ch.chunk_cap)
    longest = max(s.shape[0] for s in src)
    n_spare = min(REDUCE_SCATTER_SPARES, max(1, w - 2))  # partial sums of w - 2 steps
    spare = [scratch.take(longest * out.itemsize, out.dtype, 1 + i) for i in range(n_spare)]
    width = -(-longest // k)  # elements of the largest chunk
    n_pool = min(REDUCE_SCATTER_POOL_SLOTS,
                 REDUCE_SCATTER_POOL_BYTES // max(1, width * out.itemsize)) if w > 2 else 0
    pool = scratch.take(n_pool * width * out.itemsize, out.dtype, 1 + n_spare)
    slots = [pool[i * width:(i + 1) * width] for i in range(n_pool)]
    tickets = [0] * n_pool  # the send that last read each slot (0: none yet)
    turn = 0
    if not started:
        reduce_scatter_start(ch, src, chunk_bytes, ready)
    marks: list[object] = []
    for s in range(w - 1):
        x = (r - s - 2) % w
        last = s == w - 2
        if last and ends_op:
            ch.sends_done()
        if not last and s >= n_spare:
            ch.wait(marks[s - n_spare])
        dest = out if last else spare[s % n_spare][:src[x].shape[0]]
        for j, (c_in, c_out) in enumerate(zip(chunks(src[x], k), chunks(dest, k), strict=True)):
            if ready is not None:
                ready(x, j)
            if not c_in.size:
                pass  # nothing to receive; its hooks still run
            elif not last and n_pool and ch.passed(nxt, tickets[turn]):
                hot = slots[turn][:c_in.shape[0]]
                ch.recv(prv, hot)
                reduce(c_in, hot, hot)
                ch.send(nxt, hot)
                tickets[turn] = ch.ticket(nxt)
                turn = (turn + 1) % n_pool
            else:
                tmp = scratch.get(c_in)
                ch.recv(prv, tmp)
                reduce(c_in, tmp, c_out)
                if not last:
                    ch.send(nxt, c_out)
                elif finish is not None:
                    finish(c_out)
            if last and final is not None:
                final(x, j)
        marks.append(ch.mark())
    ch.flush()


def all_gather_start(ch: Channel, segs: list[np.ndarray], mine: np.ndarray | None = None,
                     chunk_bytes: int | None = None, ready: ChunkHook = None) -> None:
    """The first sends of ``all_gather``: this rank's own segment (see ``all_reduce_start``).
    ``ready(rank, j)`` is called before its chunk j is read (every chunk, in order; a staged
    hand-off copies the input in there)."""
    w, r = ch.size, ch.rank
    if w == 1:
        return
    k = chunk_count(max(s.nbytes for s in segs), chunk_bytes, ch.chunk_cap)
    for j, c in enumerate(chunks(mine if mine is not None else segs[r], k)):
        if ready is not None:
            ready(r, j)
        if c.size:
            ch.send((r + 1) % w, c)


def all_gather(ch: Channel, segs: list[np.ndarray], mine: np.ndarray | None = None,
               chunk_bytes: int | None = None, started: bool = False,
               final: ChunkHook = None) -> None:
    """Afterwards every segs[i] holds rank i's segment. The own segment is sent straight from
    ``mine`` (if given); its local copy into segs[rank] is done a chunk at a time between
    receives, so it never holds up the upstream rank. ``started``: ``all_gather_start``
    already sent it. Before the last step, which only receives, it tells the channel that
    its sends are done. ``final(s, j)`` is called once chunk j of segs[s] holds its data
    (every chunk, empty ones included, each segment's in order; a staged hand-off copies it
    back there, see ``all_reduce``)."""
    w, r = ch.size, ch.rank
    k = chunk_count(max(s.nbytes for s in segs), chunk_bytes, ch.chunk_cap)
    prv = (r - 1) % w
    if not started:
        all_gather_start(ch, segs, mine, chunk_bytes)
    # after the first sends (off their path): is the local copy needed at all?
    copies: list[tuple[int, tuple[np.ndarray, np.ndarray]]] = []
    if mine is not None and segs[r].ctypes.data != mine.ctypes.data:
        copies = list(enumerate(zip(chunks(segs[r], k), chunks(mine, k), strict=True)))[::-1]
    elif final is not None:
        for j in range(k):
            final(r, j)

    def copy_own() -> None:
        j, (dst, part) = copies.pop()
        dst[...] = part
        if final is not None:
            final(r, j)

    for s in range(w - 1):
        forward = s < w - 2
        if not forward:
            ch.sends_done()
        seg = (r - s - 1) % w
        for j, c in enumerate(chunks(segs[seg], k)):
            if c.size:
                ch.recv(prv, c)
                if forward:
                    ch.send((r + 1) % w, c)
            if final is not None:
                final(seg, j)
            if copies:
                copy_own()
    while copies:
        copy_own()
    ch.flush()


def broadcast(ch: Channel, buf: np.ndarray, root: int, chunk_bytes: int | None = None) -> None:
    """Pipelined chain broadcast from ``root`` along the ring."""
    w, r = ch.size, ch.rank
    if w == 1 or buf.size == 0:
        return
    nxt, prv = (r + 1) % w, (r - 1) % w
    pos = (r - root) % w
    k = chunk_count(buf.nbytes, chunk_bytes or max(BROADCAST_MIN_CHUNK_BYTES,
                                                   min(ch.chunk_cap, buf.nbytes // 8)))
    for c in chunks(buf, k):
        if not c.size:
            continue
        if pos != 0:
            ch.recv(prv, c)
        if pos != w - 1:
            ch.send(nxt, c)
    ch.flush()
