"""Bandwidth-optimal ring collectives, chunked and pipelined.

Rank r sends to r+1 and receives from r-1. Every segment is split into the same number of
chunks on every rank; a chunk is forwarded as soon as it has been received (and reduced), so
the reduction of one chunk overlaps the transfer of the next and both directions of every
link stay busy. In the reduce-scatter phase rank r ends up owning the fully reduced segment r.
"""

from __future__ import annotations

import numpy as np

from .base import (
    MIN_CHUNK_BYTES,
    Channel,
    Finisher,
    Reducer,
    Scratch,
    chunk_count,
    chunks,
    split,
)


def _run(ch: Channel, segs: list[np.ndarray], reduce: Reducer | None, finish: Finisher,
         scratch: Scratch | None, reduce_phase: bool, gather_phase: bool,
         chunk_bytes: int | None = None) -> None:
    w, r = ch.size, ch.rank
    if w == 1:
        if finish is not None and reduce_phase:
            finish(segs[0])
        return
    nxt, prv = (r + 1) % w, (r - 1) % w
    k = chunk_count(max(s.nbytes for s in segs), chunk_bytes)
    pieces = [chunks(s, k) for s in segs]
    # (segment received at this step, reduce it?) in schedule order
    steps: list[tuple[int, bool]] = []
    if reduce_phase:
        steps += [((r - s - 2) % w, True) for s in range(w - 1)]
    if gather_phase:
        steps += [((r - s - 1) % w, False) for s in range(w - 1)]
    first = (r - 1) % w if reduce_phase else r
    for c in pieces[first]:
        if c.size:
            ch.send(nxt, c)
    last_reduce = w - 2 if reduce_phase else -1
    for i, (seg, red) in enumerate(steps):
        forward = i < len(steps) - 1
        for c in pieces[seg]:
            if not c.size:
                continue
            if red:
                tmp = scratch.get(c)
                ch.recv(prv, tmp)
                reduce(c, tmp)
                if i == last_reduce and finish is not None:
                    finish(c)
            else:
                ch.recv(prv, c)
            if forward:
                ch.send(nxt, c)
    ch.flush()


def all_reduce(ch: Channel, buf: np.ndarray, reduce: Reducer, finish: Finisher,
               scratch: Scratch, chunk_bytes: int | None = None) -> None:
    """In-place all-reduce of a flat buffer: reduce-scatter then all-gather."""
    offs = split(buf.shape[0], ch.size)
    segs = [buf[offs[i]:offs[i + 1]] for i in range(ch.size)]
    _run(ch, segs, reduce, finish, scratch, True, True, chunk_bytes)


def reduce_scatter(ch: Channel, segs: list[np.ndarray], reduce: Reducer, finish: Finisher,
                   scratch: Scratch, chunk_bytes: int | None = None) -> None:
    """In place over ``segs`` (one per rank, any sizes): afterwards segs[rank] holds the
    reduction of every rank's segs[rank]; the other segments hold partial sums."""
    _run(ch, segs, reduce, finish, scratch, True, False, chunk_bytes)


def all_gather(ch: Channel, segs: list[np.ndarray], chunk_bytes: int | None = None) -> None:
    """segs[rank] is filled on entry; afterwards every segs[i] holds rank i's segment."""
    _run(ch, segs, None, None, None, False, True, chunk_bytes)


def broadcast(ch: Channel, buf: np.ndarray, root: int, chunk_bytes: int | None = None) -> None:
    """Pipelined chain broadcast from ``root`` along the ring."""
    w, r = ch.size, ch.rank
    if w == 1 or buf.size == 0:
        return
    nxt, prv = (r + 1) % w, (r - 1) % w
    pos = (r - root) % w
    k = chunk_count(buf.nbytes, chunk_bytes or max(MIN_CHUNK_BYTES, min(1 << 20, buf.nbytes // 8)))
    for c in chunks(buf, k):
        if not c.size:
            continue
        if pos != 0:
            ch.recv(prv, c)
        if pos != w - 1:
            ch.send(nxt, c)
    ch.flush()
