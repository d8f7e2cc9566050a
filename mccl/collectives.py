"""Collective bodies run on the comm thread: host tensors in, algorithm calls out.

Each function takes the op's Channel and host (CPU) tensors and picks the algorithm by size
(identically on every rank, since sizes are part of the op's signature).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch

from .algorithms import direct, doubling, grid, ring
from .algorithms.base import Channel, Scratch, split
from .errors import InStepError
from .reduce import UPCAST, Op, finisher, reducer

#: At or below this many bytes, all-reduce and reduce use recursive doubling instead of the
#: ring. benchmarks/threshold.py, 4 ranks: doubling wins up to 1-2 MiB on loopback and 10 Gbit
#: links (CPU-bound), up to 64-128 KiB on 1 Gbit links (it moves log2(n)x the data per rank).
SMALL_BYTES = 128 << 10
#: The same switch for broadcast (binomial tree vs pipelined chain): the tree's root sends
#: log2(n) full copies, so the chain wins from 16-32 KiB on 1 Gbit, and loopback from ~2 MiB.
BROADCAST_SMALL_BYTES = 64 << 10


class SegmentIO(Protocol):
    """What a staged hand-off offers a collective that copies range by range."""

    def wait_range(self, i: int) -> None: ...

    def copy_back(self, i: int) -> None: ...


class StagedByRange(Protocol):
    """An op's run whose large tensors a staged hand-off may copy range by range (at most one
    it reads and one it writes: ``wait_range`` and ``copy_back`` name a range of those)."""

    ranged: tuple[int, ...]  # those tensors' indices among the op's tensors
    in_bytes: bool  # their ranges count bytes, not elements

    def ranges(self, tensors: list[torch.Tensor], index: int, w: int, r: int,
               cap: int) -> tuple[tuple[int, int], ...] | None:
        """Tensor ``index``'s ranges in the order the body first needs them, or None: copied
        whole."""
        ...

    def stage(self, io: SegmentIO, staged: frozenset[int]) -> None:
        """Caller's thread, before submission: the tensors ``staged`` are copied by range."""
        ...


def _require_contiguous(t: torch.Tensor) -> None:
    """A strided tensor has no flat view (``reshape`` would silently copy it, and a result
    written there would be lost); the hand-off makes contiguous copies before this point."""
    if not t.is_contiguous():
        raise RuntimeError(f"mccl internal error: a strided tensor of shape {tuple(t.shape)} "
                           "reached the exchange (the hand-off makes contiguous copies)")


class _Memory:
    """A contiguous CPU tensor's memory as numpy takes it (``__array_interface__``), kept
    alive by the array made from it. Why not ``Tensor.numpy()``: it marks the tensor's storage
    as not resizable, for good, and FSDP (which frees a flat parameter's storage by resizing
    it to 0) and batched PowerSGD (which resizes its bucket) then fail on their next step."""

    __slots__ = ("__array_interface__", "tensor")

    def __init__(self, t: torch.Tensor, typestr: str, n: int):
        self.tensor = t
        self.__array_interface__ = {"version": 3, "shape": (n,), "typestr": typestr,
                                    "data": (t.data_ptr(), False)}


@functools.cache
def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty(0, dtype=dtype).numpy().dtype  # TypeError for dtypes numpy lacks


_BYTE = np.dtype(np.uint8)


def _numpy_view(t: torch.Tensor, dtype: np.dtype, n: int) -> np.ndarray:
    """``n`` elements of ``dtype`` from the start of contiguous ``t``, without a copy, and
    without a torch op: torch's tensor ops (``view``, ``reshape``, ``detach``) release the GIL,
    and once an op's first sends are queued its sender thread takes it there, so each such
    call can cost the op a thread hand-off where cores are short (on the loaded 2-core
    machine a ``reshape`` in reduce-scatter's second part cost 65 us per 1 MB op on 2 loopback
    ranks; on the 16-core H200 machine the difference did not show, ``call_s38a/``)."""
    _require_contiguous(t)
    if n == 0:
        return np.empty(0, dtype=dtype)
    return np.asarray(_Memory(t, dtype.str, n))


