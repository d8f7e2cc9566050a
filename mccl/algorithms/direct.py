"""Algorithms where every rank talks to every other directly: all-to-all, gather, scatter."""

from __future__ import annotations

import numpy as np

from .base import Channel

#: From this many bytes to one peer, ``all_to_all`` queues each send only once the receive
#: of the step before it is in. Queueing every send at once had up to w - 1 senders converge
#: on each receiver's link: on emulated 10 Gbit links that read 68-83 % of the ceiling at
#: 16-256 MB on 4 and 8 hosts, a step at a time 80-99 % in the same runs (twenty-second
#: session, benchmarks/results/h200/call_s22b-c). Below it, all at once: small messages would
#: wait a round trip per step.
ALL_TO_ALL_PAIRWISE_BYTES = 256 << 10


def all_to_all(ch: Channel, sends: list[np.ndarray], recvs: list[np.ndarray]) -> None:
    """sends[i] goes to rank i and recvs[i] is filled from rank i (byte buffers, any sizes).

    Step s sends to rank r + s and receives from rank r - s, so each rank's receives come
    from one peer at a time. Sends never block (each peer has its own sender thread): large
    ones are queued a step at a time (``ALL_TO_ALL_PAIRWISE_BYTES``), small ones all at once.
    Ranks may choose differently (uneven splits); every schedule completes.
    """
    w, r = ch.size, ch.rank
    recvs[r][...] = sends[r]
    pairwise = max((sends[(r + s) % w].nbytes for s in range(1, w)), default=0) \
        >= ALL_TO_ALL_PAIRWISE_BYTES
    queued = 0
    for s in range(1, w):
        while queued < (s if pairwise else w - 1):
            queued += 1
            dst = (r + queued) % w
            ch.send(dst, sends[dst])
        src = (r - s) % w
        ch.recv(src, recvs[src])
    ch.flush()


def gather(ch: Channel, send: np.ndarray, recvs: list[np.ndarray] | None, root: int) -> None:
    """Everyone's ``send`` lands in the root's ``recvs[rank]``."""
    if ch.rank == root:
        assert recvs is not None
        recvs[root][...] = send
        for src in range(ch.size):
            if src != root:
                ch.recv(src, recvs[src])
    else:
        ch.send(root, send)
    ch.flush()


def scatter(ch: Channel, sends: list[np.ndarray] | None, recv: np.ndarray, root: int) -> None:
    """The root's ``sends[i]`` lands in rank i's ``recv``."""
    if ch.rank == root:
        assert sends is not None
        for dst in range(ch.size):
            if dst != root:
                ch.send(dst, sends[dst])
        recv[...] = sends[root]
    else:
        ch.recv(root, recv)
    ch.flush()

