"""Algorithms where every rank talks to every other directly: all-to-all, gather, scatter."""

from __future__ import annotations

import numpy as np

from .base import Channel


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

