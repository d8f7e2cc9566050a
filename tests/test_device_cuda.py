"""CUDA tensors through mccl (mccl.device.cuda). Skips without a GPU (CI has none); run on the
lent H200 by ``benchmarks/h200/run_all.sh``. Ranks share GPU 0 when there is only one.

Each check is built so that a missing wait gives wrong numbers: inputs are produced behind a
long ``torch.cuda._sleep`` on the caller's stream (O1), and results are consumed by kernels
enqueued right after ``wait()`` or ``future.wait()`` without any device-wide sync (O2).
"""

from __future__ import annotations

import time

import pytest
import torch

from mccl.bench.spawn import run_ranks

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SLEEP_CYCLES = 200_000_000  # ~0.1 s of GPU time ahead of the producer kernel


def _dev(rank: int) -> torch.device:
    return torch.device("cuda", rank % torch.cuda.device_count())


def _marker_and_gate(rank: int, world: int) -> bool:
    import torch.distributed as dist

    dev = _dev(rank)
    torch.cuda.set_device(dev)
    expect = float(sum(range(1, world + 1)))
    side = torch.cuda.Stream(dev)
    for n in (1000, 3_000_000):  # doubling and ring paths
        for stream in (torch.cuda.current_stream(dev), side):
            for blocking in (False, True):  # comm thread / caller's thread (inline)
                with torch.cuda.stream(stream):
                    t = torch.zeros(n, device=dev)
                    torch.cuda._sleep(SLEEP_CYCLES)
                    t.fill_(rank + 1)  # produced long after all_reduce is called
                    if blocking:
                        dist.all_reduce(t)  # waits inside, as the gate below
                    else:
                        w = dist.all_reduce(t, async_op=True)
                        w.wait()  # O2 via the gate: this stream waits for the copy back
                    # a blocking op copies on the caller's thread (inline), in the side
                    # stream's context: the caller's stream is current again afterwards
                    assert torch.cuda.current_stream(dev) == stream, (n, blocking)
                    got = (t * 1).sum().item()  # consumer kernel on the same stream
                assert got == expect * n, (n, stream, blocking, got)
    # Future path (what DDP's reducer uses): no Work.wait(), only fut.wait()
    t = torch.zeros(2_000_000, device=dev)
    torch.cuda._sleep(SLEEP_CYCLES)
    t.fill_(rank + 1)
    fut = dist.all_reduce(t, async_op=True).get_future()
    val = fut.wait()[0]
    assert (val * 1).min().item() == expect
    chained = dist.all_reduce(torch.ones(10, device=dev), async_op=True).get_future().then(
        lambda f: f.value()[0] * 2)
    assert chained.wait().sum().item() == 2 * world * 10
    # A future first asked for after the op completed (made then, not by the op): read on a
    # stream that never waited on the Work, it still sees the whole copy back. An all-gather's
    # output is copied back whole when the op ends (64 MB: that copy is still running when
    # the op is marked complete).
    part = torch.full((8 << 20,), float(rank + 1), device=dev)
    out = torch.zeros(world * part.numel(), device=dev)
    w = dist.all_gather_into_tensor(out, part, async_op=True)
    deadline = time.monotonic() + 60
    while not w.is_completed() and time.monotonic() < deadline:
        time.sleep(0.0001)
    with torch.cuda.stream(side):
        fut = w.get_future()  # made and completed here, in the adapter's side-stream context
        assert torch.cuda.current_stream(dev) == side  # which it leaves again
        val = fut.wait()[0].view(world, -1)
        lo, hi = val.amin(dim=1).tolist(), val.amax(dim=1).tolist()
    assert lo == hi == [float(i + 1) for i in range(world)], (lo, hi)
    return True


def test_ready_marker_and_consumer_gate() -> None:
    assert all(run_ranks(_marker_and_gate, 2, timeout=180))