def as_bytes(t: torch.Tensor) -> np.ndarray:
    """Flat uint8 numpy view of a contiguous CPU tensor (any dtype, zero-copy)."""
    return _numpy_view(t, _BYTE, t.numel() * t.element_size())


def as_array(t: torch.Tensor) -> np.ndarray:
    """Flat typed numpy view of a contiguous CPU tensor of a numpy dtype (zero-copy)."""
    return _numpy_view(t, _numpy_dtype(t.dtype), t.numel())


class _Reducible:
    """A tensor as a flat numpy array in the dtype reductions run in (float32 for halves);
    ``commit`` rounds half types back once."""

    __slots__ = ("t", "work", "arr")

    def __init__(self, t: torch.Tensor, copy: bool):
        # ``t`` is a hand-off's host tensor: detached and contiguous.
        self.t = t
        up = UPCAST.get(t.dtype)
        if up is not None:
            self.work = t.reshape(-1).to(up)
        elif copy:
            self.work = t.reshape(-1).clone()
        else:  # the tensor itself: ``as_array`` reads it flat (see ``_numpy_view``)
            self.work = t
        self.arr = as_array(self.work)

    def commit(self, into: torch.Tensor | None = None) -> None:
        dst = self.t if into is None else into
        if self.work.data_ptr() != dst.data_ptr():
            dst.reshape(-1).copy_(self.work)


class AllReduce:
    """One all-reduce of a host tensor, in the two parts the engine runs: ``start`` sends the
    ring's first segment, which needs nothing from a peer (so the engine may run it early,
    while the op before still receives its last segment), ``finish`` does the rest.

    With ``stage(io)`` the hand-off copies the tensor piece by piece (``staging_plan``): the
    ring waits for a piece's copy in just before it first reads the piece's first chunk and
    starts its copy back as soon as its last chunk is final, so the copies overlap the
    exchange. Half types reduce in float32 (chunk by chunk when staged) and round once.
    """

    def __init__(self, op: Op, scratch: Scratch):
        self.op = op
        self.scratch = scratch
        self.io: SegmentIO | None = None
        self._red: _Reducible | None = None
        self._ring = False
        self._cols: int | None = None  # a grid's row length (``grid.columns``), else the ring
        self._staged: tuple | None = None  # (work tensor, ready, final) of a staged op

    #: The tensor a staged hand-off may copy range by range (``StagingHandoff.pipeline``),
    #: and whether its ranges count bytes.
    ranged, in_bytes = (0,), False

    def ranges(self, tensors: list[torch.Tensor], index: int, w: int, r: int,
               cap: int) -> tuple[tuple[int, int], ...] | None:
        return staging_ranges(tensors[0], w, r, cap)

    def stage(self, io: SegmentIO, staged: frozenset[int]) -> None:
        self.io = io

    def start(self, ch: Channel, hosts: list[torch.Tensor]) -> None:
        if self.io is not None:
            self._start_staged(ch, hosts[0], self.io)
            return
        red = self._red = _Reducible(hosts[0], copy=False)
        self._ring = red.arr.nbytes > SMALL_BYTES
        if self._ring:
            self._cols = grid.columns(red.arr.shape[0], ch.size, red.arr.itemsize, ch.chunk_cap)
            if self._cols:
                grid.all_reduce_start(ch, red.arr, self._cols)
            else:
                ring.all_reduce_start(ch, red.arr)

    def finish(self, ch: Channel, hosts: list[torch.Tensor]) -> None:
        fin = finisher(self.op, ch.size)
        if self._staged is not None:
            work, ready, final = self._staged
            ring.all_reduce(ch, as_array(work), reducer(self.op, work.dtype), fin, self.scratch,
                            ready=ready, final=final, started=True)
            return
        if self.io is not None:
            return  # staged over one rank: the tensor stays as it is, nothing was copied
        red = self._red
        assert red is not None, "finish before start"
        fn = reducer(self.op, red.work.dtype)
        if self._cols:
            grid.all_reduce(ch, red.arr, fn, fin, self.scratch, self._cols, started=True)
        elif self._ring:
            ring.all_reduce(ch, red.arr, fn, fin, self.scratch, started=True)
        else:
            doubling.all_reduce(ch, red.arr, fn, fin, self.scratch)
        red.commit()

    def _start_staged(self, ch: Channel, t: torch.Tensor, io: SegmentIO) -> None:
        if ch.size == 1:
            return  # a reduction over one rank leaves the tensor as it is: nothing to copy
        flat = t.reshape(-1)
        up = UPCAST.get(t.dtype)
        work = torch.empty(flat.numel(), dtype=up) if up is not None else flat
        upcast = downcast = None
        if up is not None:
            def upcast(a: int, b: int) -> None:
                work[a:b].copy_(flat[a:b])

            def downcast(a: int, b: int) -> None:
                flat[a:b].copy_(work[a:b])

        # on staging_plan's pieces (chunked in the dtype the ring runs in)
        n, size = flat.numel(), work.element_size()
        ready = _piece_hook(ch, n, size, False, False, io.wait_range, upcast)
        final = _piece_hook(ch, n, size, True, False, io.copy_back, downcast)
        self._staged = (work, ready, final)
        ring.all_reduce_start(ch, as_array(work), ready=ready)


