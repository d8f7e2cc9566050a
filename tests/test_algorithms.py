"""Algorithms over in-memory fake peers: every rank is a thread, messages are queues.

Exercises ring, doubling and direct schedules for many world sizes and awkward lengths
without sockets or processes, against exact references.
"""

from __future__ import annotations

import queue
import threading

import numpy as np
import pytest
import torch

from mccl.algorithms import base, direct, doubling, grid, ring
from mccl.algorithms.base import Scratch, split
from mccl.reduce import Op, finisher, reducer

TIMEOUT_S = 20.0


class FakeChannel:
    """Channel over per-pair queues. Sends copy the buffer, so the tests also check that
    algorithms never rely on a peer seeing later writes."""

    def __init__(self, rank: int, size: int, boxes: dict):
        self.rank, self.size, self._boxes = rank, size, boxes
        self.chunk_cap = base.MAX_CHUNK_BYTES
        self.sends_done_calls = 0  # a send after sends_done() would break the engine's early start

    def send(self, peer: int, buf: np.ndarray) -> bool:
        assert not self.sends_done_calls, "send after sends_done()"
        self._boxes[(self.rank, peer)].put(buf.copy())
        return False

    def sends_done(self) -> None:
        self.sends_done_calls += 1

    def recv(self, peer: int, buf: np.ndarray) -> None:
        data = self._boxes[(peer, self.rank)].get(timeout=TIMEOUT_S)
        assert data.shape == buf.shape and data.dtype == buf.dtype, (data.shape, buf.shape)
        buf[...] = data

    def flush(self) -> None:
        pass

    def mark(self) -> object:
        return None

    def wait(self, token: object) -> None:
        pass

    def ticket(self, peer: int) -> int:
        return 0

    def passed(self, peer: int, ticket: int) -> bool:
        return True  # sends copy


class HeldSendChannel(FakeChannel):
    """A FakeChannel whose sends keep reading the caller's buffer until a ``wait`` on a later
    ``mark`` (or ``flush``) says they are written, as the engine's sender threads do: the
    peer gets the bytes at once, and a buffer changed while its send is still held fails the
    test (a buffer reused too early)."""

    def __init__(self, rank: int, size: int, boxes: dict):
        super().__init__(rank, size, boxes)
        self._held: list[tuple[np.ndarray, np.ndarray]] = []
        self._done = 0  # sends before this index were checked and released

    def send(self, peer: int, buf: np.ndarray) -> bool:
        super().send(peer, buf)
        self._held.append((buf, buf.copy()))
        return False

    def _release(self, upto: int) -> None:
        for view, sent in self._held[self._done:upto]:
            np.testing.assert_array_equal(view, sent, err_msg="buffer changed while its "
                                                              "send was still held")
        self._done = max(self._done, upto)

    def mark(self) -> object:
        return len(self._held)

    def wait(self, token: object) -> None:
        self._release(int(token))

    def flush(self) -> None:
        self._release(len(self._held))

    def ticket(self, peer: int) -> int:
        return len(self._held)

    def passed(self, peer: int, ticket: int) -> bool:
        """Every other check finds the sender thread caught up (and checks what it held);
        the others find it behind."""
        self._checks = getattr(self, "_checks", 0) + 1
        if ticket <= self._done:
            return True
        if self._checks % 2:
            return False
        self._release(len(self._held))
        return True