def _ops(rank: int, world: int) -> bool:
    import torch.distributed as dist

    dev = _dev(rank)
    torch.cuda.set_device(dev)
    x = torch.full((5000,), 0.5 * (rank + 1), device=dev, dtype=torch.bfloat16)
    dist.all_reduce(x)
    assert torch.allclose(x.float(), torch.full((5000,), 0.5 * world * (world + 1) / 2,
                                                device=dev))
    out = torch.empty(world * 3, device=dev)
    dist.all_gather_into_tensor(out, torch.full((3,), float(rank), device=dev))
    assert torch.equal(out, torch.arange(world, device=dev).float().repeat_interleave(3))
    rs = torch.empty(4, device=dev)
    dist.reduce_scatter_tensor(rs, torch.arange(world * 4, device=dev).float())
    assert torch.equal(rs, world * torch.arange(rank * 4, rank * 4 + 4, device=dev).float())
    # complex reduces as (real, imaginary) float views of the same CUDA memory
    zs = torch.empty(3, device=dev, dtype=torch.complex64)
    dist.reduce_scatter_tensor(zs, torch.full((world * 3,), complex(1, rank), device=dev))
    assert torch.equal(zs, torch.full((3,), complex(world, sum(range(world))), device=dev))
    b = torch.full((100_000,), float(rank), device=dev)
    dist.broadcast(b, src=world - 1)
    assert b.min().item() == world - 1
    a2a = torch.empty(world * 2, device=dev)
    dist.all_to_all_single(a2a, torch.full((world * 2,), float(rank), device=dev))
    assert torch.equal(a2a, torch.arange(world, device=dev).float().repeat_interleave(2))
    if rank == 0:
        s = torch.arange(10.0, device=dev)
        torch.cuda._sleep(SLEEP_CYCLES)
        s.add_(1)
        dist.send(s, dst=1)
    elif rank == 1:
        r = torch.zeros(10, device=dev)
        dist.recv(r, src=0)
        assert torch.equal(r, torch.arange(10.0, device=dev) + 1)
    # p2p does not hold up the queue: an NCCL-style ring exchange with the receive issued
    # first (16 MB, more than the socket buffers hold), then an irecv before a collective
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    big = torch.empty(4 << 20, device=dev)
    torch.cuda._sleep(SLEEP_CYCLES)
    big.fill_(rank)
    got = torch.empty_like(big)
    for w in dist.batch_isend_irecv([dist.P2POp(dist.irecv, got, prv),
                                     dist.P2POp(dist.isend, big, nxt)]):
        w.wait()
    assert (got * 1).min().item() == (got * 1).max().item() == prv
    small = torch.empty(3, device=dev)
    w = dist.irecv(small, prv, tag=4)
    z = torch.ones(8, device=dev)
    dist.all_reduce(z)
    dist.send(torch.full((3,), float(rank), device=dev), nxt, tag=4)
    w.wait()
    assert torch.equal(small * 1, torch.full((3,), float(prv), device=dev))
    assert z.min().item() == world
    # strided CUDA tensors: staged through contiguous host copies, results back in place
    tr = (torch.arange(12.0, device=dev).view(3, 4) * (rank + 1)).t()
    dist.all_reduce(tr)
    assert torch.equal(tr, (torch.arange(12.0, device=dev).view(3, 4)
                            * sum(range(1, world + 1))).t())
    img = (torch.arange(2 << 20, device=dev).view(1, 8, 512, 512) + rank).float()
    img = img.to(memory_format=torch.channels_last) if rank == 0 else img
    dist.all_reduce(img, op=dist.ReduceOp.MAX)  # large: the ranged copies are skipped
    assert torch.equal(img, torch.arange(2 << 20, device=dev).view(1, 8, 512, 512).float()
                       + world - 1)
    # a result tensor that is an expanded view on rank 1 only: that rank's op fails after
    # it ran on a private copy, rank 0 gets its result and the group stays in step
    view = torch.zeros(1, device=dev).expand(world * 3) if rank == 1 else None
    out = view if view is not None else torch.empty(world * 3, device=dev)
    try:
        dist.all_gather_into_tensor(out, torch.full((3,), float(rank), device=dev))
        assert view is None, "no error on the expanded view"
        assert torch.equal(out, torch.arange(world, device=dev).float().repeat_interleave(3))
    except ValueError as e:
        assert view is not None and "expanded" in str(e), e
    # pinned host buffers are pooled: repeated ops of one size allocate once
    adapter = getattr(dist.group.WORLD, "_adapters", {}).get(str(dev))
    before = adapter.pool.allocations if adapter is not None else 0
    y = torch.ones(1 << 20, device=dev)
    for _ in range(5):
        dist.all_reduce(y)
    assert y.min().item() == world ** 5
    if adapter is not None:
        assert adapter.pool.allocations - before <= 1
    return True