def all_reduce(ch: Channel, t: torch.Tensor, op: Op, scratch: Scratch) -> None:
    """``AllReduce``'s two parts at once."""
    run = AllReduce(op, scratch)
    run.start(ch, [t])
    run.finish(ch, [t])


def staging_plan(t: torch.Tensor, w: int, r: int, cap: int) -> ring.CopyPlan:
    """The pieces a staged ``AllReduce`` copies ``t`` in, on rank ``r`` of ``w``: the caller's
    thread hands their ranges to ``StagingHandoff.pipeline`` (``staging_ranges``); the comm
    thread derives the same plan (chunked in the dtype the ring runs in)."""
    return ring.copy_plan(t.numel(), w, r, (UPCAST.get(t.dtype) or t.dtype).itemsize, cap=cap)


def staging_ranges(t: torch.Tensor, w: int, r: int,
                   cap: int) -> tuple[tuple[int, int], ...] | None:
    """``staging_plan``'s ranges, or None (copy ``t`` whole) where no segment is cut into more
    than one piece: the pieces would be just the ring's segments, each costing a fence and
    waits on the comm thread between the ring's chunks, for little hidden (8 hosts, 4 MB,
    CUDA tensors at 10 Gbit: 81 % of the link in pieces, 95 % whole; 4 hosts level)."""
    return _cut_ranges(staging_plan(t, w, r, cap), w)


def _cut_ranges(plan: ring.CopyPlan, w: int) -> tuple[tuple[int, int], ...] | None:
    return plan.ranges if len(plan.ranges) > w else None


def _piece_hook(ch: Channel, n: int, itemsize: int, ends: bool, own: bool,
                act: Callable[[int], None],
                convert: Callable[[int, int], None] | None = None) -> ring.ChunkHook:
    """The chunk hook of a staged op on ``ring.copy_plan`` (a flat all-gather's or
    reduce-scatter's ring cuts its segments and chunks as the all-reduce does for the same
    ``n`` items): ``act(p)`` once the chunk that ends piece p is final (``ends``), else
    before the chunk that begins piece p is read. ``own``: on the plan of this rank's segment
    alone, for a tensor that holds just that segment (``ring.copy_plan``). ``convert(a, b)``:
    every chunk's items (from the tensor's start) between the half type the tensor holds and
    the float32 the ring runs in, after the wait for its piece or before its copy back."""
    plan = ring.copy_plan(n, ch.size, ch.rank, itemsize, cap=ch.chunk_cap, own=own)
    marks = plan.ends if ends else plan.starts
    cuts, base = plan.cuts, plan.cuts[ch.rank][0] if own else 0

    def hook(s: int, j: int) -> None:
        p = marks[s][j]
        if convert is not None and ends:
            convert(cuts[s][j] - base, cuts[s][j + 1] - base)
        if p >= 0:
            act(p)
        if convert is not None and not ends:
            convert(cuts[s][j] - base, cuts[s][j + 1] - base)

    return hook