def run_all(world: int, fn, channel=FakeChannel) -> list:
    boxes = {(a, b): queue.Queue() for a in range(world) for b in range(world)}
    results: list = [None] * world
    errors: list = []

    def target(r: int) -> None:
        try:
            results[r] = fn(channel(r, world, boxes))
        except BaseException as e:  # noqa: BLE001
            errors.append((r, e))

    threads = [threading.Thread(target=target, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S * 3)
    assert not errors, errors
    assert all(not t.is_alive() for t in threads), "an algorithm hung"
    return results


def data(rank: int, n: int) -> np.ndarray:
    return (np.arange(n, dtype=np.float64) % 17 + rank * 3).astype(np.float64)


WORLDS = [1, 2, 3, 4, 5, 7, 8]
LENGTHS = [0, 1, 3, 10, 1000, 70_001]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("algo", ["ring", "doubling"])
def test_all_reduce(world: int, n: int, algo: str) -> None:
    fn, want = reducer(Op.SUM, torch.float64), sum(data(r, n) for r in range(world))
    mod = {"ring": ring, "doubling": doubling}[algo]

    def body(ch):
        buf = data(ch.rank, n)
        mod.all_reduce(ch, buf, fn, None, Scratch())
        if algo == "ring":  # its last step only receives: it says so once, before it
            assert ch.sends_done_calls == (1 if world > 1 else 0)
        return buf

    for got in run_all(world, body):
        np.testing.assert_array_equal(got, want)


GRIDS = [(4, 2), (6, 2), (6, 3), (8, 2), (8, 4), (9, 3), (12, 3), (12, 4)]


@pytest.mark.parametrize(("world", "cols"), GRIDS)
@pytest.mark.parametrize("n", [0, 1, 5, 1000, 70_001])
@pytest.mark.parametrize("started", [False, True], ids=["one call", "two parts"])
def test_grid_all_reduce(world: int, cols: int, n: int, started: bool) -> None:
    """Every rank ends with the average, bit for bit the same on all (each element's result is
    made once and copied), and says once that its sends are done. 70,001 float64 elements
    make the row phases' segments two chunks or more."""
    fn, fin = reducer(Op.AVG, torch.float64), finisher(Op.AVG, world)
    want = sum(data(r, n) for r in range(world)) / world

    def body(ch):
        buf = data(ch.rank, n)
        if started:
            grid.all_reduce_start(ch, buf, cols)
        grid.all_reduce(ch, buf, fn, fin, Scratch(), cols, started=started)
        assert ch.sends_done_calls == 1
        return buf

    got = run_all(world, body)
    np.testing.assert_allclose(got[0], want, rtol=1e-12)
    for other in got[1:]:
        np.testing.assert_array_equal(other.view(np.uint64), got[0].view(np.uint64))


@pytest.mark.parametrize(("world", "cols"), GRIDS)
@pytest.mark.parametrize("m", [0, 1, 7, 40_001])
@pytest.mark.parametrize("started", [False, True], ids=["one call", "two parts"])
def test_grid_reduce_scatter(world: int, cols: int, m: int, started: bool) -> None:
    """Rank r gets the average of every rank's part r. Sends keep reading their buffers until
    a later mark (``HeldSendChannel``): the row phase reuses the scratch buffers whose partial
    sums the column phase sent only after they are out. 40,001 float64 elements per part make
    the blocks several chunks (partial sums in spares and the pool)."""
    fn, fin = reducer(Op.AVG, torch.float64), finisher(Op.AVG, world)
    flats = [data(r, world * m) for r in range(world)]
    want = sum(flats) / world

    def body(ch):
        out = np.full(m, np.nan)
        scratch = Scratch()
        if started:
            grid.reduce_scatter_start(ch, flats[ch.rank], cols)
        grid.reduce_scatter(ch, flats[ch.rank], out, fn, fin, scratch, cols, started=started)
        assert ch.sends_done_calls == 1
        return out

    for r, got in enumerate(run_all(world, body, HeldSendChannel)):
        np.testing.assert_allclose(got, want[r * m:(r + 1) * m], rtol=1e-12)
    for f, r in zip(flats, range(world), strict=True):  # inputs only read
        np.testing.assert_array_equal(f, data(r, world * m))


@pytest.mark.parametrize(("world", "cols"), GRIDS)
@pytest.mark.parametrize("m", [0, 1, 7, 300_001])
@pytest.mark.parametrize("started", [False, True], ids=["one call", "two parts"])
def test_grid_all_gather(world: int, cols: int, m: int, started: bool) -> None:
    """Every rank ends with every rank's part in rank order (300,001 bytes per part: the
    column phase's blocks are several chunks)."""

    def body(ch):
        flat = np.zeros(world * m, dtype=np.uint8)
        segs = [flat[i * m:(i + 1) * m] for i in range(world)]
        mine = np.full(m, ch.rank + 1, dtype=np.uint8)
        if started:
            grid.all_gather_start(ch, segs, mine, cols)
        grid.all_gather(ch, flat, segs, mine, cols, started=started)
        assert ch.sends_done_calls == 1
        return flat

    want = np.repeat(np.arange(1, world + 1, dtype=np.uint8), m)
    for got in run_all(world, body, HeldSendChannel):
        np.testing.assert_array_equal(got, want)


def test_grid_is_chosen_only_where_it_saves_ring_steps() -> None:
    """``columns``: None below ``MIN_RANKS``, for prime sizes, where the ring's segments
    already pipeline and where a grid would not cut the ring's steps 3.5-fold; else a
    divisor of the group whose rows pipeline."""
    cap = base.MAX_CHUNK_BYTES
    mb = (1 << 20) // 4  # float32 elements in 1 MiB
    assert grid.columns(mb // 8, 3, 4, cap) is None
    assert grid.columns(mb, 7, 4, cap) is None
    assert grid.columns(mb, 4, 4, cap) is None  # 256 KiB segments: two chunks each
    assert grid.columns(mb // 2, 4, 4, cap) is None  # 4 steps against the ring's 6
    assert grid.columns(64 * mb, 16, 4, cap) is None
    assert grid.columns(mb, 8, 4, cap) == 4  # rows of 256 KiB parts, then columns of two
    assert grid.columns(mb, 16, 4, cap) == 4  # 8 steps against 30
    for w in (4, 6, 8, 12, 16, 24, 36):
        for n in (mb // 8, mb // 2, mb, 4 * mb):
            cols = grid.columns(n, w, 4, cap)
            assert cols is None or (w % cols == 0 and 2 <= cols <= w // 2
                                    and base.chunk_count(-(-n // cols) * 4, None, cap) >= 2)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("algo", ["ring", "doubling"])
@pytest.mark.parametrize("op", [Op.MAX, Op.MIN])
def test_all_reduce_bits_agree_where_operands_compare_equal(world: int, algo: str,
                                                            op: Op) -> None:
    """-0.0 and 0.0 (and NaNs of different payloads) compare equal, and MIN / MAX return one
    operand by its position: every rank must still end with the same bits."""
    fn = reducer(op, torch.float32)
    nan_a = np.array([0x7FC00001], dtype=np.uint32).view(np.float32)[0]
    nan_b = np.array([0x7FC00002], dtype=np.uint32).view(np.float32)[0]
    mod = {"ring": ring, "doubling": doubling}[algo]

    def body(ch):
        even = ch.rank % 2 == 0
        buf = np.array([-0.0, 0.0, nan_a, 1.0] if even else [0.0, -0.0, nan_b, 1.0],
                       dtype=np.float32)
        mod.all_reduce(ch, buf, fn, None, Scratch())
        return buf.view(np.uint32).copy()

    got = run_all(world, body)
    for bits in got[1:]:
        np.testing.assert_array_equal(bits, got[0])


@pytest.mark.parametrize("world", [2, 3, 5])
@pytest.mark.parametrize("n", [1, 7, 70_001])
def test_ring_all_reduce_started_matches_one_call(world: int, n: int) -> None:
    """``all_reduce_start`` then ``all_reduce(started=True)``: the same result as one call
    (a frame too many or too few would fail the receives' shape checks or hang)."""
    fn, want = reducer(Op.SUM, torch.float64), sum(data(r, n) for r in range(world))
    chunk = 4096

    def body(ch):
        buf = data(ch.rank, n)
        ring.all_reduce_start(ch, buf, chunk)
        ring.all_reduce(ch, buf, fn, None, Scratch(), chunk, started=True)
        assert ch.sends_done_calls == 1
        return buf

    for got in run_all(world, body):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("world", [w for w in WORLDS if w > 1])
@pytest.mark.parametrize("n", [1, 5, 1234])
def test_ring_all_reduce_chunk_hooks(world: int, n: int) -> None:
    """ready(s, j) comes before chunk j of segment s is first read (it holds NaN until then),
    once per chunk, in the order of copy_plan's pieces; final(s, j) comes once the chunk
    holds its result, which never changes afterwards: the rank's own segment first, then the
    segments as received, the one after the rank's last."""
    fn, want = reducer(Op.SUM, torch.float64), sum(data(r, n) for r in range(world))
    chunk_bytes = 256  # several chunks per segment (13 at n=1234, world 3)

    def body(ch):
        r, real = ch.rank, data(ch.rank, n)
        buf = np.full(n, np.nan)
        offs = split(n, world)
        plan = ring.copy_plan(n, world, r, buf.itemsize, chunk_bytes)
        k = len(plan.starts[0])
        cuts = [[offs[s] + c for c in split(offs[s + 1] - offs[s], k)] for s in range(world)]
        readies, finals = [], []

        def ready(s: int, j: int) -> None:
            a, b = cuts[s][j], cuts[s][j + 1]
            readies.append((a, b))
            buf[a:b] = real[a:b]

        def final(s: int, j: int) -> None:
            a, b = cuts[s][j], cuts[s][j + 1]
            finals.append((s, j, buf[a:b].copy()))

        ring.all_reduce(ch, buf, fn, None, Scratch(), chunk_bytes, ready=ready, final=final)
        assert len(readies) == len(finals) == world * k  # once per chunk, empty ones too
        # chunks are first read in the pieces' order, and the pieces tile the buffer
        pieces = [i for a, b in plan.ranges for i in range(a, b)]
        assert [i for a, b in readies for i in range(a, b)] == pieces
        assert sorted(pieces) == list(range(n))
        assert [s for s, _, _ in finals[::k]] == [(r - i) % world for i in range(world)]
        for s, j, seen in finals:
            np.testing.assert_array_equal(seen, buf[cuts[s][j]:cuts[s][j + 1]])
        return buf

    for got in run_all(world, body):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("n", [0, 1, 5, 1234])
@pytest.mark.parametrize("how", ["one call", "two parts", "more sends follow"])
def test_reduce_scatter_out_of_place(world: int, n: int, how: str) -> None:
    """Also in two parts (reduce_scatter_start, then started=True), and with ends_op=False
    (a reduce's gather follows): no sends_done() then; else exactly one, before the last
    step (FakeChannel fails any send after it)."""
    fn = reducer(Op.MAX, torch.float64)
    fin = finisher(Op.MAX, world)
    def body(ch):
        src = [data(ch.rank, n) + i for i in range(world)]
        keep = [s.copy() for s in src]
        out = np.full(n, -1.0)
        if how == "two parts":
            ring.reduce_scatter_start(ch, src, 256)
        ring.reduce_scatter(ch, src, out, fn, fin, Scratch(), 256, started=how == "two parts",
                            ends_op=how != "more sends follow")
        signals = 1 if world > 1 and how != "more sends follow" else 0
        assert ch.sends_done_calls == signals
        for a, b in zip(src, keep, strict=True):
            np.testing.assert_array_equal(a, b)  # inputs are only read
        return out

    for r, got in enumerate(run_all(world, body)):
        want = np.max([data(q, n) + r for q in range(world)], axis=0) if n else np.zeros(0)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("pool", [0, 1, 3], ids=lambda n: f"pool{n}")
@pytest.mark.parametrize("spares", [1, 2, 3])
@pytest.mark.parametrize("world", [2, 3, 4, 5, 8])
def test_reduce_scatter_reuses_a_buffer_only_after_its_sends(
        world: int, spares: int, pool: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """However many segment buffers and pool slots the partial sums rotate through, none is
    overwritten while a send that reads it is still held (the channel reports every other
    check that the sender has caught up), and the result is exact."""
    monkeypatch.setattr(ring, "REDUCE_SCATTER_SPARES", spares)
    monkeypatch.setattr(ring, "REDUCE_SCATTER_POOL_SLOTS", pool)
    fn, fin, n = reducer(Op.SUM, torch.float64), finisher(Op.SUM, world), 3000

    def body(ch):
        src = [data(ch.rank, n) + 7 * i for i in range(world)]
        out = np.full(n, -1.0)
        ring.reduce_scatter(ch, src, out, fn, fin, Scratch(), 2048)
        return out

    for r, got in enumerate(run_all(world, body, HeldSendChannel)):
        np.testing.assert_array_equal(got, sum(data(q, n) + 7 * r for q in range(world)))


def test_held_send_channel_catches_a_buffer_reused_too_early() -> None:
    """The check above can fail: a rank that overwrites a buffer before waiting is caught."""

    def body(ch):
        buf = np.arange(4.0)
        if ch.rank == 0:
            ch.send(1, buf)
            mark = ch.mark()
            buf += 1  # too early: the send before `mark` may still read it
            ch.wait(mark)
        else:
            ch.recv(0, buf)
        return buf

    with pytest.raises(AssertionError, match="still held"):
        run_all(2, body, HeldSendChannel)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("started", [False, True], ids=["one call", "two parts"])
def test_all_gather_uneven(world: int, started: bool) -> None:
    sizes = [(3 * r + 1) % 5 for r in range(world)]  # includes empty segments

    def body(ch):
        segs = [np.zeros(sizes[i], dtype=np.uint8) for i in range(world)]
        mine = np.full(sizes[ch.rank], ch.rank + 1, dtype=np.uint8)
        if started:
            ring.all_gather_start(ch, segs, mine, chunk_bytes=1)
        ring.all_gather(ch, segs, mine, chunk_bytes=1, started=started)
        assert ch.sends_done_calls == (1 if world > 1 else 0)
        return segs

    for segs in run_all(world, body):
        for i, s in enumerate(segs):
            np.testing.assert_array_equal(s, np.full(sizes[i], i + 1, dtype=np.uint8))


@pytest.mark.parametrize("world", [w for w in WORLDS if w > 1])
@pytest.mark.parametrize("n", [1, 5, 1234])
@pytest.mark.parametrize("started", [False, True], ids=["one call", "two parts"])
def test_ring_all_gather_and_reduce_scatter_chunk_hooks(world: int, n: int,
                                                        started: bool) -> None:
    """The staged flat forms' hooks, on the all-reduce's plan for the same n items:
    reduce-scatter calls ready(s, j) before it reads chunk j of input segment s (NaN until
    then), once per chunk, in the order of the plan's pieces, and final(rank, j) once chunk j
    of its output holds the result, in order; all-gather's start calls ready(rank, j) before
    it reads chunk j of its input (NaN until then), in order, and final(s, j) once chunk j
    of segment s holds its data, once per chunk, each segment's in order, so a piece is
    whole when its last chunk's final comes."""
    chunk_bytes = 256

    def body(ch):
        r = ch.rank
        offs = split(world * n, world)
        plan = ring.copy_plan(world * n, world, r, 8, chunk_bytes)
        k = len(plan.starts[0])
        cuts = [[offs[s] + c for c in split(offs[s + 1] - offs[s], k)] for s in range(world)]
        real = data(r, world * n)
        inp = np.full(world * n, np.nan)
        src = [inp[offs[i]:offs[i + 1]] for i in range(world)]
        readies: list[tuple[int, int]] = []

        def ready(s: int, j: int) -> None:
            a, b = cuts[s][j], cuts[s][j + 1]
            readies.append((a, b))
            inp[a:b] = real[a:b]

        out = np.full(n, np.nan)
        mine = [(cuts[r][j] - offs[r], cuts[r][j + 1] - offs[r]) for j in range(k)]
        want = sum(data(q, world * n) for q in range(world))[offs[r]:offs[r + 1]]
        done: list[int] = []

        def out_final(s: int, j: int) -> None:
            assert s == r
            done.append(j)
            a, b = mine[j]
            np.testing.assert_array_equal(out[a:b], want[a:b])

        fn, fin = reducer(Op.SUM, torch.float64), finisher(Op.SUM, world)
        if started:
            ring.reduce_scatter_start(ch, src, chunk_bytes, ready=ready)
        ring.reduce_scatter(ch, src, out, fn, fin, Scratch(), chunk_bytes, started=started,
                            ready=ready, final=out_final)
        assert len(readies) == world * k
        pieces = [i for a, b in plan.ranges for i in range(a, b)]
        assert [i for a, b in readies for i in range(a, b)] == pieces
        assert done == list(range(k))

        ch.sends_done_calls = 0  # the all-gather is a second op (a fresh channel in mccl)
        gathered = np.full(world * n, np.nan)
        segs = [gathered[offs[i]:offs[i + 1]] for i in range(world)]
        finals: list[tuple[int, int]] = []
        ends = 0

        def final(s: int, j: int) -> None:
            nonlocal ends
            finals.append((s, j))
            a, b = cuts[s][j], cuts[s][j + 1]
            assert not np.isnan(gathered[a:b]).any()
            p = plan.ends[s][j]
            if p >= 0:  # the piece ending here is whole
                ends += 1
                pa, pb = plan.ranges[p]
                assert not np.isnan(gathered[pa:pb]).any()

        inp = out
        if started:  # the input is NaN until its chunk's ready
            inp = np.full(n, np.nan)
            read: list[int] = []

            def in_ready(s: int, j: int) -> None:
                assert s == r
                read.append(j)
                a, b = mine[j]
                inp[a:b] = out[a:b]

            ring.all_gather_start(ch, segs, inp, chunk_bytes, ready=in_ready)
            assert read == list(range(k))
        ring.all_gather(ch, segs, inp, chunk_bytes, started=started, final=final)
        assert sorted(finals) == [(s, j) for s in range(world) for j in range(k)]
        for s in range(world):
            assert [j for t, j in finals if t == s] == list(range(k))
        assert ends == len(plan.ranges)
        return out, gathered

    want = sum(data(r, world * n) for r in range(world))
    offs = split(world * n, world)
    for r, (out, gathered) in enumerate(run_all(world, body)):
        np.testing.assert_array_equal(out, want[offs[r]:offs[r + 1]])
        np.testing.assert_array_equal(gathered, want)


@pytest.mark.parametrize("world", WORLDS)
def test_broadcasts_and_barrier(world: int) -> None:
    def body(ch):
        out = []
        for root in range(world):
            a = np.arange(5000, dtype=np.int32) if ch.rank == root else np.zeros(5000, np.int32)
            ring.broadcast(ch, a, root, chunk_bytes=1024)
            b = np.arange(7, dtype=np.int32) if ch.rank == root else np.zeros(7, np.int32)
            doubling.broadcast(ch, b, root)
            out.append((a.copy(), b.copy()))
        doubling.barrier(ch, Scratch())
        return out

    for res in run_all(world, body):
        for a, b in res:
            np.testing.assert_array_equal(a, np.arange(5000, dtype=np.int32))
            np.testing.assert_array_equal(b, np.arange(7, dtype=np.int32))


def test_split_is_even_and_complete() -> None:
    for n in range(0, 40):
        for parts in range(1, 9):
            offs = split(n, parts)
            sizes = np.diff(offs)
            assert offs[0] == 0 and offs[-1] == n and sizes.max() - sizes.min() <= 1


@pytest.mark.parametrize("world", WORLDS)
def test_direct_all_to_all_gather_scatter(world: int) -> None:
    def body(ch):
        r = ch.rank
        sends = [np.full((r + p) % 3, 10 * r + p, dtype=np.int16) for p in range(world)]
        recvs = [np.zeros((p + r) % 3, dtype=np.int16) for p in range(world)]
        direct.all_to_all(ch, sends, recvs)
        root = world - 1
        got = [np.zeros(2, np.int16) for _ in range(world)] if r == root else None
        direct.gather(ch, np.full(2, r, np.int16), got, root)
        part = np.zeros(3, np.int16)
        direct.scatter(ch, [np.full(3, p, np.int16) for p in range(world)] if r == 0 else None,
                       part, 0)
        return recvs, got, part

    for r, (recvs, got, part) in enumerate(run_all(world, body)):
        for p in range(world):
            np.testing.assert_array_equal(recvs[p], np.full((p + r) % 3, 10 * p + r, np.int16))
        if got is not None:
            for p in range(world):
                np.testing.assert_array_equal(got[p], np.full(2, p, np.int16))
        np.testing.assert_array_equal(part, np.full(3, r, np.int16))


class RecordingChannel(FakeChannel):
    """A FakeChannel that logs its sends and receives in order."""

    def __init__(self, rank: int, size: int, boxes: dict):
        super().__init__(rank, size, boxes)
        self.log: list[tuple[str, int]] = []

    def send(self, peer: int, buf: np.ndarray) -> bool:
        self.log.append(("send", peer))
        return super().send(peer, buf)

    def recv(self, peer: int, buf: np.ndarray) -> None:
        super().recv(peer, buf)
        self.log.append(("recv", peer))


@pytest.mark.parametrize("world", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("sizes", ["large", "small", "mixed"])
def test_all_to_all_schedule_and_values(world: int, sizes: str) -> None:
    """Large messages go a step at a time (the send to r + s only after the receive from
    r - s + 1), small ones all at once; with uneven splits ranks pick differently, and every
    mix completes with the right values."""
    big = direct.ALL_TO_ALL_PAIRWISE_BYTES

    def count(src: int, dst: int) -> int:
        large = sizes == "large" or (sizes == "mixed" and src % 2 == 0)
        return big + 8 * (src + dst) if large else 3 + src + dst

    def body(ch):
        r = ch.rank
        sends = [np.full(count(r, p), r * 16 + p, dtype=np.uint8) for p in range(world)]
        recvs = [np.zeros(count(p, r), dtype=np.uint8) for p in range(world)]
        direct.all_to_all(ch, sends, recvs)
        return recvs, ch.log

    for r, (recvs, log) in enumerate(run_all(world, body, RecordingChannel)):
        for p in range(world):
            np.testing.assert_array_equal(recvs[p], np.full(count(p, r), p * 16 + r, np.uint8))
        order = [(r + s) % world for s in range(1, world)]
        sends = [peer for kind, peer in log if kind == "send"]
        assert sends == order and [peer for kind, peer in log if kind == "recv"] == [
            (r - s) % world for s in range(1, world)]
        if count(r, (r + 1) % world) >= big:  # the rank's largest send decides; here all are
            want = [x for s in range(1, world)
                    for x in (("send", (r + s) % world), ("recv", (r - s) % world))]
        else:
            want = [("send", p) for p in order] + [("recv", (r - s) % world)
                                                   for s in range(1, world)]
        assert log == want, (r, log)
