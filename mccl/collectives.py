"""Collective bodies run on the comm thread: host tensors in, algorithm calls out.

Each function takes the op's Channel and host (CPU) tensors and picks the algorithm by size
(identically on every rank, since sizes are part of the op's signature).
"""

from __future__ import annotations

import numpy as np
import torch

from .algorithms import direct, doubling, ring
from .algorithms.base import Channel, Scratch, split
from .reduce import UPCAST, Op, finisher, reducer

#: At or below this many bytes, all-reduce and broadcast use log2(n)-round algorithms instead
#: of the ring (measured on loopback and on emulated 1 Gbit links; see benchmarks/).
SMALL_BYTES = 64 << 10


def as_bytes(t: torch.Tensor) -> np.ndarray:
    """Flat uint8 numpy view of a contiguous CPU tensor (any dtype, zero-copy)."""
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return np.empty(0, dtype=np.uint8)
    return flat.view(torch.uint8).numpy()


def as_array(t: torch.Tensor) -> np.ndarray:
    """Flat typed numpy view of a contiguous CPU tensor of a numpy dtype (zero-copy)."""
    return t.reshape(-1).numpy()


class _Reducible:
    """A tensor as a flat numpy array in the dtype reductions run in (float32 for halves);
    ``commit`` rounds half types back once."""

    def __init__(self, t: torch.Tensor, copy: bool):
        self.t = t
        up = UPCAST.get(t.dtype)
        if up is not None:
            self.work = t.reshape(-1).to(up)
        elif copy:
            self.work = t.reshape(-1).clone()
        else:
            self.work = t.reshape(-1)
        self.arr = self.work.numpy()

    def commit(self, into: torch.Tensor | None = None) -> None:
        dst = self.t if into is None else into
        if self.work.data_ptr() != dst.data_ptr():
            dst.reshape(-1).copy_(self.work)


def all_reduce(ch: Channel, t: torch.Tensor, op: Op, scratch: Scratch) -> None:
    red = _Reducible(t, copy=False)
    fn, fin = reducer(op, red.work.dtype), finisher(op, ch.size)
    if red.arr.nbytes <= SMALL_BYTES:
        doubling.all_reduce(ch, red.arr, fn, fin, scratch)
    else:
        ring.all_reduce(ch, red.arr, fn, fin, scratch)
    red.commit()


def all_reduce_many(ch: Channel, ts: list[torch.Tensor], op: Op, scratch: Scratch) -> None:
    """Coalesced all-reduce: one flat buffer, one op, results copied back."""
    if not ts:
        return
    flat = torch.cat([t.reshape(-1) for t in ts])
    all_reduce(ch, flat, op, scratch)
    offs = 0
    for t in ts:
        n = t.numel()
        t.reshape(-1).copy_(flat[offs:offs + n])
        offs += n


def broadcast(ch: Channel, t: torch.Tensor, root: int) -> None:
    buf = as_bytes(t)
    if buf.nbytes <= SMALL_BYTES:
        doubling.broadcast(ch, buf, root)
    else:
        ring.broadcast(ch, buf, root)


def reduce(ch: Channel, t: torch.Tensor, op: Op, root: int, scratch: Scratch) -> None:
    """Reduce to ``root``; other ranks' tensors are left unchanged."""
    red = _Reducible(t, copy=ch.rank != root)
    fn, fin = reducer(op, red.work.dtype), finisher(op, ch.size)
    if red.arr.nbytes <= SMALL_BYTES:
        doubling.all_reduce(ch, red.arr, fn, fin, scratch)
    else:
        offs = split(red.arr.shape[0], ch.size)
        segs = [red.arr[offs[i]:offs[i + 1]] for i in range(ch.size)]
        ring.reduce_scatter(ch, segs, fn, fin, scratch)
        direct.gather(ch, segs[ch.rank], segs if ch.rank == root else None, root)
    if ch.rank == root:
        red.commit()


def reduce_scatter(ch: Channel, out: torch.Tensor, inputs: list[torch.Tensor], op: Op,
                   scratch: Scratch) -> None:
    """out = reduction over ranks of inputs[rank]; inputs are left unchanged."""
    flat = torch.cat([t.reshape(-1) for t in inputs]) if inputs else out.reshape(-1)[:0]
    red = _Reducible(flat, copy=False)  # torch.cat already made a private copy
    fn, fin = reducer(op, red.work.dtype), finisher(op, ch.size)
    segs, off = [], 0
    for t in inputs:
        segs.append(red.arr[off:off + t.numel()])
        off += t.numel()
    ring.reduce_scatter(ch, segs, fn, fin, scratch)
    out.reshape(-1).copy_(torch.from_numpy(segs[ch.rank]))


def all_gather(ch: Channel, outs: list[torch.Tensor], inp: torch.Tensor) -> None:
    segs = [as_bytes(o) for o in outs]
    mine = as_bytes(inp)
    if segs[ch.rank].ctypes.data != mine.ctypes.data:
        segs[ch.rank][...] = mine
    ring.all_gather(ch, segs)


def all_to_all(ch: Channel, outs: list[np.ndarray], ins: list[np.ndarray]) -> None:
    direct.all_to_all(ch, ins, outs)


def gather(ch: Channel, inp: torch.Tensor, outs: list[torch.Tensor] | None, root: int) -> None:
    direct.gather(ch, as_bytes(inp), [as_bytes(o) for o in outs] if outs else None, root)


def scatter(ch: Channel, out: torch.Tensor, ins: list[torch.Tensor] | None, root: int) -> None:
    direct.scatter(ch, [as_bytes(i) for i in ins] if ins else None, as_bytes(out), root)


def barrier(ch: Channel, scratch: Scratch) -> None:
    doubling.barrier(ch, scratch)
