"""The generic staging hand-off (mccl.device.staging) on CPU with a fake asynchronous device.

What CUDA and MPS-staging share is tested here, so CI (no accelerator) covers it: the comm
thread waits for the producer's marker before copying out (O1), copies run in the adapter's
own context, the copy back is fenced and the consumer is gated on that fence (O2), host
buffers are pooled and never reused before their last copy finished.
"""

from __future__ import annotations

import threading

import pytest
import torch

from mccl.device.staging import HostOps, HostPool, StagingAdapter, StagingHandoff
from tests.device_fakes import FakeAsyncOps, FakeEvent, install_fake_staging, slow_fill
from tests.multiproc import run_ranks


def _on_thread(fn, name: str = "comm"):
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    t = threading.Thread(target=run, name=name)
    t.start()
    t.join(30)
    assert not t.is_alive()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _adapter(**kw) -> tuple[StagingAdapter, FakeAsyncOps]:
    ops = FakeAsyncOps(**kw)
    return StagingAdapter("fake", ops, HostPool(ops.alloc_host)), ops


def test_comm_thread_waits_for_the_producer_marker() -> None:
    adapter, ops = _adapter(copy_delay=0.001)
    t = torch.zeros(1000)
    slow_fill(ops.current, t, 3.0, delay=0.1)  # the "kernel" is still running at prepare
    h = adapter.prepare([t], [True], [True])
    hosts = _on_thread(h.acquire)
    assert torch.equal(hosts[0], torch.full((1000,), 3.0))
    assert ops.ready_events[0].sync_threads == ["comm"]


def test_copy_back_is_fenced_and_gates_the_consumer() -> None:
    adapter, ops = _adapter(copy_delay=0.05)  # copy back lands late on the side stream
    t = torch.ones(64)
    h = adapter.prepare([t], [True], [True])

    def comm() -> None:
        hosts = h.acquire()
        hosts[0].mul_(5)
        h.release()

    _on_thread(comm)
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
    hosts = _on_thread(h.acquire)
    assert [d for d, _ in ops.copies] == ["out", "out"]
    hosts[1].copy_(hosts[0] + hosts[2] + 1)
    _on_thread(h.release)
    assert [d for d, _ in ops.copies] == ["out", "out", "back"]
    ops.side.synchronize()
    assert torch.equal(b, torch.arange(4.0) + 1)
    assert torch.equal(a, torch.arange(4.0))


def test_copies_run_on_the_comm_thread_unless_the_device_forbids_it() -> None:
    adapter, ops = _adapter()
    t = torch.ones(8)
    h = adapter.prepare([t], [True], [True])
    _on_thread(lambda: (h.acquire(), h.release()))
    assert {th for _, th in ops.copies} == {"comm"}

    adapter, ops = _adapter(copy_out_on_caller=True)
    h = adapter.prepare([t], [True], [True])
    _on_thread(lambda: (h.acquire(), h.release()))
    me = threading.current_thread().name
    assert ops.copies == [("out", me), ("back", "comm")]


def test_host_buffers_are_pooled_and_reused_only_after_their_fence() -> None:
    adapter, ops = _adapter(copy_delay=0.01)
    for i in range(5):
        t = torch.full((256,), float(i))
        h = adapter.prepare([t], [True], [True])

        def comm(h: StagingHandoff = h) -> None:
            h.acquire()[0].add_(1)
            h.release()

        _on_thread(comm)
        ops.side.synchronize()
        assert torch.equal(t, torch.full((256,), float(i + 1)))
    assert ops.host_allocs == 1
    assert adapter.pool.held_bytes == 256 * 4
    # every copy-back fence but the last was waited on by the next op's take()
    assert all(f.syncs >= 1 for f in ops.fences[1:-1:2])


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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int64, torch.bool])
def test_dtypes_and_empty_tensors_round_trip(dtype: torch.dtype) -> None:
    adapter, ops = _adapter()
    t = (torch.arange(10) % 2).to(dtype)
    e = torch.empty(0, dtype=dtype)
    h = adapter.prepare([t, e], [True, True], [True, True])

    def comm() -> None:
        hosts = h.acquire()
        assert hosts[0].dtype == dtype and hosts[1].numel() == 0
        assert torch.equal(hosts[0], t)
        hosts[0].copy_(1 - hosts[0].to(torch.int64)) if dtype != torch.bool else \
            hosts[0].logical_not_()
        h.release()

    _on_thread(comm)
    ops.side.synchronize()
    assert torch.equal(t.to(torch.int64), 1 - (torch.arange(10) % 2))


def test_result_context_and_gate_come_from_the_device() -> None:
    adapter, ops = _adapter()
    h = adapter.prepare([torch.ones(2)], [True], [False])
    _on_thread(lambda: (h.acquire(), h.release()))
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
    dist.barrier()
    return f"allocs={ops.host_allocs}"


@pytest.mark.parametrize("on_caller", [False, True], ids=["comm-copies", "caller-copies"])
def test_collectives_end_to_end_through_fake_staging(on_caller: bool) -> None:
    res = run_ranks(_collectives_through_fake_staging, 3, on_caller)
    assert all(r.startswith("allocs=") for r in res)