def test_collectives_and_p2p_on_cuda_tensors() -> None:
    assert all(run_ranks(_ops, 2, timeout=180))


def _ranged(rank: int, world: int) -> bool:
    import torch.distributed as dist

    from mccl import collectives
    from mccl.device import staging

    dev = _dev(rank)
    torch.cuda.set_device(dev)
    calls: list[int] = []
    orig = collectives.AllReduce._start_staged

    def counted(self, ch, t, io):
        calls.append(t.numel())  # this op ran with range-by-range copies
        return orig(self, ch, t, io)

    collectives.AllReduce._start_staged = counted
    SUM, AVG = dist.ReduceOp.SUM, dist.ReduceOp.AVG  # noqa: N806

    def check(n: int, dtype: torch.dtype, op, future: bool = False) -> None:
        def vals(r: int) -> torch.Tensor:
            return (torch.arange(n, device=dev) % 1000 * (r + 1) + r).to(dtype)

        t = torch.zeros(n, device=dev, dtype=dtype)
        torch.cuda._sleep(SLEEP_CYCLES)
        t.copy_(vals(rank))  # produced long after all_reduce is called (O1)
        w = dist.all_reduce(t, op=op, async_op=True)
        if future:
            got = w.get_future().wait()[0] * 1  # DDP's path: no Work.wait()
        else:
            w.wait()
            got = t * 1  # consumer kernel right after wait (O2)
        want = sum(vals(r).float() for r in range(world))  # float32 sums, one rounding
        if op == AVG:
            want = want / world
        assert torch.equal(got, want.to(dtype)), (n, dtype, op, future)

    shipped = staging.PIPELINE_MIN_BYTES
    staging.PIPELINE_MIN_BYTES = 1 << 20  # test hook: ranges from 1 MiB
    check(100_000, torch.float32, SUM)  # below the threshold: whole copies
    assert calls == []
    check(3_000_001, torch.float32, SUM)
    check(3_000_001, torch.float32, AVG, future=True)
    check(1_500_001, torch.float16, SUM)
    check(2_000_003, torch.bfloat16, AVG, future=True)  # 8 MB in float32: segments cut
    assert calls == [3_000_001, 3_000_001, 1_500_001, 2_000_003]
    check(600_003, torch.bfloat16, AVG)  # 2.4 MB in float32, 3 ranks: 800 KB segments, whole
    assert calls[-1] == 2_000_003
    staging.PIPELINE_MIN_BYTES = shipped
    check(24_000_001, torch.float32, SUM)  # 96 MB with the shipped threshold
    assert calls[-1] == 24_000_001
    return True


def test_ranged_all_reduce_on_cuda_tensors() -> None:
    assert all(run_ranks(_ranged, 3, timeout=240))  # 3: the first and last pieces differ