def _flat_ranges(n: int, itemsize: int, w: int, r: int, cap: int,
                 own: bool = False) -> tuple[tuple[int, int], ...] | None:
    """The ranges a staged flat all-gather (bytes) or reduce-scatter (elements) copies its
    large tensor in (``own``: the tensor holding segment r only, as ranges of it: the
    all-gather's input, the reduce-scatter's output), or None (copied whole): one rank, the
    grid (``_grid_columns``), whose order is not the ring's, or segments not cut into pieces
    (``staging_ranges``; ``own``: segment r)."""
    if w == 1 or grid.columns(n, w, itemsize, cap):
        return None
    plan = ring.copy_plan(n, w, r, itemsize, cap=cap, own=own)
    return _cut_ranges(plan, 1 if own else w)


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


def sparse_all_reduce(ch: Channel, t: torch.Tensor, base: torch.Tensor | None) -> None:
    """SUM of a sparse COO CPU tensor over the group, written into ``t`` (as gloo does) and,
    where ``t`` is the real view of a complex sparse tensor ``base``, into that too: a view
    that takes other entries no longer shares the base's memory (see the caller).

    Ranks hold different numbers of entries, so it is an all-gather of every rank's
    (indices, values) in three direct rounds: the entry counts and shapes' ranks, then the
    sizes and indices, then the values. Every rank sums the same concatenation, in rank
    order, so every rank ends with the same bits. Half types are not coalesced before they
    travel, so every entry is summed once, in float32, and rounded once. Every rank sees
    every rank's shape before the values move, so a mismatch fails on all of them alike,
    after the same exchange (``InStepError``: the group stays usable).
    """
    w, r = ch.size, ch.rank
    up = UPCAST.get(t.dtype)
    c = t.detach() if up is not None else t.detach().coalesce()
    idx, val = c._indices().contiguous(), c._values().contiguous()
    head = np.array([c._nnz(), c.sparse_dim(), c.dim()], dtype=np.int64)
    heads = [np.empty(3, dtype=np.int64) for _ in range(w)]
    direct.all_to_all(ch, [head.view(np.uint8)] * w, [h.view(np.uint8) for h in heads])
    if len({(int(h[1]), int(h[2])) for h in heads}) > 1:
        raise InStepError("mccl all_reduce: ranks passed sparse tensors of different shapes: "
                         + ", ".join(f"rank {i}: {int(h[2])} dims, {int(h[1])} sparse"
                                     for i, h in enumerate(heads)))
    sparse_dim, ndim = c.sparse_dim(), c.dim()
    meta = np.concatenate([np.asarray(c.shape, dtype=np.int64), idx.numpy().reshape(-1)])
    metas = [np.empty(ndim + sparse_dim * int(h[0]), dtype=np.int64) for h in heads]
    metas[r] = meta
    direct.all_to_all(ch, [meta.view(np.uint8)] * w, [m.view(np.uint8) for m in metas])
    shapes = [tuple(int(x) for x in m[:ndim]) for m in metas]
    if len(set(shapes)) > 1:
        raise InStepError("mccl all_reduce: ranks passed sparse tensors of different sizes: "
                         + ", ".join(f"rank {i}: {s}" for i, s in enumerate(shapes)))
    row = math.prod(c.shape[sparse_dim:])  # elements per entry
    vals = [torch.empty(int(h[0]) * row, dtype=val.dtype) for h in heads]
    vals[r] = val.reshape(-1)
    direct.all_to_all(ch, [as_bytes(vals[r])] * w, [as_bytes(v) for v in vals])
    indices = torch.from_numpy(np.concatenate([m[ndim:].reshape(sparse_dim, int(h[0]))
                                               for m, h in zip(metas, heads, strict=True)],
                                              axis=1))
    values = torch.cat(vals).reshape(indices.shape[1], *c.shape[sparse_dim:])
    total = torch.sparse_coo_tensor(indices, values if up is None else values.to(up), c.shape,
                                    check_invariants=False).coalesce()
    if up is not None:
        total = torch.sparse_coo_tensor(total._indices(), total._values().to(val.dtype),
                                        c.shape, is_coalesced=True, check_invariants=False)
    with torch.no_grad():
        t.copy_(total)
        if base is not None:
            base.copy_(torch.view_as_complex(total))


