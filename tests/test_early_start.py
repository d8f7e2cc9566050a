"""Early start (mccl.engine): a queued all-reduce's first sends go out while the op before it
still receives its last segment. Results stay exact, ops stay in issue order, an op that
shares a tensor with the running one or whose inputs are not ready yet is not started early,
and a dead peer still fails every survivor instead of hanging.

Ops are queued behind one that waits for the last rank (it joins late), so on every other
rank the whole queue is there when the first op reaches its last step: how many ops start
early is then known, not left to timing. (An all-reduce's last step comes after it has heard
from every rank; a reduce-scatter's or all-gather's may not, so those queue behind a tiny
all-reduce.)
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch

from mccl.bench.spawn import run_ranks
from tests.device_fakes import FakeAsyncOps, install_fake_staging, slow_fill

LATE_S = 0.5  # the last rank joins this much later, so the others' queues are full


def _early_starts(engine) -> dict:
    """This rank's count of early starts, once every rank is done (before the group ends)."""
    import torch.distributed as dist

    early = engine.early_starts
    dist.barrier()
    return {"early": early}


def _values(rank: int, i: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    return (torch.arange(n) % 97 * (rank + 1) + i).to(dtype)


def _want(world: int, i: int, n: int, dtype: torch.dtype, op: str) -> torch.Tensor:
    vals = [_values(r, i, n, dtype) for r in range(world)]
    if op == "max":
        return torch.stack(vals).amax(0)
    # float sums in float32 (half types reduce in float32 and round once), ints exact
    acc = sum(v.float() if dtype.is_floating_point else v for v in vals)
    if op == "avg":
        acc = acc / world
    return acc.to(dtype)


#: (elements, dtype, op): ring-sized ones (over 128 KiB in the dtype reduced in) start the
#: op behind them early; the 1000-element one runs recursive doubling.
OPS = [(300_001, torch.float32, "sum"), (70_001, torch.float16, "sum"),
       (1_000, torch.float32, "sum"), (200_003, torch.bfloat16, "avg"),
       (150_001, torch.int64, "max"), (90_001, torch.float64, "sum")]


def _queued(rank: int, world: int) -> dict:
    import torch.distributed as dist

    ops = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX}
    engine = dist.group.WORLD._engine
    if rank == world - 1:
        time.sleep(LATE_S)
    tensors = [_values(rank, i, n, dt) for i, (n, dt, _) in enumerate(OPS)]
    works = [dist.all_reduce(t, op=ops[op], async_op=True)
             for t, (_, _, op) in zip(tensors, OPS, strict=True)]
    # an op without a start part in the queue, then one tensor twice in a row: neither the
    # broadcast nor the second op on that tensor may start early
    cast = torch.full((5,), float(rank))
    works.append(dist.broadcast(cast, src=0, async_op=True))
    twice = torch.full((40_000,), float(rank + 1))
    works += [dist.all_reduce(twice, async_op=True), dist.all_reduce(twice, async_op=True)]
    for w in works:
        w.wait()
    for i, (t, (n, dt, op)) in enumerate(zip(tensors, OPS, strict=True)):
        assert torch.equal(t, _want(world, i, n, dt, op)), (i, n, dt, op)
    assert torch.equal(cast, torch.zeros(5))
    s = float(sum(range(1, world + 1)))
    assert torch.equal(twice, torch.full((40_000,), s * world))
    return _early_starts(engine)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_queued_all_reduces_start_early_and_stay_exact(world: int) -> None:
    res = run_ranks(_queued, world, timeout=120)
    # a ring-sized op followed by an all-reduce of other tensors starts it early: 0->1,
    # 1->2 (op 2, doubling, has nothing to send early, but is started), 3->4, 4->5. Op 2 runs
    # doubling (no last-step signal), op 5 is followed by the broadcast (no start part), and
    # the first all-reduce of `twice` (160 KB: ring) by one of the same tensor.
    for r in range(world - 1):
        assert res[r]["early"] == 4, (r, res)