def _ranged_gather_scatter(rank: int, world: int) -> bool:
    import torch.distributed as dist

    from mccl.device import staging

    dev = _dev(rank)
    torch.cuda.set_device(dev)
    ranged: list[tuple[str, int]] = []
    orig = staging.StagingHandoff.pipeline

    def counted(self, ranges, index=0, in_bytes=False):
        got = orig(self, ranges, index, in_bytes)
        if got:  # this op copied its tensor ``index`` range by range
            ranged.append(("all_gather" if in_bytes else "reduce_scatter", index))
        return got

    staging.StagingHandoff.pipeline = counted

    def all_gather(m: int, dtype: torch.dtype, in_place: bool = False) -> None:
        def vals(r: int) -> torch.Tensor:
            return (torch.arange(m, device=dev) % 1000 * 7 + r).to(dtype)

        out = torch.zeros(world * m, device=dev, dtype=dtype)
        inp = out[rank * m:(rank + 1) * m] if in_place else torch.empty_like(vals(0))
        torch.cuda._sleep(SLEEP_CYCLES)
        inp.copy_(vals(rank))  # produced long after the op is called (O1)
        dist.all_gather_into_tensor(out, inp, async_op=True).wait()
        got = out * 1  # consumer kernel right after wait (O2)
        assert torch.equal(got, torch.cat([vals(r) for r in range(world)])), (m, dtype)

    def reduce_scatter(m: int, dtype: torch.dtype, op=dist.ReduceOp.SUM) -> None:
        def vals(r: int) -> torch.Tensor:
            return (torch.arange(world * m, device=dev) % 251 + r).to(dtype)  # exact sums

        inp = torch.zeros(world * m, device=dev, dtype=dtype)
        out = torch.zeros(m, device=dev, dtype=dtype)
        torch.cuda._sleep(SLEEP_CYCLES)
        inp.copy_(vals(rank))
        dist.reduce_scatter_tensor(out, inp, op=op, async_op=True).wait()
        got = out * 1
        parts = torch.stack([vals(r)[rank * m:(rank + 1) * m] for r in range(world)])
        want = parts.max(0).values if op == dist.ReduceOp.MAX else parts.sum(0)
        assert torch.equal(got, want.to(dtype)), (m, dtype, op)

    shipped = staging.PIPELINE_MIN_BYTES
    staging.PIPELINE_MIN_BYTES = 1 << 20  # test hook: ranges from 1 MiB
    all_gather(10_000, torch.float32)  # below the threshold: whole copies
    reduce_scatter(10_000, torch.float32)
    assert ranged == []
    all_gather(1_000_003, torch.float32)
    all_gather(1_500_001, torch.bfloat16, in_place=True)  # byte ranges that cut elements
    reduce_scatter(1_000_003, torch.float32)
    reduce_scatter(700_001, torch.int64, dist.ReduceOp.MAX)
    # the large tensor first (the all-gather's output, the reduce-scatter's input), then the
    # one holding this rank's segment (3-4 MB here: cut in pieces too)
    assert ranged == [("all_gather", 0), ("all_gather", 1)] * 2 + [
        ("reduce_scatter", 1), ("reduce_scatter", 0)] * 2
    reduce_scatter(1_000_003, torch.float16)  # in float32, converted chunk by chunk
    assert ranged[8:] == [("reduce_scatter", 1), ("reduce_scatter", 0)]
    staging.PIPELINE_MIN_BYTES = shipped
    all_gather(8_000_001, torch.float32)  # 96 MB outputs with the shipped threshold
    reduce_scatter(8_000_001, torch.float32)
    assert ranged[10:] == [("all_gather", 0), ("all_gather", 1), ("reduce_scatter", 1),
                           ("reduce_scatter", 0)]
    return True


def test_ranged_all_gather_and_reduce_scatter_on_cuda_tensors() -> None:
    assert all(run_ranks(_ranged_gather_scatter, 3, timeout=240))