def _joined(ch: Channel, scratch: Scratch) -> None:
    """End of an op with a root: wait until every rank has joined it with the same signature
    (a dissemination barrier in the op's own frames, log2(n) rounds of one byte). A rank whose
    part only sends (a broadcast or scatter root, a gather's other ranks) would otherwise
    return while a rank that named another root fails, and hear of it only at its next op;
    now every rank's op fails."""
    doubling.barrier(ch, scratch)


def broadcast(ch: Channel, t: torch.Tensor, root: int, scratch: Scratch) -> None:
    buf = as_bytes(t)
    if buf.nbytes <= BROADCAST_SMALL_BYTES:
        doubling.broadcast(ch, buf, root)
    else:
        ring.broadcast(ch, buf, root)
    _joined(ch, scratch)


def _segments(arr: np.ndarray, world: int) -> list[np.ndarray]:
    offs = split(arr.shape[0], world)
    return [arr[offs[i]:offs[i + 1]] for i in range(world)]


def reduce(ch: Channel, t: torch.Tensor, op: Op, root: int, scratch: Scratch) -> None:
    """Reduce to ``root``; other ranks' tensors are left unchanged."""
    is_root = ch.rank == root
    small = t.numel() * t.element_size() <= SMALL_BYTES
    red = _Reducible(t, copy=small and not is_root)
    fn, fin = reducer(op, red.work.dtype), finisher(op, ch.size)
    if small:
        doubling.all_reduce(ch, red.arr, fn, fin, scratch)
    else:
        segs = _segments(red.arr, ch.size)
        # out of place: the input is only read; rank r's reduced segment lands in `mine`
        mine = segs[ch.rank] if is_root else np.empty_like(segs[ch.rank])
        ring.reduce_scatter(ch, segs, mine, fn, fin, scratch, ends_op=False)  # gather follows
        direct.gather(ch, mine, segs if is_root else None, root)
        _joined(ch, scratch)
    if is_root:
        red.commit()


def _readable(t: torch.Tensor, up: torch.dtype | None) -> np.ndarray:
    """A flat numpy array of ``t`` in the dtype reductions run in: a view, or the float32 copy
    of a half type (``up``)."""
    return as_array(t.reshape(-1).to(up) if up is not None else t)


def _grid_columns(ch: Channel, n: int, itemsize: int) -> int | None:
    """The row length of the grid a flat all-gather or reduce-scatter of ``n`` items (every
    rank's part, in rank order) runs on, or None for the ring: its long phase runs along the
    column over the ``grid.columns`` ranks an all-reduce of this size would put in a row."""
    long = grid.columns(n, ch.size, itemsize, ch.chunk_cap)
    return ch.size // long if long else None


def _list_grid_columns(ch: Channel, parts: list[np.ndarray]) -> int | None:
    """``_grid_columns`` for the list forms, whose parts (one per rank) are separate arrays:
    they must run the algorithm the flat form of the same op picks, since ranks may mix the
    two forms (the signatures agree, and so must the peers each rank talks to). Parts of
    unequal sizes have no flat counterpart: the ring."""
    n = parts[0].shape[0]
    if any(p.shape[0] != n for p in parts):
        return None
    return _grid_columns(ch, n * len(parts), parts[0].itemsize)


