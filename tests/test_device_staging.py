"""The generic staging hand-off (mccl.device.staging) on CPU with a fake asynchronous device.

What CUDA and MPS-staging share is tested here, so CI (no accelerator) covers it: the comm
thread waits for the producer's marker before copying out (O1), copies run in the adapter's
own context, the copy back is fenced and the consumer is gated on that fence (O2), host
buffers are pooled and never reused before their last copy finished.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from mccl.algorithms import base, ring
from mccl.algorithms.base import split
from mccl.algorithms.ring import PIECE_MAX_BYTES, copy_plan, first_use
from mccl.bench.spawn import run_ranks
from mccl.device import staging
from mccl.device.cpu import CpuAdapter
from mccl.device.staging import HostOps, HostPool, StagingAdapter, StagingHandoff
from tests.device_fakes import FakeAsyncOps, FakeEvent, install_fake_staging, slow_fill
from tests.threads import on_thread


def _adapter(**kw) -> tuple[StagingAdapter, FakeAsyncOps]:
    ops = FakeAsyncOps(**kw)
    return StagingAdapter("fake", ops, HostPool(ops.alloc_host)), ops


def test_comm_thread_waits_for_the_producer_marker() -> None:
    adapter, ops = _adapter(copy_delay=0.001)
    t = torch.zeros(1000)
    slow_fill(ops.current, t, 3.0, delay=0.1)  # the "kernel" is still running at prepare
    h = adapter.prepare([t], [True], [True])
    hosts = on_thread(h.acquire)
    assert torch.equal(hosts[0], torch.full((1000,), 3.0))
    assert ops.ready_events[0].sync_threads == ["comm"]


def test_side_stream_can_wait_for_the_producer_marker_instead() -> None:
    """CUDA's order: the side stream waits for the marker, so the copies are enqueued before
    the producer is done; the comm thread then sleeps on the marker itself (the long wait) and
    only after it on the copy's fence (which may spin); what it reads is still the produced
    value, and outputs copied back land after the producer's kernels."""
    adapter, ops = _adapter(copy_delay=0.001, stream_ordered=True)
    t, out = torch.zeros(1000), torch.zeros(10)
    slow_fill(ops.current, t, 3.0, delay=0.1)
    slow_fill(ops.current, out, 1.0, delay=0.0)  # the producer also writes the output
    h = adapter.prepare([t, out], [True, False], [False, True])

    def comm() -> list[torch.Tensor]:
        hosts = h.acquire()
        hosts[1].fill_(7.0)
        h.release()
        return hosts

    hosts = on_thread(comm)
    assert torch.equal(hosts[0], torch.full((1000,), 3.0))
    assert sorted(ops.ready_events[0].sync_threads) == ["comm", "fake-side"]
    out_fence = ops.fences[0]
    assert out_fence.sync_threads == ["comm"]
    ops.side.synchronize()
    assert torch.equal(out, torch.full((10,), 7.0))


def test_comm_thread_sleeps_on_a_passed_marker_never() -> None:
    """Where the producer is already done, the comm thread waits for its copies only."""
    adapter, ops = _adapter(copy_delay=0.001, stream_ordered=True)
    t = torch.full((100,), 2.0)
    h = adapter.prepare([t], [True], [True])
    ops.current.synchronize()  # the marker has passed
    hosts = on_thread(h.acquire)
    assert torch.equal(hosts[0], t)
    assert "comm" not in ops.ready_events[0].sync_threads
    assert ops.fences[0].sync_threads == ["comm"]


def test_copy_back_is_fenced_and_gates_the_consumer() -> None:
    adapter, ops = _adapter(copy_delay=0.05)  # copy back lands late on the side stream
    t = torch.ones(64)
    h = adapter.prepare([t], [True], [True])

    def comm() -> None:
        hosts = h.acquire()
        hosts[0].mul_(5)
        h.release()

    on_thread(comm)
    gate = h.gate()
    assert gate is not None
    gate()  # the caller's stream now waits for the copy back
    seen: list[torch.Tensor] = []
    ops.current.enqueue(lambda: seen.append(t.clone()))
    ops.current.synchronize()
    assert torch.equal(seen[0], torch.full((64,), 5.0))


def test_only_read_tensors_are_copied_out_and_only_written_ones_back() -> None:
    adapter, ops = _adapter()
    a, b, c = torch.arange(4.0), torch.zeros(4), torch.zeros(4)
    h = adapter.prepare([a, b, c], [True, False, True], [False, True, False])
    hosts = on_thread(h.acquire)
    assert [d for d, _ in ops.copies] == ["out", "out"]
    hosts[1].copy_(hosts[0] + hosts[2] + 1)
    on_thread(h.release)
    assert [d for d, _ in ops.copies] == ["out", "out", "back"]
    ops.side.synchronize()
    assert torch.equal(b, torch.arange(4.0) + 1)
    assert torch.equal(a, torch.arange(4.0))


def test_copies_run_on_the_comm_thread_unless_the_device_forbids_it() -> None:
    adapter, ops = _adapter()
    t = torch.ones(8)
    h = adapter.prepare([t], [True], [True])
    on_thread(lambda: (h.acquire(), h.release()))
    assert {th for _, th in ops.copies} == {"comm"}

    adapter, ops = _adapter(copy_out_on_caller=True)
    h = adapter.prepare([t], [True], [True])
    on_thread(lambda: (h.acquire(), h.release()))
    me = threading.current_thread().name
    assert ops.copies == [("out", me), ("back", "comm")]


def test_a_caller_copy_of_what_an_earlier_op_writes_back_waits_for_that_op() -> None:
    """A one-stream device copies out on the caller's thread, except a storage an op issued
    before still has to copy back into: that op's copy out moves to the comm thread, after
    the copy back (so it reads the earlier op's result, as the issue order says)."""
    adapter, ops = _adapter(copy_out_on_caller=True, copy_delay=0.005)
    t, out, u = torch.ones(100), torch.zeros(100), torch.ones(10)
    h1 = adapter.prepare([t], [True], [True])  # all_reduce(t)
    h2 = adapter.prepare([out, t], [False, True], [True, False])  # gathers t into out
    h3 = adapter.prepare([u], [True], [True])  # unrelated
    me = threading.current_thread().name
    assert ops.copies == [("out", me), ("out", me)]  # t for h1, u for h3; not t for h2

    def comm() -> torch.Tensor:
        h1.acquire()[0].mul_(3)
        h1.release()
        seen = h2.acquire()[1].clone()
        h2.release()
        h3.acquire()
        h3.release()
        return seen

    assert torch.equal(on_thread(comm), torch.full((100,), 3.0))
    assert ops.copies[2:4] == [("back", "comm"), ("out", "comm")]
    assert not adapter.pending._count  # every write was released


