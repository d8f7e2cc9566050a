"""Two-level collectives for groups whose ring steps are too small to pipeline.

A ring of w ranks takes 2(w - 1) steps of one segment (1/w of the buffer) each. Where a
segment is a single chunk (under two ``MIN_CHUNK_BYTES``), nothing on a rank overlaps a
step's fixed cost (receive, reduce, hand the chunk on) with the wire, so that cost adds up
over every hop: a 1 MB all-reduce on 8 ranks pays it 14 times. Laid out as a grid of
``rows`` x ``cols`` (rank r in row r // cols, column r % cols), the same bytes move in three
ring phases:

1. a reduce-scatter along the row (``cols`` ranks): segments of 1/cols of the buffer, large
   enough to be cut into chunks that pipeline; rank r then holds the row's sum of its part;
2. an all-reduce of that part along the column (``rows`` ranks), small steps again but
   2(rows - 1) of them instead of 2(w - 1);
3. an all-gather of the parts along the row.

Each rank sends 2(cols - 1)/cols + 2(rows - 1)/w of the buffer, 2(w - 1)/w in all, as in the
ring, and every link has one sender at a time (recursive halving, tried and dropped, sent
several partners into one host's link at once). Each element's result is made once, by one
rank of a column ring, and copied to the others, so every rank ends with the same bits.
Consecutive ranks share a row: where several ranks run on one machine, the row phases stay
on that machine.

The flat all-gather and reduce-scatter take two of those phases, with the long one (large
blocks, pipelined) along the column so that a row's parts stay one contiguous block: the
all-gather gathers along the row, then the rows' blocks along the column; the reduce-scatter
reduce-scatters the blocks along the column, then the rank's block along the row.
"""

from __future__ import annotations

import functools

import numpy as np

from . import ring
from .base import Channel, Finisher, Reducer, Scratch, chunk_count, split

#: Grids are considered for groups of at least this many ranks (a grid needs two rows and
#: two columns).
MIN_RANKS = 4
#: A grid is used only where the ring has at least this many times its steps that cost a
#: hop. On emulated links (thirtieth session, benchmarks/results/h200/call_s30a, call_s30b;
#: % of the link, grid runs / ring runs): 1 MB on 16 hosts at 5 Gbit, 30 ring steps against
#: 8, read 92-99 / 58-67; 1 MB on 8 and 12 hosts at 10 Gbit (14 against 4, 22 against 4) and
#: 2 MB on 16 (30 against 4) were level; 512 KB on 12 hosts (22 against 8) read 36-44 /
#: 49-63, and 4 against 6 steps (4 hosts) lost too: a grid's two extra phases cost a rank
#: more than they save. Those links give a hop's idle time back from their token bucket,
#: which a switch port cannot, so on a real network the ring's steps cost more than there.
MIN_STEPS_RATIO = 3.5
#: The ``Scratch`` slot of a grid reduce-scatter's part (the ring's use slots 0-3).
PART_SLOT = 8


class _Line:
    """Some ranks of an op's channel (a row or a column) as a channel of their own, ranked
    0..m-1 in the order given. ``flush`` is left to the whole op (one flush at its end: a
    phase's sends never read what a later phase writes before the peer has received it), and
    ``sends_done`` passes through only from the op's last phase."""

    def __init__(self, ch: Channel, members: list[int], last: bool = False):
        self._ch = ch
        self._members = members
        self._last = last
        self.rank = members.index(ch.rank)
        self.size = len(members)
        self.chunk_cap = ch.chunk_cap

    def send(self, peer: int, buf: np.ndarray) -> bool:
        return self._ch.send(self._members[peer], buf)

    def recv(self, peer: int, buf: np.ndarray) -> None:
        self._ch.recv(self._members[peer], buf)

    def flush(self) -> None:
        pass

    def sends_done(self) -> None:
        if self._last:
            self._ch.sends_done()

    def mark(self) -> object:
        return self._ch.mark()

    def wait(self, token: object) -> None:
        self._ch.wait(token)

    def ticket(self, peer: int) -> int:
        return self._ch.ticket(self._members[peer])

    def passed(self, peer: int, ticket: int) -> bool:
        return self._ch.passed(self._members[peer], ticket)


def _steps(m: int, seg_bytes: int, cap: int) -> int:
    """A ring's steps over ``m`` ranks that cost a hop each: all 2(m - 1) where a segment is
    one chunk, else about one per half (the pipeline's fill; later hops overlap the wire)."""
    if m == 1:
        return 0
    return 2 * (m - 1) if chunk_count(seg_bytes, None, cap) == 1 else 2