class ReduceScatter:
    """Reduce-scatter in the engine's two parts (see ``AllReduce``): ``start`` sends input
    segment r - 1. Host tensors: the inputs, one per rank, then the output (``flat``: the
    output, then one input holding every rank's part in rank order, cut in numpy, which is
    cheaper per op than a torch slice and view per rank). Inputs are only read (no copy of
    them, except the float32 copy that half types reduce in); half types round once. Staged
    (``stage``): the input's pieces are waited for before the ring first reads them and the
    output's copied back as they become final (half types: converted chunk by chunk)."""

    #: A staged hand-off may copy the flat form's input and output range by range
    #: (``AllReduce``).
    ranged, in_bytes = (1, 0), False

    def __init__(self, op: Op, scratch: Scratch, flat: bool):
        self.op = op
        self.scratch = scratch
        self.flat = flat
        self.io: SegmentIO | None = None
        self._parts: tuple[torch.Tensor, list[np.ndarray]] | None = None
        self._grid: tuple[np.ndarray, int] | None = None  # (flat input, row length)
        self._ready: ring.ChunkHook = None  # a staged op's wait for its input's pieces
        self._final: ring.ChunkHook = None  # and its copy back of its output's pieces
        self._staged: frozenset[int] = frozenset()
        self._work: torch.Tensor | None = None  # a staged half type's float32 output

    def ranges(self, tensors: list[torch.Tensor], index: int, w: int, r: int,
               cap: int) -> tuple[tuple[int, int], ...] | None:
        t = tensors[1]
        if not self.flat:
            return None
        size = (UPCAST.get(t.dtype) or t.dtype).itemsize  # the ring's chunks are float32's
        return _flat_ranges(t.numel(), size, w, r, cap, own=index == 0)

    def stage(self, io: SegmentIO, staged: frozenset[int]) -> None:
        self.io, self._staged = io, staged

    def start(self, ch: Channel, hosts: list[torch.Tensor]) -> None:
        out = hosts[0] if self.flat else hosts[-1]
        up = UPCAST.get(out.dtype)
        if self.flat:
            if self.io is not None:
                arr = self._stage_hooks(ch, out, hosts[1], up, self.io)
            else:
                arr = _readable(hosts[1], up)
            cols = _grid_columns(ch, arr.shape[0], arr.itemsize)
            assert not (cols and self.io), "a staged reduce-scatter runs the plain ring"
        else:
            src = [_readable(t, up) for t in hosts[:-1]]
            cols = _list_grid_columns(ch, src)
            if cols:
                arr = np.concatenate(src)  # the flat form's layout
        if cols:
            self._parts, self._grid = (out, []), (arr, cols)
            grid.reduce_scatter_start(ch, arr, cols)
            return
        if self.flat:
            src = _segments(arr, ch.size)
        self._parts = (out, src)
        ring.reduce_scatter_start(ch, src, ready=self._ready)

    def finish(self, ch: Channel, hosts: list[torch.Tensor]) -> None:
        assert self._parts is not None, "finish before start"
        out, src = self._parts
        up = UPCAST.get(out.dtype)
        work = self._work
        if work is None:
            work = torch.empty(out.numel(), dtype=up) if up is not None else out
        fn, fin = reducer(self.op, work.dtype), finisher(self.op, ch.size)
        if self._grid is not None:
            arr, cols = self._grid
            grid.reduce_scatter(ch, arr, as_array(work), fn, fin, self.scratch, cols, started=True)
        else:
            ring.reduce_scatter(ch, src, as_array(work), fn, fin, self.scratch, started=True,
                                ready=self._ready, final=self._final)
        if up is not None and self._final is None:  # (else rounded chunk by chunk)
            out.reshape(-1).copy_(work)

    def _stage_hooks(self, ch: Channel, out: torch.Tensor, inp: torch.Tensor,
                     up: torch.dtype | None, io: SegmentIO) -> np.ndarray:
        """A staged op's chunk hooks for the tensors copied by piece (``stage``), and the
        input as the ring reads it: a half type's float32 copy is made chunk by chunk, after
        each piece's wait (else at once), and its float32 result rounded chunk by chunk
        before each piece's copy back."""
        flat_in, flat_out = inp.reshape(-1), out.reshape(-1)
        work_in = torch.empty(flat_in.numel(), dtype=up) if up is not None else flat_in
        n, size = work_in.numel(), work_in.element_size()
        if 1 in self._staged:
            upcast = None if up is None else (
                lambda a, b: work_in[a:b].copy_(flat_in[a:b]))
            self._ready = _piece_hook(ch, n, size, False, False, io.wait_range, upcast)
        elif up is not None:
            work_in.copy_(flat_in)
        if 0 in self._staged:
            work = self._work = torch.empty(flat_out.numel(), dtype=up) if up else None
            round_down = None if work is None else (
                lambda a, b: flat_out[a:b].copy_(work[a:b]))
            self._final = _piece_hook(ch, n, size, True, True, io.copy_back, round_down)
        return as_array(work_in)


