"""Latency-optimal algorithms for small messages: log2(n) rounds instead of 2(n-1) steps.

Non-power-of-two groups fold the extra ranks onto the first ones before the rounds and
unfold after, so every rank ends with bit-identical results: partners reduce their two
partial values in the same order (the lower rank's first), since MIN and MAX pick an operand
by its position where the two compare equal but differ in bits (-0.0 and 0.0, NaN payloads).
"""

from __future__ import annotations

import numpy as np

from .base import Channel, Finisher, Reducer, Scratch


def _pow2_below(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def all_reduce(ch: Channel, buf: np.ndarray, reduce: Reducer, finish: Finisher,
               scratch: Scratch) -> None:
    """Recursive-doubling all-reduce in place. Sends here are small: copied or inline."""
    w, r = ch.size, ch.rank
    if w > 1 and buf.size:
        p = _pow2_below(w)
        tmp = scratch.get(buf)
        if r >= p:  # extra rank: hand its data to a partner, get the result back
            if not ch.send(r - p, buf):
                ch.flush()
            ch.recv(r - p, buf)
            ch.flush()
            return
        if r + p < w:
            ch.recv(r + p, tmp)
            reduce(buf, tmp)
        mask = 1
        while mask < p:
            partner = r ^ mask
            if not ch.send(partner, buf):
                ch.flush()
            ch.recv(partner, tmp)
            if partner > r:
                reduce(buf, tmp)
            else:
                reduce(tmp, buf, buf)
            mask <<= 1
        if finish is not None:
            finish(buf)
        if r + p < w:
            ch.send(r + p, buf)
        ch.flush()
    elif finish is not None:
        finish(buf)


def broadcast(ch: Channel, buf: np.ndarray, root: int) -> None:
    """Binomial-tree broadcast from ``root``."""
    w, r = ch.size, ch.rank
    if w == 1 or buf.size == 0:
        return
    v = (r - root) % w  # position relative to the root
    mask = 1
    while mask < w:  # receive from the parent
        if v & mask:
            ch.recv((v - mask + root) % w, buf)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:  # send to the children
        if v + mask < w:
            ch.send((v + mask + root) % w, buf)
        mask >>= 1
    ch.flush()


def barrier(ch: Channel, scratch: Scratch) -> None:
    """Dissemination barrier: after it returns every rank has entered it."""
    w, r = ch.size, ch.rank
    token = np.zeros(1, dtype=np.uint8)
    tmp = scratch.get(token)
    dist = 1
    while dist < w:
        ch.send((r + dist) % w, token)
        ch.recv((r - dist) % w, tmp)
        dist <<= 1
    ch.flush()