def test_host_buffers_are_pooled_and_reused_only_after_their_fence() -> None:
    adapter, ops = _adapter(copy_delay=0.01)
    for i in range(5):
        t = torch.full((256,), float(i))
        h = adapter.prepare([t], [True], [True])

        def comm(h: StagingHandoff = h) -> None:
            h.acquire()[0].add_(1)
            h.release()

        on_thread(comm)
        ops.side.synchronize()
        assert torch.equal(t, torch.full((256,), float(i + 1)))
    assert ops.host_allocs == 1
    assert adapter.pool.held_bytes == 256 * 4
    # every copy-back fence but the last was waited on by the next op's take()
    assert all(f.syncs >= 1 for f in ops.fences[1:-1:2])


def test_in_order_copies_reuse_pooled_buffers_without_waiting_on_the_copy_back() -> None:
    """CUDA's case: every copy runs in order on the side stream, so a buffer given back behind
    a slow copy back is taken again at once. The next op's copy out queues behind that copy
    back, and the CPU touches the buffer only after its own fence: a write-only output (no
    copy out, the CPU writes the whole buffer) must not reach the earlier op's tensor."""
    adapter, ops = _adapter(copy_delay=0.02, stream_ordered=True, copies_in_order=True)
    a, b = torch.full((256,), 1.0), torch.zeros(256)
    ha = adapter.prepare([a], [True], [True])

    def comm_a() -> None:
        ha.acquire()[0].add_(1)
        ha.release()

    on_thread(comm_a)
    back = ops.fences[-1]  # a's copy back, still running (copy_delay)
    hb = adapter.prepare([b], [False], [True])

    def comm_b() -> None:
        hb.acquire()[0].fill_(7.0)
        hb.release()

    on_thread(comm_b)
    ops.side.synchronize()
    assert torch.equal(a, torch.full((256,), 2.0))  # a's result, not b's bytes
    assert torch.equal(b, torch.full((256,), 7.0))
    assert ops.host_allocs == 1  # b took a's buffer
    assert back.syncs == 0  # ... without the pool waiting for a's copy back


def test_pool_waits_for_the_fence_of_a_returned_buffer() -> None:
    pool = HostPool(lambda n: torch.empty(n, dtype=torch.uint8))
    ev = FakeEvent()
    buf = pool.take(16)
    pool.give(buf, ev)
    stream_done = threading.Timer(0.05, ev._done.set)
    stream_done.start()
    again = pool.take(16)
    assert again.data_ptr() == buf.data_ptr() and ev.syncs == 1
    assert pool.allocations == 1


def test_pool_bounds_what_it_keeps() -> None:
    pool = HostPool(lambda n: torch.empty(n, dtype=torch.uint8), max_bytes=100, per_size=2)
    bufs = [pool.take(40) for _ in range(3)]
    for b in bufs:
        pool.give(b, None)
    assert pool.held_bytes == 80
    pool.give(pool.take(60), None)  # over max_bytes with what is held: dropped
    assert pool.held_bytes == 80


@pytest.mark.parametrize("shape", [(12,), (3, 4), (2, 1, 3, 2)], ids=["1d", "2d", "4d"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int64, torch.bool])
def test_dtypes_shapes_and_empty_tensors_round_trip(dtype: torch.dtype, shape) -> None:
    adapter, ops = _adapter()
    t = (torch.arange(12) % 2).to(dtype).view(shape)
    e = torch.empty(0, dtype=dtype)
    h = adapter.prepare([t, e], [True, True], [True, True])

    def comm() -> None:
        hosts = h.acquire()
        assert hosts[0].dtype == dtype and hosts[0].shape == shape and hosts[1].numel() == 0
        assert torch.equal(hosts[0], t)
        hosts[0].copy_(1 - hosts[0].to(torch.int64)) if dtype != torch.bool else \
            hosts[0].logical_not_()
        h.release()

    on_thread(comm)
    ops.side.synchronize()
    assert torch.equal(t.to(torch.int64), 1 - (torch.arange(12) % 2).view(shape))


def test_result_context_and_gate_come_from_the_device() -> None:
    adapter, ops = _adapter()
    h = adapter.prepare([torch.ones(2)], [True], [False])
    on_thread(lambda: (h.acquire(), h.release()))
    assert h.gate() is None  # nothing written back: nothing to gate on
    ctx = h.result_context()
    assert ctx is not None
    with ctx():
        pass
    assert ops.result_ctx_used == 1


def test_synchronous_host_ops_stage_correctly() -> None:
    adapter = StagingAdapter("host", HostOps())
    t = torch.arange(6.0)
    h = adapter.prepare([t], [True], [True])
    hosts = h.acquire()
    assert hosts[0].data_ptr() != t.data_ptr()
    hosts[0].neg_()
    h.release()
    assert torch.equal(t, -torch.arange(6.0)) and h.gate() is None


# ---- ranges: a large all-reduce's copies overlap its exchange ----

def _small_ranges(monkeypatch, min_bytes: int = 1 << 10) -> None:
    """Test hook: lower the pipelining threshold instead of staging huge tensors."""
    monkeypatch.setattr(staging, "PIPELINE_MIN_BYTES", min_bytes)


@pytest.mark.parametrize("n,w,chunk", [(0, 1, None), (10, 1, None), (1001, 4, 64), (7, 3, 4),
                                       (3, 5, None), (1 << 20, 8, None), (1 << 22, 4, None),
                                       (5000, 2, 100)])
