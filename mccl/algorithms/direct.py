"""Algorithms where every rank talks to every other directly: all-to-all, gather, scatter."""

from __future__ import annotations

import numpy as np

from .base import Channel, Finisher, Reducer, Scratch, chunk_count, chunks, split


def all_to_all(ch: Channel, sends: list[np.ndarray], recvs: list[np.ndarray]) -> None:
    """sends[i] goes to rank i and recvs[i] is filled from rank i (byte buffers, any sizes).

    Every send is queued at once (each peer has its own sender thread, so they go out in
    parallel), then receives are taken in a staggered order so no rank is a hot spot.
    """
    w, r = ch.size, ch.rank
    recvs[r][...] = sends[r]
    for s in range(1, w):
        dst = (r + s) % w
        if sends[dst].size:
            ch.send(dst, sends[dst])
    for s in range(1, w):
        src = (r - s) % w
        if recvs[src].size:
            ch.recv(src, recvs[src])
    ch.flush()


def gather(ch: Channel, send: np.ndarray, recvs: list[np.ndarray] | None, root: int) -> None:
    """Everyone's ``send`` lands in the root's ``recvs[rank]``."""
    if ch.rank == root:
        assert recvs is not None
        recvs[root][...] = send
        for src in range(ch.size):
            if src != root and recvs[src].size:
                ch.recv(src, recvs[src])
    elif send.size:
        ch.send(root, send)
    ch.flush()


def scatter(ch: Channel, sends: list[np.ndarray] | None, recv: np.ndarray, root: int) -> None:
    """The root's ``sends[i]`` lands in rank i's ``recv``."""
    if ch.rank == root:
        assert sends is not None
        for dst in range(ch.size):
            if dst != root and sends[dst].size:
                ch.send(dst, sends[dst])
        recv[...] = sends[root]
    elif recv.size:
        ch.recv(root, recv)
    ch.flush()


def reduce_scatter(ch: Channel, src: list[np.ndarray], out: np.ndarray, reduce: Reducer,
                   finish: Finisher, scratch: Scratch) -> None:
    """Every rank sends ``src[p]`` straight to rank p and reduces what it receives into
    ``out`` (which may be ``src[rank]`` itself): one latency step instead of n-1, the same
    bytes on every link as the ring. For mid-sized messages on a switched network."""
    w, r = ch.size, ch.rank
    k = chunk_count(max(s.nbytes for s in src))
    for s in range(1, w):
        for c in chunks(src[(r + s) % w], k):
            if c.size:
                ch.send((r + s) % w, c)
    if out.ctypes.data != src[r].ctypes.data:
        out[...] = src[r]
    for s in range(1, w):
        for c in chunks(out, k):
            if c.size:
                tmp = scratch.get(c)
                ch.recv((r - s) % w, tmp)
                reduce(c, tmp)
    if finish is not None:
        finish(out)


def all_gather(ch: Channel, segs: list[np.ndarray], mine: np.ndarray | None = None) -> None:
    """Every rank sends its segment straight to every other rank (one latency step)."""
    w, r = ch.size, ch.rank
    src = mine if mine is not None else segs[r]
    k = chunk_count(max(s.nbytes for s in segs))
    for s in range(1, w):
        for c in chunks(src, k):
            if c.size:
                ch.send((r + s) % w, c)
    if src.ctypes.data != segs[r].ctypes.data:
        segs[r][...] = src
    for s in range(1, w):
        for c in chunks(segs[(r - s) % w], k):
            if c.size:
                ch.recv((r - s) % w, c)
    ch.flush()


def all_reduce(ch: Channel, buf: np.ndarray, reduce: Reducer, finish: Finisher,
               scratch: Scratch) -> None:
    """In place: direct reduce-scatter, then direct all-gather of the reduced segments."""
    offs = split(buf.shape[0], ch.size)
    segs = [buf[offs[i]:offs[i + 1]] for i in range(ch.size)]
    reduce_scatter(ch, segs, segs[ch.rank], reduce, finish, scratch)
    ch.flush()  # the other segments were sent zero-copy and are about to be overwritten
    all_gather(ch, segs)