class AllGather:
    """All-gather in the engine's two parts (see ``AllReduce``): ``start`` sends this rank's
    input. Host tensors: the outputs, one per rank, then the input (``flat``: one output
    holding every rank's part in rank order, then the input). Staged (``stage``): the input's
    pieces are waited for before they are sent and the output's copied back as they become
    final."""

    #: A staged hand-off may copy the flat form's output back and its input out range by
    #: range, in bytes (``AllReduce``).
    ranged, in_bytes = (0, 1), True

    def __init__(self, flat: bool):
        self.flat = flat
        self.io: SegmentIO | None = None
        self._parts: tuple[list[np.ndarray], np.ndarray] | None = None
        self._grid: tuple[np.ndarray, int] | None = None  # (flat output, row length)
        self._outs: list[np.ndarray] = []  # the list form's outputs, when a grid fills a copy
        self._final: ring.ChunkHook = None  # a staged op's copy back of its output's pieces
        self._ready: ring.ChunkHook = None  # and its wait for its input's
        self._staged: frozenset[int] = frozenset()

    def ranges(self, tensors: list[torch.Tensor], index: int, w: int, r: int,
               cap: int) -> tuple[tuple[int, int], ...] | None:
        t = tensors[0]
        if not self.flat:
            return None
        return _flat_ranges(t.numel() * t.element_size(), 1, w, r, cap, own=index == 1)

    def stage(self, io: SegmentIO, staged: frozenset[int]) -> None:
        self.io, self._staged = io, staged

    def start(self, ch: Channel, hosts: list[torch.Tensor]) -> None:
        if self.flat:
            out = as_bytes(hosts[0])
            segs = _segments(out, ch.size)
            cols = _grid_columns(ch, out.shape[0], 1)
            if self.io is not None:
                assert not cols, "a staged all-gather runs the plain ring"
                if 0 in self._staged:
                    self._final = _piece_hook(ch, out.shape[0], 1, True, False,
                                              self.io.copy_back)
                if 1 in self._staged:
                    self._ready = _piece_hook(ch, out.shape[0], 1, False, True,
                                              self.io.wait_range)
        else:
            segs = [as_bytes(o) for o in hosts[:-1]]
            cols = _list_grid_columns(ch, segs)
            if cols:  # the flat form's layout, copied out to the list at the end
                self._outs = segs
                out = np.empty(sum(s.shape[0] for s in segs), dtype=np.uint8)
                segs = _segments(out, ch.size)
        if cols:
            self._grid = (out, cols)
        self._parts = (segs, as_bytes(hosts[-1]))
        if self._grid is not None:
            grid.all_gather_start(ch, *self._parts, self._grid[1])
        else:
            ring.all_gather_start(ch, *self._parts, ready=self._ready)

    def finish(self, ch: Channel, hosts: list[torch.Tensor]) -> None:
        assert self._parts is not None, "finish before start"
        if self._grid is not None:
            out, cols = self._grid
            grid.all_gather(ch, out, *self._parts, cols, started=True)
            for dst, src in zip(self._outs, self._parts[0], strict=False):
                dst[:] = src
        else:
            ring.all_gather(ch, *self._parts, started=True, final=self._final)


def all_to_all(ch: Channel, outs: list[np.ndarray], ins: list[np.ndarray]) -> None:
    direct.all_to_all(ch, ins, outs)


def gather(ch: Channel, inp: torch.Tensor, outs: list[torch.Tensor] | None, root: int,
           scratch: Scratch) -> None:
    direct.gather(ch, as_bytes(inp), [as_bytes(o) for o in outs] if outs else None, root)
    _joined(ch, scratch)


def scatter(ch: Channel, out: torch.Tensor, ins: list[torch.Tensor] | None, root: int,
            scratch: Scratch) -> None:
    direct.scatter(ch, [as_bytes(i) for i in ins] if ins else None, as_bytes(out), root)
    _joined(ch, scratch)


def barrier(ch: Channel, scratch: Scratch) -> None:
    doubling.barrier(ch, scratch)