def test_copy_plan_tiles_the_buffer_in_the_rings_order(n: int, w: int, chunk,
                                                       monkeypatch) -> None:
    """Pieces are whole chunks of one segment, segment by segment in the order the ring first
    reads them; the segment sent first starts with a one-chunk piece, the one final last ends
    with one (with the least piece size at one byte); the others are at most PIECE_MAX_BYTES;
    starts/ends name each piece's first and last chunk."""
    monkeypatch.setattr(ring, "PIECE_MIN_BYTES", 1)
    itemsize = 4
    for r in range(w):
        plan = copy_plan(n, w, r, itemsize, chunk)
        offs = split(n, w)
        k = len(plan.starts[0])
        cuts = [[offs[s] + c for c in split(offs[s + 1] - offs[s], k)] for s in range(w)]
        flat = [i for a, b in plan.ranges for i in range(a, b)]
        assert flat == [i for x in range(w) for s in [first_use(x, w, r)]
                        for i in range(offs[s], offs[s + 1])]  # a tiling, in the ring's order
        for s in range(w):
            starts = [j for j in range(k) if plan.starts[s][j] >= 0]
            ends = [j for j in range(k) if plan.ends[s][j] >= 0]
            assert starts[0] == 0 and ends[-1] == k - 1
            assert [j + 1 for j in ends[:-1]] == starts[1:]
            for j0, j1 in zip(starts, ends, strict=True):
                p = plan.starts[s][j0]
                assert plan.ends[s][j1] == p
                assert plan.ranges[p] == (cuts[s][j0], cuts[s][j1 + 1])
                assert j1 == j0 or (j1 - j0 + 1) * (offs[1] * itemsize // k) <= PIECE_MAX_BYTES
            if w > 1 and s == first_use(0, w, r):
                assert ends[0] == 0  # the first send waits for one chunk's copy only
            if w > 1 and s == (r + 1) % w:
                assert starts[-1] == k - 1  # the last copy back is one chunk


@pytest.mark.parametrize("n,w,chunk", [(1001, 4, 64), (7, 3, 4), (1 << 20, 8, None),
                                       (5000, 2, 100), (10, 1, None)])
def test_own_copy_plan_tiles_this_ranks_segment_small_at_both_edges(n: int, w: int, chunk,
                                                                    monkeypatch) -> None:
    """copy_plan(own=True), for a tensor holding segment r only (a flat all-gather's input,
    sent first; a reduce-scatter's output, final last): its pieces tile that segment from 0
    in order, whole chunks of the ring's cuts, one chunk at both edges (least piece one
    byte); no other segment has pieces."""
    monkeypatch.setattr(ring, "PIECE_MIN_BYTES", 1)
    offs = split(n, w)
    for r in range(w):
        plan = copy_plan(n, w, r, 4, chunk, own=True)
        whole = copy_plan(n, w, r, 4, chunk)
        assert plan.cuts == whole.cuts
        k = len(plan.starts[0])
        assert [i for a, b in plan.ranges for i in range(a, b)] == list(
            range(offs[r + 1] - offs[r]))
        for s in range(w):
            if s != r:
                assert set(plan.starts[s]) == set(plan.ends[s]) == {-1}
        starts = [j for j in range(k) if plan.starts[r][j] >= 0]
        ends = [j for j in range(k) if plan.ends[r][j] >= 0]
        assert plan.starts[r][0] == 0 and plan.ends[r][-1] == len(plan.ranges) - 1
        for p, (j0, j1) in enumerate(zip(starts, ends, strict=True)):
            assert plan.starts[r][j0] == plan.ends[r][j1] == p
            assert plan.ranges[p] == (plan.cuts[r][j0] - offs[r], plan.cuts[r][j1 + 1] - offs[r])
        if k > 1:
            assert ends[0] == 0 and starts[-1] == k - 1


def test_tensors_whose_segments_are_not_cut_are_copied_whole() -> None:
    """staging_ranges: ranges only where some segment is cut into more than one piece
    (shipped piece sizes); otherwise None, and the hand-off copies the tensor whole."""
    from mccl.collectives import staging_ranges

    for cap in (base.MAX_CHUNK_BYTES, base.CPU_BOUND_CHUNK_BYTES):
        for w in (2, 3, 4, 8):
            for r in range(w):
                assert staging_ranges(torch.empty(w << 18), w, r, cap) is None  # 1 MiB segments
                cut = staging_ranges(torch.empty(w << 20), w, r, cap)  # 4 MiB segments
                assert cut is not None and len(cut) > w
                half = staging_ranges(torch.empty(w << 19, dtype=torch.bfloat16), w, r, cap)
                assert half is not None  # rings in float32: 4 MiB segments again
    adapter, _ = _adapter()
    h = adapter.prepare([torch.ones(1 << 20)], [True], [True])
    assert not h.pipeline(lambda: None)  # the hand-off then stays whole


def test_copy_plan_edge_pieces_are_not_smaller_than_the_least_piece() -> None:
    """Each piece costs a copy call and a fence: edge pieces start at PIECE_MIN_BYTES (1 MiB
    of float32 here), and segments too small to split stay whole."""
    mib = 1 << 20
    plan = copy_plan(64 * mib // 4, 4, 0, 4, cap=mib)  # 16 MiB segments of 1 MiB chunks
    sizes = [(b - a) * 4 for a, b in plan.ranges]
    assert sizes[:4] == [mib, mib, 2 * mib, 4 * mib] and sizes[-1] == 4 * mib
    assert max(sizes) == ring.PIECE_MAX_BYTES
    assert len(copy_plan(4 * mib // 4, 4, 0, 4).ranges) == 4  # 1 MiB segments: whole


def _produce(ops: FakeAsyncOps, t: torch.Tensor, value: torch.Tensor, delay: float = 0.05):
    """A "kernel" on the caller's stream that writes ``value`` into t some time later."""

    def run() -> None:
        time.sleep(delay)
        t.copy_(value)

    ops.current.enqueue(run)


def test_ranges_wait_for_their_own_copy_only_and_copy_back_early(monkeypatch) -> None:
    _small_ranges(monkeypatch)
    adapter, ops = _adapter(copy_delay=0.01)
    n = 1001
    t = torch.zeros(n)
    want = torch.arange(float(n))
    _produce(ops, t, want)  # still running at prepare: acquire must wait for the marker (O1)
    h = adapter.prepare([t], [True], [True])
    ranges = [(500, 1001), (0, 250), (250, 500)]  # any tiling, in the order the body uses it
    assert h.pipeline(lambda: ranges)

    def comm() -> list:
        host = h.acquire()[0].view(-1)
        assert [d for d, _ in ops.copies] == ["out"] * 2  # the first two ranges' copies
        assert len(ops.fences) == 2  # one fence per range, none waited by acquire
        log, got = [], []
        for i, (a, b) in enumerate(ranges):
            h.wait_range(i)  # (the third copy out is enqueued once the first is waited for)
            outs = ops.fences[:3]
            assert [f.syncs for f in outs] == [1] * (i + 1) + [0] * (2 - i)
            got.append(host[a:b].clone())
            host[a:b].mul_(2)
            h.copy_back(i)
            h.copy_back(i)  # once per range
            log.append([d for d, _ in ops.copies])
        h.release()
        return [log, got]

    log, got = on_thread(comm)
    for (a, b), g in zip(ranges, got, strict=True):  # each range copied before its use
        assert torch.equal(g, want[a:b])
    # range i's copy back is enqueued before range i+1 runs
    assert log == [["out"] * 3 + ["back"], ["out"] * 3 + ["back"] * 2,
                   ["out"] * 3 + ["back"] * 3]
    assert {th for _, th in ops.copies} == {"comm"}  # O3: copies only from the comm thread
    assert len(ops.fences) == 4  # ... and one completion fence, recorded after the last
    gate = h.gate()
    assert gate is not None
    gate()  # the consumer's stream waits for the completion fence (O2)
    seen: list[torch.Tensor] = []
    ops.current.enqueue(lambda: seen.append(t.clone()))
    ops.current.synchronize()
    assert torch.equal(seen[0], 2 * want)


def test_copies_out_run_a_bounded_distance_ahead(monkeypatch) -> None:
    """Ranks sharing a device each enqueuing a whole tensor's copies made a rank's first range
    wait behind the others': acquire enqueues two ranges, each wait keeps COPY_AHEAD_BYTES
    beyond the waited range enqueued, in order; release copies back only what was copied
    out (a body that stopped early leaves the rest of the tensor alone)."""
    _small_ranges(monkeypatch)
    monkeypatch.setattr(staging, "COPY_AHEAD_BYTES", 1000)
    adapter, ops = _adapter(copy_delay=0.001)
    t = torch.arange(1000.0)
    ranges = [(i * 100, i * 100 + 100) for i in range(10)]  # 400 bytes each
    h = adapter.prepare([t], [True], [True])
    assert h.pipeline(lambda: ranges)

    def outs() -> list:
        return [i for i, (d, _) in enumerate(ops.copies) if d == "out"]

    def comm() -> list:
        host = h.acquire()[0].view(-1)
        seen = [len(outs())]
        for i in range(6):
            h.wait_range(i)
            host[ranges[i][0]:ranges[i][1]].neg_()
            h.copy_back(i)
            seen.append(len(outs()))
        h.release()
        return seen

    # after range i's wait: the ranges starting before 400 * (i + 1) + 1000 bytes
    assert on_thread(comm) == [2, 4, 5, 6, 7, 8, 9]
    h.gate()()
    ops.current.synchronize()
    assert [d for d, _ in ops.copies].count("back") == 9  # the ranges copied out
    assert torch.equal(t, torch.cat([-torch.arange(600.0), torch.arange(600.0, 1000.0)]))


def test_release_copies_back_the_ranges_not_copied_back(monkeypatch) -> None:
    _small_ranges(monkeypatch)
    adapter, ops = _adapter(copy_delay=0.005)
    t = torch.arange(777.0)
    h = adapter.prepare([t], [True], [True])
    ranges = [(259, 518), (0, 259), (518, 777)]
    assert h.pipeline(lambda: ranges)

    def comm() -> None:
        host = h.acquire()[0].view(-1)
        for i, (a, b) in enumerate(ranges):
            h.wait_range(i)
            host[a:b].neg_()
        h.copy_back(1)
        h.release()

    on_thread(comm)
    assert [d for d, _ in ops.copies].count("back") == 3
    h.gate()()
    ops.current.synchronize()
    assert torch.equal(t, -torch.arange(777.0))


def test_a_ranged_output_is_copied_back_range_by_range_in_bytes(monkeypatch) -> None:
    """A flat all-gather's case: the output is only written, so nothing of it is copied out;
    the small input is copied out whole; the body copies byte ranges of the output back as
    they fill (a range may cut an element), release copies back the rest and gates."""
    _small_ranges(monkeypatch)
    adapter, ops = _adapter(copy_delay=0.005, stream_ordered=True, copies_in_order=True)
    out, inp = torch.zeros(300, dtype=torch.float64), torch.zeros(100, dtype=torch.float64)
    _produce(ops, inp, torch.arange(100.0, dtype=torch.float64))
    h = adapter.prepare([out, inp], [False, True], [True, False])
    ranges = [(1203, 2400), (0, 5), (5, 1203)]  # bytes of out's flat view
    assert h.pipeline(lambda: ranges, 0, in_bytes=True)

    def comm() -> list:
        hosts = h.acquire()
        assert [d for d, _ in ops.copies] == ["out"]  # the input only, whole
        assert torch.equal(hosts[1], torch.arange(100.0, dtype=torch.float64))
        raw = hosts[0].view(-1).view(torch.uint8)
        want = torch.arange(300.0, dtype=torch.float64).view(torch.uint8)
        backs = []
        for i, (a, b) in enumerate(ranges[:2]):
            raw[a:b] = want[a:b]
            h.copy_back(i)
            backs.append([d for d, _ in ops.copies].count("back"))
        raw[5:1203] = want[5:1203]
        h.release()  # range 2 was never copied back by the body
        return backs

    assert on_thread(comm) == [1, 2]
    assert [d for d, _ in ops.copies].count("back") == 3
    h.gate()()
    seen: list[torch.Tensor] = []
    ops.current.enqueue(lambda: seen.append(out.clone()))
    ops.current.synchronize()
    assert torch.equal(seen[0], torch.arange(300.0, dtype=torch.float64))


def test_a_ranged_output_reuses_a_pooled_buffer_only_after_its_last_copy_back(
        monkeypatch) -> None:
    """CUDA's case again (copies in order, pooled buffers given back unfenced), with the
    buffer taken by an op whose output is copied back by range: nothing of it is copied out,
    so its acquire must still wait for the copies enqueued before (the earlier op's copy
    back), or the CPU overwrites the buffer that copy back is still reading."""
    _small_ranges(monkeypatch)
    adapter, ops = _adapter(copy_delay=0.02, stream_ordered=True, copies_in_order=True)
    a = torch.full((256,), 1.0)
    ha = adapter.prepare([a], [True], [True])
    on_thread(lambda: (ha.acquire()[0].add_(1), ha.release()))
    out = torch.zeros(256)
    hb = adapter.prepare([out], [False], [True])  # (no other tensor copied out either)
    assert hb.pipeline(lambda: [(0, 512), (512, 1024)], 0, in_bytes=True)

    def comm_b() -> None:
        hb.acquire()[0].fill_(7.0)
        hb.copy_back(0)
        hb.release()

    on_thread(comm_b)
    ops.side.synchronize()
    assert ops.host_allocs == 1  # b's output took a's buffer
    assert torch.equal(a, torch.full((256,), 2.0))  # a's result, not b's bytes
    assert torch.equal(out, torch.full((256,), 7.0))


def test_a_ranged_input_is_waited_for_range_by_range(monkeypatch) -> None:
    """A flat reduce-scatter's case: the large input is only read, range by range, each range
    waited for before it is read; the output is staged whole and copied back at release."""
    _small_ranges(monkeypatch)
    adapter, ops = _adapter(copy_delay=0.005)
    out, inp = torch.zeros(10), torch.zeros(1000)
    want = torch.arange(1000.0)
    _produce(ops, inp, want)
    h = adapter.prepare([out, inp], [False, True], [True, False])
    ranges = [(900, 1000), (0, 900)]
    assert h.pipeline(lambda: ranges, 1)

    def comm() -> list:
        hosts = h.acquire()
        got = []
        for i, (a, b) in enumerate(ranges):
            h.wait_range(i)
            got.append(hosts[1].view(-1)[a:b].clone())
        hosts[0].copy_(got[0][:10])
        h.release()
        return got

    got = on_thread(comm)
    assert torch.equal(got[0], want[900:]) and torch.equal(got[1], want[:900])
    assert [d for d, _ in ops.copies] == ["out", "out", "back"]  # input by range, output whole
    h.gate()()
    ops.current.synchronize()
    assert torch.equal(out, want[900:910])
    assert torch.equal(inp, want)  # a read-only input is never copied back


@pytest.mark.parametrize("in_order", [False, True], ids=["fenced-pool", "copies-in-order"])
def test_a_ranged_input_and_a_ranged_output_of_one_op(monkeypatch, in_order: bool) -> None:
    """A flat all-gather's (or reduce-scatter's) case: one tensor read range by range, another
    written range by range. wait_range names the input's ranges, copy_back the output's;
    nothing is copied whole; release copies back the output's ranges not copied back yet and
    never the input. With copies in order (CUDA), an earlier op's copy back out of the pooled
    buffer that this op's output takes must land before the CPU writes it."""
    _small_ranges(monkeypatch)
    adapter, ops = _adapter(copy_delay=0.005, stream_ordered=in_order, copies_in_order=in_order)
    earlier = torch.full((400,), 1.0)  # the output's size: its pooled buffer is reused
    he = adapter.prepare([earlier], [True], [True])
    on_thread(lambda: (he.acquire()[0].add_(1), he.release()))
    out, inp = torch.zeros(400), torch.zeros(300)
    want_in = torch.arange(300.0)
    _produce(ops, inp, want_in)
    h = adapter.prepare([out, inp], [False, True], [True, False])
    out_ranges, in_ranges = [(200, 400), (0, 200)], [(0, 100), (100, 150), (150, 300)]
    assert h.pipeline(lambda: out_ranges, 0)
    assert h.pipeline(lambda: in_ranges, 1)
    assert not h.pipeline(lambda: in_ranges, 1)  # one ranged tensor each way

    def comm() -> list:
        hosts = h.acquire()
        first = [d for d, _ in ops.copies]
        host_in, host_out = hosts[1].view(-1), hosts[0].view(-1)
        host_out.copy_(torch.arange(400.0) + 5)  # (before any wait for the input)
        h.copy_back(0)
        got = []
        for i, (a, b) in enumerate(in_ranges):
            h.wait_range(i)
            got.append(host_in[a:b].clone())
        backs = [d for d, _ in ops.copies].count("back")
        h.release()
        return [first, got, backs]

    first, got, backs = on_thread(comm)
    assert first == ["out", "back", "out", "out"]  # the earlier op, then the input's first two
    assert torch.equal(torch.cat(got), want_in)
    assert backs == 2  # the earlier op's and the output's range 0
    assert [d for d, _ in ops.copies].count("back") == 3  # release: range 1, nothing of inp
    assert [d for d, _ in ops.copies].count("out") == 1 + 3
    h.gate()()
    seen: list[torch.Tensor] = []
    ops.current.enqueue(lambda: seen.append(out.clone()))
    ops.current.synchronize()
    assert torch.equal(seen[0], torch.arange(400.0) + 5)
    assert torch.equal(earlier, torch.full((400,), 2.0))  # not the later op's bytes
    assert torch.equal(inp, want_in)


def test_pipeline_only_for_a_large_tensor_copied_on_the_comm_thread(monkeypatch) -> None:
    _small_ranges(monkeypatch)
    adapter, _ = _adapter()
    big, small = torch.ones(1000), torch.ones(10)
    def never() -> list:
        raise AssertionError("ranges built for an op that is not staged by range")

    assert not adapter.prepare([small], [True], [True]).pipeline(never)  # below it
    assert not adapter.prepare([big, small], [True] * 2, [True] * 2).pipeline(never, 1)
    assert not adapter.prepare([big], [False], [False]).pipeline(never)  # never copied
    assert not adapter.prepare([big], [True], [True]).pipeline(lambda: None)  # not cut
    # the one tensor of an all-reduce, a flat all-gather's output, a reduce-scatter's input
    assert adapter.prepare([big], [True], [True]).pipeline(lambda: [(0, 1000)])
    assert adapter.prepare([big, small], [False, True], [True, False]).pipeline(
        lambda: [(0, 4000)], 0, in_bytes=True)
    assert adapter.prepare([small, big], [False, True], [True, False]).pipeline(
        lambda: [(0, 1000)], 1)
    # a one-stream device (MPS staging) copies out on the caller before the marker: no ranges
    adapter, ops = _adapter(copy_out_on_caller=True)
    h = adapter.prepare([big], [True], [True])
    assert not h.pipeline(never)
    on_thread(lambda: (h.acquire()[0].mul_(3), h.release()))
    ops.current.synchronize()
    assert torch.equal(big, torch.full((1000,), 3.0))
    # CPU tensors stay zero-copy: the CPU hand-off has no pipeline at all
    assert not hasattr(CpuAdapter().prepare([big], [True], [True]), "pipeline")


def test_pipelined_ops_reuse_the_pooled_buffer(monkeypatch) -> None:
    _small_ranges(monkeypatch)
    adapter, ops = _adapter(copy_delay=0.002)
    ranges = [(300, 600), (0, 300)]
    for i in range(4):
        t = torch.full((600,), float(i))
        h = adapter.prepare([t], [True], [True])
        assert h.pipeline(lambda: ranges)

        def comm(h: StagingHandoff = h) -> None:
            host = h.acquire()[0].view(-1)
            for j, (a, b) in enumerate(ranges):
                h.wait_range(j)
                host[a:b].add_(1)
                h.copy_back(j)
            h.release()

        on_thread(comm)
        h.gate()()
        ops.current.synchronize()
        assert torch.equal(t, torch.full((600,), float(i + 1)))
    assert ops.host_allocs == 1 and adapter.pool.held_bytes == 600 * 4


@pytest.mark.parametrize("on_caller", [False, True], ids=["comm-copies", "caller-copies"])
def test_a_failed_op_gives_its_buffer_back_and_unblocks_later_readers(on_caller: bool) -> None:
    """discard() (an op that failed or never ran): its host buffer returns to the pool behind
    a fence of the copies enqueued so far, nothing is copied back, and a later op reading the
    same tensor no longer waits for that op's copy back (ready_now, and copies out at once
    where the caller copies)."""
    adapter, ops = _adapter(copy_out_on_caller=on_caller, copy_delay=0.01)
    t = torch.ones(500)
    first = adapter.prepare([t], [True], [True])
    ops.current.synchronize()
    assert first.ready_now()
    if not on_caller:
        on_thread(first.acquire)
    blocked = adapter.prepare([t], [True], [True])  # reads what `first` would write back
    assert not blocked.ready_now()  # it must wait for that copy back: not startable early
    on_thread(first.discard)
    assert adapter.pool.held_bytes == 500 * 4  # the buffer is back (fenced)
    on_thread(blocked.discard)  # it never ran either (the group failed)
    later = adapter.prepare([t], [True], [True])
    ops.current.synchronize()
    assert later.ready_now()  # no pending copy back any more
    hosts = on_thread(later.acquire)
    assert torch.equal(hosts[0], torch.ones(500))
    on_thread(later.release)
    ops.side.synchronize()
    ops.current.synchronize()
    assert torch.equal(t, torch.ones(500))  # the failed op wrote nothing back
    assert [d for d, _ in ops.copies].count("back") == 1  # only `later`'s
    held = adapter.pool.held_bytes
    first.discard()  # twice: nothing more is given back
    assert adapter.pool.held_bytes == held


# ---- end to end: real ranks, every op through the fake asynchronous staging adapter ----

def _collectives_through_fake_staging(rank: int, world: int, on_caller: bool) -> str:
    import torch.distributed as dist

    adapter = install_fake_staging(on_caller)
    ops: FakeAsyncOps = adapter.ops  # type: ignore[assignment]
    n = 70_000  # > SMALL_BYTES: the ring path
    t = torch.zeros(n)
    slow_fill(ops.current, t, float(rank + 1), delay=0.05)
    w = dist.all_reduce(t, async_op=True)
    w.wait()  # gate: the caller's fake stream waits for the copy back
    ops.current.synchronize()
    assert torch.equal(t, torch.full((n,), float(sum(range(1, world + 1)))))

    x = torch.zeros(5, dtype=torch.bfloat16)
    slow_fill(ops.current, x, 0.5 * (rank + 1), delay=0.02)
    dist.all_reduce(x)
    ops.current.synchronize()
    assert torch.allclose(x.float(), torch.full((5,), 0.5 * sum(range(1, world + 1))))

    out = torch.empty(world * 3)
    dist.all_gather_into_tensor(out, torch.full((3,), float(rank)))
    ops.current.synchronize()
    assert torch.equal(out, torch.arange(world).float().repeat_interleave(3))

    rs = torch.empty(2)
    dist.reduce_scatter_tensor(rs, torch.arange(world * 2).float())
    ops.current.synchronize()
    assert torch.equal(rs, world * torch.arange(rank * 2, rank * 2 + 2).float())

    b = torch.full((4,), float(rank))
    dist.broadcast(b, src=1)
    ops.current.synchronize()
    assert torch.equal(b, torch.ones(4))

    if rank == 0:
        dist.send(torch.arange(3.0), dst=1)
    elif rank == 1:
        r = torch.zeros(3)
        dist.recv(r, src=0)
        ops.current.synchronize()
        assert torch.equal(r, torch.arange(3.0))

    # DDP's pattern: buckets queued while earlier ones run; then one tensor twice in a row
    # without a wait between (the second op reads what the first writes back)
    bufs = [torch.zeros(20_000) for _ in range(3)]
    for i, b in enumerate(bufs):
        slow_fill(ops.current, b, float(rank + i), delay=0.01)
    works = [dist.all_reduce(b, async_op=True) for b in bufs]
    c = torch.zeros(20_000)
    slow_fill(ops.current, c, 1.0, delay=0.01)
    works += [dist.all_reduce(c, async_op=True), dist.all_reduce(c, async_op=True)]
    for w in works:
        w.wait()
    ops.current.synchronize()
    for i, b in enumerate(bufs):
        assert torch.equal(b, torch.full((20_000,), float(sum(r + i for r in range(world)))))
    assert torch.equal(c, torch.full((20_000,), float(world * world)))
    dist.barrier()
    return f"allocs={ops.host_allocs}"


@pytest.mark.parametrize("on_caller", [False, True], ids=["comm-copies", "caller-copies"])
def test_collectives_end_to_end_through_fake_staging(on_caller: bool) -> None:
    res = run_ranks(_collectives_through_fake_staging, 3, on_caller)
    assert all(r.startswith("allocs=") for r in res)


def _fake_ranged_staging(cuda_like: bool = False) -> FakeAsyncOps:
    """In a rank process, test hooks: stage range by range from just above the doubling
    switch, in chunks and pieces small enough that these segments are cut (else they are
    copied whole), through the fake device."""
    from mccl import collectives

    staging.PIPELINE_MIN_BYTES = collectives.SMALL_BYTES + (16 << 10)
    base.MIN_CHUNK_BYTES = 32 << 10
    ring.PIECE_MIN_BYTES = 16 << 10
    return install_fake_staging(False, cuda_like).ops  # type: ignore[return-value]


def _ranged_all_reduce_through_fake_staging(rank: int, world: int) -> str:
    import torch.distributed as dist

    from mccl import collectives

    ops = _fake_ranged_staging()

    def check(n: int, dtype: torch.dtype, op, vals) -> bool:
        """One staged all-reduce, checked; True if it was copied range by range."""
        t = torch.zeros(n, dtype=dtype)
        _produce(ops, t, vals(rank).to(dtype), delay=0.02)
        outs = [d for d, _ in ops.copies].count("out")
        dist.all_reduce(t, op=op, async_op=True).wait()  # gate: waits for the copy back
        seen: list[torch.Tensor] = []
        ops.current.enqueue(lambda: seen.append(t.clone()))  # consumer right after wait
        ops.current.synchronize()
        if dtype.is_floating_point:  # reduce in float32 (half types too), divide once
            want = sum(vals(r).to(dtype).float() for r in range(world))
            if op == dist.ReduceOp.AVG:
                want = want / world
        else:
            want = sum(vals(r).to(dtype) for r in range(world))
        assert torch.equal(seen[0], want.to(dtype)), (n, dtype, op)
        cap = dist.distributed_c10d._get_default_group()._engine.chunk_cap
        ranges = collectives.staging_ranges(t, world, rank, cap)
        ranged = n * t.element_size() >= staging.PIPELINE_MIN_BYTES and ranges is not None
        copies = [d for d, _ in ops.copies].count("out") - outs
        assert copies == (len(ranges) if ranged else 1), (n, dtype, copies)
        return ranged

    SUM, AVG = dist.ReduceOp.SUM, dist.ReduceOp.AVG  # noqa: N806
    ints = lambda r: torch.arange(70_001) % 1000 * (r + 1) + r  # noqa: E731
    assert not check(5_000, torch.float32, SUM, lambda r: torch.arange(5_000) * (r + 1))
    assert check(70_001, torch.float32, SUM, ints)  # 280 KB: ranges
    assert check(70_001, torch.float32, AVG, ints)
    assert check(90_001, torch.float16, SUM, lambda r: torch.arange(90_001) % 7 * 0.5 * (r + 1))
    assert check(90_001, torch.bfloat16, AVG, lambda r: torch.arange(90_001) % 5 * (r + 1.0))
    assert check(40_003, torch.int64, SUM, lambda r: torch.arange(40_003) * (r + 1))
    ring.PIECE_MIN_BYTES = 1 << 20  # no segment cut in two: the tensor is copied whole
    assert not check(70_001, torch.float32, SUM, ints)
    staging.COPY_AHEAD_BYTES = 256 << 10  # test hooks: copies out a few pieces ahead only,
    ring.PIECE_MIN_BYTES = 1  # edge pieces of one chunk
    check(600_001, torch.float32, SUM, lambda r: torch.arange(600_001) % 999 * (r + 1.0))
    allocs = ops.host_allocs
    for _ in range(3):
        check(70_001, torch.float32, SUM, ints)
    assert ops.host_allocs == allocs  # the pooled buffer of that size is reused
    return "ok"


@pytest.mark.parametrize("world", [2, 3])
def test_ranged_all_reduce_end_to_end_through_fake_staging(world: int) -> None:
    assert run_ranks(_ranged_all_reduce_through_fake_staging, world) == ["ok"] * world


def _ranged_gather_scatter_through_fake_staging(rank: int, world: int, cuda_like: bool) -> str:
    import torch.distributed as dist

    from mccl import collectives

    ops = _fake_ranged_staging(cuda_like)
    cap = dist.distributed_c10d._get_default_group()._engine.chunk_cap

    def staged(op: str, copies: list[str], big: torch.Tensor, small: torch.Tensor) -> bool:
        """Whether the op copied its large tensor range by range: one copy per range in the
        large tensor's direction, against one whole copy; and the same of the small tensor
        (this rank's segment: the all-gather's input, the reduce-scatter's output) in the
        other direction."""
        nbytes = big.numel() * big.element_size()

        def count(tensor: torch.Tensor, way: str, own: bool) -> bool:
            if op == "all_gather":
                ranges = collectives._flat_ranges(nbytes, 1, world, rank, cap, own=own)
            else:  # (half types: chunks as float32's, the dtype the ring runs in)
                size = (collectives.UPCAST.get(big.dtype) or big.dtype).itemsize
                ranges = collectives._flat_ranges(big.numel(), size, world, rank, cap, own=own)
            n = copies.count(way)
            ranged = (tensor.numel() * tensor.element_size() >= staging.PIPELINE_MIN_BYTES
                      and ranges is not None)
            assert n == (len(ranges) if ranged else 1), (op, big.dtype, big.numel(), own, n)
            return ranged

        ways = ("back", "out") if op == "all_gather" else ("out", "back")
        own = count(small, ways[1], own=True)
        return (count(big, ways[0], own=False), own)

    def all_gather(m: int, dtype: torch.dtype, in_place: bool = False) -> tuple[bool, bool]:
        vals = lambda r: (torch.arange(m) * 3 + r * 1000 + 1).to(dtype)  # noqa: E731
        out = torch.zeros(world * m, dtype=dtype)
        inp = out[rank * m:(rank + 1) * m] if in_place else torch.zeros(m, dtype=dtype)
        _produce(ops, inp, vals(rank), delay=0.02)
        before = len(ops.copies)
        dist.all_gather_into_tensor(out, inp, async_op=True).wait()
        seen: list[torch.Tensor] = []
        ops.current.enqueue(lambda: seen.append(out.clone()))  # consumer right after wait
        ops.current.synchronize()
        assert torch.equal(seen[0], torch.cat([vals(r) for r in range(world)])), (m, dtype)
        return staged("all_gather", [d for d, _ in ops.copies[before:]], out, inp)

    def reduce_scatter(m: int, dtype: torch.dtype, op=dist.ReduceOp.SUM,
                       in_place: bool = False) -> tuple[bool, bool]:
        vals = lambda r: (torch.arange(world * m) % 97 + r).to(dtype)  # noqa: E731
        inp = torch.zeros(world * m, dtype=dtype)
        # in place: the output's pieces are copied back over the input's own part
        out = inp[rank * m:(rank + 1) * m] if in_place else torch.zeros(m, dtype=dtype)
        _produce(ops, inp, vals(rank), delay=0.02)
        before = len(ops.copies)
        dist.reduce_scatter_tensor(out, inp, op=op, async_op=True).wait()
        seen: list[torch.Tensor] = []
        ops.current.enqueue(lambda: seen.append(out.clone()))
        ops.current.synchronize()
        parts = [vals(r)[rank * m:(rank + 1) * m] for r in range(world)]
        want = (torch.stack([p.float() for p in parts]).sum(0) if dtype.is_floating_point
                else sum(parts))
        if op == dist.ReduceOp.MAX:
            want = torch.stack(parts).max(0).values
        assert torch.equal(seen[0], want.to(dtype)), (m, dtype, op)
        return staged("reduce_scatter", [d for d, _ in ops.copies[before:]], inp, out)

    got = {
        "small": all_gather(500, torch.float32),  # copied whole
        "ag": all_gather(50_001, torch.float32),  # 200 KB per rank: ranges
        "ag in place": all_gather(100_003, torch.int16, in_place=True),
        "ag bf16": all_gather(45_001, torch.bfloat16),  # byte ranges that cut elements
        "ag f64": all_gather(25_001, torch.float64),
        "ag own small": all_gather(30_001, torch.float32),  # an input of 120 KB
        "rs": reduce_scatter(50_001, torch.float32),
        "rs max": reduce_scatter(30_007, torch.int64, dist.ReduceOp.MAX),
        "rs in place": reduce_scatter(50_001, torch.float32, in_place=True),
        "rs complex": reduce_scatter(25_001, torch.complex64),  # as (real, imaginary) pairs
        "ag complex": all_gather(12_501, torch.complex128),
        # half types: reduced in float32, converted chunk by chunk
        "rs f16": reduce_scatter(100_001, torch.float16),
        "rs bf16 max": reduce_scatter(80_003, torch.bfloat16, dist.ReduceOp.MAX),
        "rs bf16 small": reduce_scatter(50_001, torch.bfloat16),  # an output of 100 KB
    }
    ring.PIECE_MIN_BYTES = 1 << 20  # no segment cut in two: copied whole
    got["uncut"] = (all_gather(50_001, torch.float32), reduce_scatter(50_001, torch.float32))
    both, big_only, whole = (True, True), (True, False), (False, False)
    assert got == {
        "small": whole, "ag": both, "ag in place": both,
        "ag bf16": big_only,  # an input of 90 KB is below the threshold
        "ag f64": both, "ag own small": big_only, "rs": both, "rs max": both, "rs in place": both,
        "rs complex": both, "ag complex": both, "rs f16": both, "rs bf16 max": both,
        "rs bf16 small": big_only, "uncut": (whole, whole)}
    dist.barrier()
    return "ok"


@pytest.mark.parametrize("world,cuda_like", [(2, False), (3, True), (4, True)])
def test_ranged_all_gather_and_reduce_scatter_through_fake_staging(world: int,
                                                                   cuda_like: bool) -> None:
    """Also as CUDA orders copies (one stream, pooled buffers reused unfenced): an op's host
    output must not be written before the copy back of the op that used its buffer before."""
    assert run_ranks(_ranged_gather_scatter_through_fake_staging, world,
                     cuda_like) == ["ok"] * world


def _staged_peer_killed(rank: int, world: int) -> dict:
    import os
    import signal
    from datetime import timedelta

    import torch.distributed as dist

    from mccl.collectives import staging_plan as collectives_plan
    from tests.test_faults import _storm

    ring.PIECE_MIN_BYTES = 256 << 10  # test hook: 4 MB at 3 ranks cut finer than a segment
    adapter = install_fake_staging(False)
    ops: FakeAsyncOps = adapter.ops  # type: ignore[assignment]
    group = dist.new_group(list(range(world)), timeout=timedelta(seconds=5))
    t = torch.ones(1 << 20)  # 4 MB, as the storm's: staged piece by piece on the fake device
    dist.all_reduce(t, group=group)
    pieces = len(collectives_plan(t, world, rank, group._engine.chunk_cap).ranges)
    assert pieces > 1 and [d for d, _ in ops.copies].count("out") == pieces
    return _storm(rank, group, "staged-kill", 2, lambda: os.kill(os.getpid(), signal.SIGKILL))


def test_dead_peer_during_staged_all_reduces_errors_on_every_survivor() -> None:
    """kill -9 of a rank while piece-by-piece staged all-reduces run: the survivors' ops fail
    naming it (never a hang: run_ranks' hard timeout)."""
    res = run_ranks(_staged_peer_killed, 3, timeout=120, expect_missing=(2,))
    for rank in (0, 1):
        out = res[rank]
        assert out.get("peer") == 2 and "rank 2" in out["msg"], out
        assert out["op"] == "all_reduce", out


def _device_p2p_through_fake_staging(rank: int, world: int) -> str:
    """Device tensors' sends and receives go through the ordered queue (for the hand-off);
    they must not hold it up: NCCL-style ring exchanges with the receive issued first, and
    messages larger than the socket buffers (a send is only written as its peer reads)."""
    import torch.distributed as dist

    adapter = install_fake_staging(False)
    ops: FakeAsyncOps = adapter.ops  # type: ignore[assignment]
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    n = 4 << 20  # 16 MB
    s = torch.empty(n)
    slow_fill(ops.current, s, float(rank), delay=0.02)  # the sends wait for this (O1)
    r = torch.empty(n)
    p2p = [dist.P2POp(dist.irecv, r, prv), dist.P2POp(dist.isend, s, nxt)]
    for w in dist.batch_isend_irecv(p2p):
        w.wait()
    ops.current.synchronize()
    assert torch.equal(r, torch.full((n,), float(prv))), "batch, receive first"
    # single irecv / isend, receive first, then a collective behind them
    r2 = torch.empty(n)
    wr = dist.irecv(r2, prv, tag=3)
    ws = dist.isend(s, nxt, tag=3)
    t = torch.full((8,), 1.0)
    dist.all_reduce(t)
    for w in (wr, ws):
        w.wait()
    ops.current.synchronize()
    assert torch.equal(r2, torch.full((n,), float(prv))), "irecv, isend, all_reduce"
    assert torch.equal(t, torch.full((8,), float(world)))
    # halo exchange within one tensor: receive into its edges, send from its inner cells
    u = torch.full((4,), float(rank))
    halo = [dist.P2POp(dist.irecv, u[0:1], prv), dist.P2POp(dist.irecv, u[3:4], nxt),
            dist.P2POp(dist.isend, u[1:2], prv), dist.P2POp(dist.isend, u[2:3], nxt)]
    for w in dist.batch_isend_irecv(halo):
        w.wait()
    ops.current.synchronize()
    assert u.tolist() == [float(prv), rank, rank, float(nxt)], u
    return "ok"


def test_device_p2p_does_not_hold_up_the_queue() -> None:
    assert run_ranks(_device_p2p_through_fake_staging, 3, timeout=120,
                     pg_timeout_s=30) == ["ok"] * 3