def _caller_stream(rank: int, world: int) -> bool:
    """A blocking op run on the caller's thread copies on the caller's stream (no side
    stream, mccl.device.cuda), range by range too; the group's issue order still holds
    between that stream and the adapter's side stream either way round; and a blocking op
    queued behind a running one moves to the side stream."""
    import threading
    import time

    import torch.distributed as dist

    from mccl.device import cuda, staging

    dev = _dev(rank)
    torch.cuda.set_device(dev)
    expect = float(sum(range(1, world + 1)))
    m = 1_000_003

    def vals(r: int, n: int) -> torch.Tensor:
        return (torch.arange(n, device=dev) % 251 + r).float()

    # blocking ops, whole and (from 1 MiB here) range by range: never the side stream
    shipped = staging.PIPELINE_MIN_BYTES
    staging.PIPELINE_MIN_BYTES = 1 << 20
    for n in (1000, m):
        out, inp = torch.zeros(world * n, device=dev), torch.empty(n, device=dev)
        torch.cuda._sleep(SLEEP_CYCLES)
        inp.copy_(vals(rank, n))  # produced long after the op is called (O1)
        dist.all_gather_into_tensor(out, inp)
        assert torch.equal(out * 1, torch.cat([vals(r, n) for r in range(world)])), n
        big, part = torch.empty(world * n, device=dev), torch.zeros(n, device=dev)
        torch.cuda._sleep(SLEEP_CYCLES)
        big.copy_(vals(rank, world * n))
        dist.reduce_scatter_tensor(part, big)
        want = sum(vals(r, world * n)[rank * n:(rank + 1) * n] for r in range(world))
        assert torch.equal(part * 1, want), n
        t = torch.zeros(3 * n, device=dev)
        torch.cuda._sleep(SLEEP_CYCLES)
        t.fill_(rank + 1)
        dist.all_reduce(t)
        assert (t * 1).min().item() == (t * 1).max().item() == expect, n
    staging.PIPELINE_MIN_BYTES = shipped
    adapter = dist.group.WORLD._adapters[str(dev)]
    assert adapter.ops._side is None, "a blocking op used the side stream"

    # the side stream still writes what a blocking op reads (an earlier op's copy back)
    t = torch.zeros(m, device=dev)
    torch.cuda.synchronize()
    with torch.cuda.stream(adapter.ops.side):
        torch.cuda._sleep(SLEEP_CYCLES)
        t.fill_(rank + 1)
    dist.all_reduce(t)
    assert (t * 1).min().item() == (t * 1).max().item() == expect

    # a blocking op's copy back still waits on its stream when an op issued next, from
    # another stream, reads its result
    s1, s2 = torch.cuda.Stream(dev), torch.cuda.Stream(dev)

    def hold_up() -> None:
        with torch.cuda.stream(s1):  # (a stream is current per thread: the timer's)
            torch.cuda._sleep(SLEEP_CYCLES * 10)

    def reduce_held_up_on_s1(x: torch.Tensor) -> None:
        """all_reduce(x) from s1, where rank 0's copy back is held up behind ~1 s of GPU
        sleep that a timer enqueues on s1 while the op waits for the late rank 1."""
        timer = threading.Timer(0.2, hold_up)
        torch.cuda.synchronize()
        with torch.cuda.stream(s1):
            if rank == 0:
                timer.start()
            else:
                time.sleep(0.5)
            dist.all_reduce(x)
        if rank == 0:
            timer.join()

    with torch.cuda.stream(s1):
        u = torch.full((m,), float(rank + 1), device=dev)  # made on s1 alone
    reduce_held_up_on_s1(u)
    with torch.cuda.stream(s2):
        dist.all_reduce(u, async_op=True).wait()
        got = u * 1
    torch.cuda.current_stream().wait_stream(s2)  # got is s2's; the checks run here
    assert got.min().item() == got.max().item() == world * expect, (got.min(), got.max())

    # a tensor made on the default stream, reduced from s1 and freed as the call returns:
    # its memory is not handed out again before s1's held-up copy back has run into it
    v = torch.full((m,), float(rank + 1), device=dev)
    reduce_held_up_on_s1(v)
    del v
    fresh = torch.zeros(m, device=dev)  # the default stream's: v's memory, were it free
    torch.cuda.synchronize()
    assert fresh.abs().max().item() == 0, "a copy back wrote into memory handed out again"

    # a blocking op issued while an async one runs (rank 1 joins late) goes to the comm
    # thread, on the side stream
    moved = []
    queued = cuda.CallerStreamHandoff.queued

    def counted(self) -> None:
        moved.append(1)
        queued(self)

    cuda.CallerStreamHandoff.queued = counted
    if rank == 1:
        time.sleep(0.3)
    big = torch.zeros(m, device=dev)
    torch.cuda._sleep(SLEEP_CYCLES)
    big.fill_(rank + 1)
    w = dist.all_reduce(big, async_op=True)
    part = torch.empty(1000, device=dev)
    torch.cuda._sleep(SLEEP_CYCLES)
    part.copy_(vals(rank, 1000))
    out = torch.empty(world * 1000, device=dev)
    dist.all_gather_into_tensor(out, part)
    assert torch.equal(out * 1, torch.cat([vals(r, 1000) for r in range(world)]))
    w.wait()
    assert (big * 1).min().item() == (big * 1).max().item() == expect
    cuda.CallerStreamHandoff.queued = queued
    assert rank != 0 or moved, "the blocking op was not queued"
    return True