def _mixed(rank: int, world: int) -> dict:
    """FSDP's ops queued back to back: reduce-scatters and all-gathers (flat and list forms,
    half types, AVG) and an all-reduce; each starts the next early."""
    import torch.distributed as dist

    engine = dist.group.WORLD._engine
    if rank == world - 1:
        time.sleep(LATE_S)
    m = 50_001  # elements per rank's part: 200 KB in float32, ring path

    def inp(q: int, n: int, dtype: torch.dtype) -> torch.Tensor:
        return (torch.arange(n) % 89 + q).to(dtype)

    rs_flat_in = inp(rank, world * m, torch.float32)
    rs_flat_out = torch.zeros(m)
    ag_flat_out = torch.zeros(world * m)
    rs_list_in = [inp(rank + i, m, torch.bfloat16) for i in range(world)]
    rs_list_out = torch.zeros(m, dtype=torch.bfloat16)
    ag_list_out = [torch.zeros(m, dtype=torch.int64) for _ in range(world)]
    ar = inp(rank, 300_001, torch.float32)
    rs_half_in = inp(rank, world * m, torch.float16)
    rs_half_out = torch.zeros(m, dtype=torch.float16)
    avg = dist.ReduceOp.AVG
    works = [
        # waits for the late rank (a reduce-scatter's last step can come before any receive
        # from it); tiny: recursive doubling, which starts nothing early
        dist.all_reduce(torch.zeros(1), async_op=True),
        dist.reduce_scatter_tensor(rs_flat_out, rs_flat_in, async_op=True),
        dist.all_gather_into_tensor(ag_flat_out, inp(rank, m, torch.float32), async_op=True),
        dist.reduce_scatter(rs_list_out, rs_list_in, op=avg, async_op=True),
        dist.all_gather(ag_list_out, inp(rank, m, torch.int64), async_op=True),
        dist.all_reduce(ar, async_op=True),
        dist.reduce_scatter_tensor(rs_half_out, rs_half_in, async_op=True),
    ]
    for w in works:
        w.wait()
    part = slice(rank * m, (rank + 1) * m)
    assert torch.equal(rs_flat_out, sum(inp(q, world * m, torch.float32)[part]
                                        for q in range(world)))
    assert torch.equal(ag_flat_out, torch.cat([inp(q, m, torch.float32) for q in range(world)]))
    want = sum(inp(q + rank, m, torch.bfloat16).float() for q in range(world)) / world
    assert torch.equal(rs_list_out, want.to(torch.bfloat16))
    assert all(torch.equal(g, inp(q, m, torch.int64)) for q, g in enumerate(ag_list_out))
    assert torch.equal(ar, sum(inp(q, 300_001, torch.float32) for q in range(world)))
    want = sum(inp(q, world * m, torch.float16)[part].float() for q in range(world))
    assert torch.equal(rs_half_out, want.to(torch.float16))
    return _early_starts(engine)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_queued_reduce_scatters_and_all_gathers_start_early(world: int) -> None:
    res = run_ranks(_mixed, world, timeout=120)
    for r in range(world - 1):  # every one of the six starts the next
        assert res[r]["early"] == 5, (r, res)


def _staged(rank: int, world: int) -> dict:
    """Staged hand-offs (the fake asynchronous device): early starts copy the next op's
    first pieces while the op before still receives; an op whose producer has not finished
    is not started early (its acquire would wait for the device)."""
    import torch.distributed as dist

    from mccl import collectives
    from mccl.algorithms import ring
    from mccl.device import staging

    staging.PIPELINE_MIN_BYTES = collectives.SMALL_BYTES + (16 << 10)  # ranges from 144 KiB,
    ring.PIECE_MIN_BYTES = 16 << 10  # in pieces finer than these segments (test hooks)
    adapter = install_fake_staging(False)
    ops: FakeAsyncOps = adapter.ops  # type: ignore[assignment]
    engine = dist.group.WORLD._engine
    if rank == world - 1:
        time.sleep(LATE_S)
    n = 100_003
    bufs = [torch.zeros(n) for _ in range(4)]
    for i, b in enumerate(bufs[:2]):
        b.copy_(_values(rank, i, n, torch.float32))
    works = [dist.all_reduce(b, async_op=True) for b in bufs[:2]]
    # op 2's producer is still running when op 1 reaches its last step: not started early
    slow_fill(ops.current, bufs[2], float(rank), delay=LATE_S + 1.0)
    works.append(dist.all_reduce(bufs[2], async_op=True))
    bufs[3].copy_(_values(rank, 3, n, torch.float32))
    works.append(dist.all_reduce(bufs[3], async_op=True))
    for w in works:
        w.wait()
    ops.current.synchronize()
    for i in (0, 1, 3):
        assert torch.equal(bufs[i], _want(world, i, n, torch.float32, "sum")), i
    assert torch.equal(bufs[2], torch.full((n,), float(sum(range(world)))))
    return _early_starts(engine)


@pytest.mark.parametrize("world", [2, 3])
def test_staged_all_reduces_start_early_only_when_ready(world: int) -> None:
    res = run_ranks(_staged, world, timeout=120)
    for r in range(world - 1):  # 0->1 and 2->3 early; 1->2 waits for op 2's producer
        assert res[r]["early"] == 2, (r, res)