@functools.lru_cache(maxsize=256)
def columns(n: int, w: int, itemsize: int, cap: int) -> int | None:
    """The row length of the grid an all-reduce of ``n`` elements should use on ``w`` ranks,
    or None for the plain ring. Rows must be long enough to pipeline (their segments cut into
    two chunks or more); of those grids, the one with the fewest steps that cost a hop, if
    the ring has ``MIN_STEPS_RATIO`` times as many. Every rank computes the same (``cap`` is
    agreed per group). Cached: a training loop repeats its sizes."""
    if w < MIN_RANKS:
        return None
    piece_bytes = -(-n // w) * itemsize  # a ring segment, and a grid's column piece
    ring_steps = _steps(w, piece_bytes, cap)
    if ring_steps < 2 * MIN_STEPS_RATIO:  # the ring pipelines: no grid can do that well
        return None
    best, fewest = None, ring_steps
    for cols in range(2, w // 2 + 1):
        row_bytes = -(-n // cols) * itemsize
        if w % cols or chunk_count(row_bytes, None, cap) < 2:
            continue
        steps = _steps(cols, row_bytes, cap) + _steps(w // cols, piece_bytes, cap)
        if steps < fewest:
            best, fewest = cols, steps
    return best if best is not None and fewest * MIN_STEPS_RATIO <= ring_steps else None


def _lines(ch: Channel, cols: int) -> tuple[list[int], list[int]]:
    """The ranks of this rank's row and of its column."""
    row, col = divmod(ch.rank, cols)
    return ([row * cols + c for c in range(cols)],
            list(range(col, ch.size, cols)))


def all_reduce_start(ch: Channel, buf: np.ndarray, cols: int) -> None:
    """The first sends of ``all_reduce``: the row ring's first segment (see
    ``ring.all_reduce_start``)."""
    ring.all_reduce_start(_Line(ch, _lines(ch, cols)[0]), buf)


def all_reduce(ch: Channel, buf: np.ndarray, reduce: Reducer, finish: Finisher,
               scratch: Scratch, cols: int, started: bool = False) -> None:
    """In-place all-reduce of a flat buffer over a grid of rows of ``cols`` ranks
    (``columns``). ``started``: ``all_reduce_start`` already sent the first segment."""
    row, col = _lines(ch, cols)
    mine = ch.rank % cols  # this rank's place in its row: the part it owns
    offs = split(buf.shape[0], cols)
    part = buf[offs[mine]:offs[mine + 1]]
    ring.all_reduce(_Line(ch, row), buf, reduce, None, scratch, started=started, gather=False)
    ring.all_reduce(_Line(ch, col), part, reduce, finish, scratch)
    ring.all_gather(_Line(ch, row, last=True), [buf[offs[i]:offs[i + 1]] for i in range(cols)])
    ch.flush()


def _blocks(flat: np.ndarray, w: int, cols: int) -> list[np.ndarray]:
    """A flat buffer of ``w`` rank parts in rank order, cut by rows: block i holds the parts
    of row i's ranks (``cols`` of them, contiguous)."""
    offs = split(flat.shape[0], w)
    return [flat[offs[i * cols]:offs[(i + 1) * cols]] for i in range(w // cols)]


def all_gather_start(ch: Channel, segs: list[np.ndarray], mine: np.ndarray | None,
                     cols: int) -> None:
    """The first sends of ``all_gather``: this rank's part, along its row."""
    i = ch.rank // cols
    ring.all_gather_start(_Line(ch, _lines(ch, cols)[0]), segs[i * cols:(i + 1) * cols], mine)


def all_gather(ch: Channel, flat: np.ndarray, segs: list[np.ndarray], mine: np.ndarray | None,
               cols: int, started: bool = False) -> None:
    """All-gather into ``flat``, cut into ``segs`` (one per rank, in rank order): along the
    row (single-chunk steps, ``cols - 1`` of them), then the rows' blocks along the column
    (large, so they pipeline). Here the column is the long phase: ``cols`` = w / the
    ``columns`` of the same size. ``mine``: this rank's input (see ``ring.all_gather``)."""
    row, col = _lines(ch, cols)
    i = ch.rank // cols
    ring.all_gather(_Line(ch, row), segs[i * cols:(i + 1) * cols], mine, started=started)
    ring.all_gather(_Line(ch, col, last=True), _blocks(flat, ch.size, cols))
    ch.flush()


def reduce_scatter_start(ch: Channel, flat: np.ndarray, cols: int) -> None:
    """The first sends of ``reduce_scatter``: a row block, along the column."""
    ring.reduce_scatter_start(_Line(ch, _lines(ch, cols)[1]), _blocks(flat, ch.size, cols))


def reduce_scatter(ch: Channel, flat: np.ndarray, out: np.ndarray, reduce: Reducer,
                   finish: Finisher, scratch: Scratch, cols: int, started: bool = False) -> None:
    """Out of place: ``out`` = the reduction over ranks of part ``rank`` of their ``flat``
    (``w`` parts in rank order, only read). The rows' blocks are reduce-scattered along the
    column (large, so they pipeline: this rank gets its column's sum of its row's block), then
    that block along the row (single-chunk steps). ``cols`` as in ``all_gather``."""
    w = ch.size
    row, col = _lines(ch, cols)
    i = ch.rank // cols
    blocks = _blocks(flat, w, cols)
    part = scratch.take(blocks[i].nbytes, out.dtype, PART_SLOT)
    ring.reduce_scatter(_Line(ch, col), blocks, part, reduce, None, scratch, started=started,
                        ends_op=False)
    # The row phase reuses the scratch buffers whose partial sums the column phase sent.
    ch.wait(ch.mark())
    offs = split(flat.shape[0], w)
    base = offs[i * cols]
    segs = [part[offs[i * cols + c] - base:offs[i * cols + c + 1] - base] for c in range(cols)]
    ring.reduce_scatter(_Line(ch, row, last=True), segs, out, reduce, finish, scratch)
    ch.flush()