def test_blocking_ops_copy_on_the_callers_stream_in_issue_order() -> None:
    assert all(run_ranks(_caller_stream, 2, timeout=180))


def _queued(rank: int, world: int) -> bool:
    """DDP's pattern: each bucket's op is issued right after its producer kernels, while the
    ops before it are still queued or running; then ops that read what a pending op writes
    back (issue order must hold)."""
    import torch.distributed as dist

    dev = _dev(rank)
    torch.cuda.set_device(dev)
    sizes = [300_000, 2_500_000, 50_000, 2_500_000]  # whole and ranged copies
    bufs, works = [], []
    for i, n in enumerate(sizes):
        t = torch.zeros(n, device=dev)
        torch.cuda._sleep(SLEEP_CYCLES // 4)
        t.fill_(rank + i)
        bufs.append(t)
        works.append(dist.all_reduce(t, async_op=True))
    c = torch.ones(2_500_000, device=dev)
    works += [dist.all_reduce(c, async_op=True) for _ in range(2)]  # reads the first's result
    out = torch.empty(world * 2_500_000, device=dev)
    works.append(dist.all_gather_into_tensor(out, c, async_op=True))  # reads it too
    for w in works:
        w.wait()
    for i, t in enumerate(bufs):
        assert (t * 1).min().item() == (t * 1).max().item() == sum(r + i for r in range(world))
    assert (c * 1).min().item() == world * world
    assert (out * 1).min().item() == (out * 1).max().item() == world * world
    return True


def test_queued_ops_on_cuda_tensors() -> None:
    assert all(run_ranks(_queued, 2, timeout=180))


def _early(rank: int, world: int) -> int:
    """Queued all-reduces whose inputs are ready start early (the engine copies the next
    op's first pieces out and sends them while the op before still receives); one whose
    producer is still running does not. The last rank joins late, so the others' queues are
    full when their first op reaches its last step."""
    import time

    import torch.distributed as dist

    dev = _dev(rank)
    torch.cuda.set_device(dev)
    engine = dist.group.WORLD._engine
    if rank == world - 1:
        time.sleep(0.5)
    sizes = [2_500_000, 1_500_001, 2_500_000, 300_000, 2_000_003]  # ranged and whole copies
    bufs = [(torch.arange(n, device=dev) % 1000 * (rank + 1) + i).float()
            for i, n in enumerate(sizes)]
    torch.cuda.synchronize()  # inputs ready: every op may start early
    late = torch.zeros(1_000_000, device=dev)
    works = [dist.all_reduce(b, async_op=True) for b in bufs[:3]]
    torch.cuda._sleep(SLEEP_CYCLES * 10)  # ~1 s: not ready when op 2 reaches its last step
    late.fill_(rank + 1)
    works.append(dist.all_reduce(late, async_op=True))
    works += [dist.all_reduce(b, async_op=True) for b in bufs[3:]]
    for w in works:
        w.wait()
    for i, (n, b) in enumerate(zip(sizes, bufs, strict=True)):
        want = sum((torch.arange(n, device=dev) % 1000 * (r + 1) + i).float()
                   for r in range(world))
        assert torch.equal(b * 1, want), i
    assert (late * 1).min().item() == (late * 1).max().item() == sum(range(1, world + 1))
    return engine.early_starts


def test_queued_cuda_all_reduces_start_early_when_ready() -> None:
    early = run_ranks(_early, 3, timeout=180)
    for r in (0, 1):  # 0->1, 1->2 and late->3, 3->4 (op 3 is 1.2 MB: ring); not 2->late
        assert early[r] == 4, early


def _ddp(rank: int, world: int, uneven: bool = False) -> list:
    from tests.ddp_model import train_ddp

    return train_ddp(rank, _dev(rank), steps=4, uneven=uneven)


@pytest.mark.parametrize("uneven", [False, True], ids=["even", "join_uneven"])
def test_ddp_on_cuda_matches_gloo(uneven: bool) -> None:
    mccl = run_ranks(_ddp, 2, uneven, timeout=240)
    gloo = run_ranks(_ddp, 2, uneven, backend="gloo", timeout=240)
    for a, b in zip(mccl[0], gloo[0], strict=True):
        assert abs(a - b).max() <= 1e-5 * max(1.0, abs(b).max())
    for a, b in zip(mccl[0], mccl[1], strict=True):  # replicas stay identical
        assert (a == b).all()


def _killed_with_cuda_ops_queued(rank: int, world: int) -> dict:
    """Every rank queues all-reduces of CUDA tensors (whole and ranged copies) behind a long
    producer kernel; the last rank dies before they run. The survivors' Works and Futures
    must all fail naming it, and their streams must not be left waiting on the dead ops."""
    import os
    import signal

    import torch.distributed as dist

    dev = _dev(rank)
    torch.cuda.set_device(dev)
    dist.all_reduce(torch.ones(4, device=dev))  # the group has formed on every rank
    bufs = [torch.zeros(n, device=dev) for n in (300_000, 6_000_000, 50_000, 6_000_000)]
    torch.cuda._sleep(SLEEP_CYCLES)
    for b in bufs:
        b.fill_(rank + 1)
    works = [dist.all_reduce(b, async_op=True) for b in bufs]
    futures = [w.get_future() for w in works]
    if rank == world - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    errors = []
    for w in works:
        try:
            w.wait()
            errors.append("no error")
        except RuntimeError as e:
            errors.append(str(e))
    for f in futures:
        try:
            f.wait()
            errors.append("no error")
        except RuntimeError as e:
            errors.append(str(e))
    torch.cuda.synchronize()  # nothing left behind on the device by the failed ops
    later = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4, device=dev))
        errors.append("no error")
    except RuntimeError as e:
        errors.append(str(e))
    later = time.monotonic() - later
    dist.destroy_process_group()
    return {"errors": errors, "later_s": later}