def _killed(rank: int, world: int) -> dict:
    """Batches of queued all-reduces (early starts between them) until a rank is killed."""
    from datetime import timedelta

    import torch.distributed as dist

    from mccl import CollectiveError

    group = dist.new_group(list(range(world)), timeout=timedelta(seconds=5))
    engine = group._engine
    if rank == world - 1:  # killed mid-batch, at whatever point its ops are
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    bufs = [torch.ones(300_000) for _ in range(4)]
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            for w in [dist.all_reduce(b, group=group, async_op=True) for b in bufs]:
                w.wait()
            for b in bufs:
                b.fill_(1.0)
    except CollectiveError as e:
        return {"peer": e.peer, "early": engine.early_starts}
    return {"peer": None}


def test_dead_peer_during_early_starts_fails_every_survivor() -> None:
    res = run_ranks(_killed, 3, timeout=90, expect_missing=(2,))
    for r in (0, 1):
        assert res[r]["peer"] == 2, res
        assert res[r]["early"] > 0, res  # the early path was in use when the peer died


def _drain_and_mismatch(rank: int, world: int) -> dict:
    """Queued ops (early starts among them) drain at destroy_process_group; ranks that queue
    different ops behind an all-reduce get errors naming both ops, not a hang or a result."""
    from datetime import timedelta

    import torch.distributed as dist

    from mccl import CollectiveError

    g = dist.new_group(list(range(world)))
    bufs = [torch.full((300_000,), float(rank + i)) for i in range(6)]
    works = [dist.all_reduce(b, group=g, async_op=True) for b in bufs]
    dist.destroy_process_group(g)  # drains what is queued first
    for w in works:
        w.wait()
    drained = all(torch.equal(b, torch.full((300_000,), float(sum(r + i for r in range(world)))))
                  for i, b in enumerate(bufs))
    g = dist.new_group(list(range(world)), timeout=timedelta(seconds=5))
    if rank == world - 1:
        time.sleep(LATE_S)  # so rank 0's second op is queued when its first reaches its end
    works = [dist.all_reduce(torch.ones(300_000), group=g, async_op=True)]
    if rank == 0:  # started early behind the first all-reduce, unlike the others' op
        works.append(dist.all_reduce(torch.ones(400_000), group=g, async_op=True))
    else:
        out = torch.zeros(world * 100_000)
        works.append(dist.all_gather_into_tensor(out, torch.ones(100_000), group=g,
                                                 async_op=True))
    outcome = []
    for w in works:
        try:
            w.wait()
            outcome.append("ok")
        except CollectiveError as e:
            outcome.append(str(e))
    return {"drained": drained, "outcome": outcome, "early": g._engine.early_starts}


def test_queued_ops_drain_at_shutdown_and_mismatches_fail_clearly() -> None:
    res = run_ranks(_drain_and_mismatch, 3, timeout=90)
    for r in res:
        assert r["drained"], res
        assert r["outcome"][0] == "ok", res  # the op both sides issued
        assert "mismatch" in r["outcome"][1] or "reported by rank" in r["outcome"][1], res
    assert res[0]["early"] == 1  # rank 0's second op did start early
    both = res[0]["outcome"][1] + res[1]["outcome"][1]
    assert "all_reduce" in both and "all_gather" in both  # the two ops are named


def _parked_receive_first(rank: int, world: int) -> int:
    """Rank 0 posts irecv(t), then queues a ring all-reduce of another tensor and one of t;
    the message for t comes only after the first all-reduce: the second must not start early
    and send t before the receive filled it (issue order on one tensor)."""
    import torch.distributed as dist

    n = 300_000  # above the doubling switch: the ring, whose first sends can go early
    bad = 0
    for _ in range(3):
        a = torch.full((n,), float(rank + 1))
        t = torch.full((n,), -1000.0 if rank == 0 else float(rank))
        works = [dist.irecv(t, src=world - 1)] if rank == 0 else []
        works.append(dist.all_reduce(a, async_op=True))
        if rank == world - 1:
            time.sleep(0.3)
            works.append(dist.isend(torch.full((n,), 7.0), dst=0))
        works.append(dist.all_reduce(t, async_op=True))
        for w in works:
            w.wait()
        bad += not torch.equal(t, torch.full((n,), 7.0 + sum(range(1, world))))
        dist.barrier()
    return bad


def test_an_op_on_a_parked_receives_tensor_does_not_start_early() -> None:
    assert run_ranks(_parked_receive_first, 3, timeout=120) == [0, 0, 0]