def test_a_rank_killed_with_cuda_ops_queued_fails_every_survivors_op() -> None:
    world = 3
    results = run_ranks(_killed_with_cuda_ops_queued, world, timeout=120, pg_timeout_s=60,
                        expect_missing=(world - 1,))
    for rank, got in enumerate(results[:-1]):
        assert len(got["errors"]) == 9, (rank, got)
        for msg in got["errors"]:
            assert msg != "no error" and f"rank {world - 1}" in msg, (rank, msg)
        assert got["later_s"] < 30, (rank, got)  # a failed group refuses at once, not at timeout


def _objects_and_barrier(rank: int, world: int) -> bool:
    """What user code calls with a CUDA device current: the object collectives (torch moves
    their byte tensors to the current device for some backends), barrier(device_ids=...),
    and a subgroup's collectives on CUDA tensors."""
    import torch.distributed as dist

    dev = _dev(rank)
    torch.cuda.set_device(dev)
    dist.barrier(device_ids=[dev.index])
    objs: list = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "payload": "x" * (rank * 1000)})
    assert objs == [{"rank": r, "payload": "x" * (r * 1000)} for r in range(world)]
    lst = [f"from {rank}", rank] if rank == 1 else [None, None]
    dist.broadcast_object_list(lst, src=1)
    assert lst == ["from 1", 1]
    out = [None]
    dist.scatter_object_list(out, [f"to {r}" for r in range(world)] if rank == 0 else None,
                             src=0)
    assert out == [f"to {rank}"]
    sub = dist.new_group([world - 1, 0])
    if rank in (0, world - 1):
        t = torch.full((1000,), float(rank), device=dev)
        dist.all_reduce(t, group=sub)
        assert torch.equal(t, torch.full((1000,), float(world - 1), device=dev))
        g = torch.empty(2000, device=dev)
        dist.all_gather_into_tensor(g, torch.full((1000,), float(rank), device=dev), group=sub)
        want = [0.0, float(world - 1)]  # new_group sorts the ranks
        assert torch.equal(g, torch.tensor(want, device=dev).repeat_interleave(1000))
    dist.barrier()
    return True


def test_object_collectives_barrier_and_subgroups_with_a_cuda_device_current() -> None:
    assert all(run_ranks(_objects_and_barrier, 3, timeout=120))
