"""Issue #2: the core collectives on real processes over loopback, against exact values."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest
import torch

from mccl.bench.spawn import free_port, run_ranks

SIZES = [0, 1, 2, 7, 1001, 65_536, 300_007, 1_300_003]  # small, direct and ring paths


def _expect_sum(n: int, w: int) -> torch.Tensor:
    base = torch.arange(n, dtype=torch.float64)
    return base * w + sum(range(w))


def _collectives(rank: int, w: int) -> str:
    import torch.distributed as dist

    checked = 0
    for n in SIZES:
        # all_reduce: integer-valued floats make every sum exact
        t = torch.arange(n, dtype=torch.float32) + rank
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        assert work.is_completed()
        assert torch.equal(t, _expect_sum(n, w).float()), f"all_reduce n={n}"
        # broadcast from every root
        for root in range(w):
            b = torch.full((n,), float(rank)) if rank == root else torch.full((n,), -1.0)
            dist.broadcast(b, src=root)
            assert bool((b == root).all()), f"broadcast n={n} root={root}"
        # all_gather (list) and all_gather_into_tensor
        mine = torch.arange(n, dtype=torch.int64) * 10 + rank
        outs = [torch.empty(n, dtype=torch.int64) for _ in range(w)]
        dist.all_gather(outs, mine)
        for r in range(w):
            assert torch.equal(outs[r], torch.arange(n, dtype=torch.int64) * 10 + r)
        flat = torch.empty(n * w, dtype=torch.int64)
        dist.all_gather_into_tensor(flat, mine)
        assert torch.equal(flat, torch.cat([torch.arange(n) * 10 + r for r in range(w)]))
        # reduce_scatter_tensor: rank r contributes r+1 everywhere
        inp = torch.full((n * w,), float(rank + 1))
        out = torch.empty(n)
        dist.reduce_scatter_tensor(out, inp)
        assert bool((out == w * (w + 1) / 2).all()), f"reduce_scatter n={n}"
        assert bool((inp == rank + 1).all()), "reduce_scatter must not modify its input"
        # reduce to each root leaves non-roots unchanged
        root = n % w
        x = torch.arange(n, dtype=torch.float32) + rank
        dist.reduce(x, dst=root)
        want = _expect_sum(n, w).float() if rank == root else torch.arange(n).float() + rank
        assert torch.equal(x, want), f"reduce n={n}"
        checked += 5
    # in-place on a view of a bigger tensor (DDP bucket views look like this)
    big = torch.zeros(10, 100)
    big[3] = rank + 1
    dist.all_reduce(big[3])
    assert bool((big[3] == w * (w + 1) / 2).all()) and bool((big[4] == 0).all())
    dist.barrier()
    # futures complete with the tensor
    t = torch.ones(3)
    fut = dist.all_reduce(t, async_op=True).get_future()
    assert torch.equal(fut.wait()[0], torch.full((3,), float(w)))
    # many outstanding async ops complete in order with correct values
    ts = [torch.full((1000,), float(i + rank)) for i in range(20)]
    works = [dist.all_reduce(x, async_op=True) for x in ts]
    for i, (x, wk) in enumerate(zip(ts, works, strict=True)):
        wk.wait()
        assert bool((x == i * w + sum(range(w))).all())
    return f"rank {rank}: {checked} checks"


@pytest.mark.parametrize("world", [2, 3, 4])
def test_collectives_exact(world: int) -> None:
    res = run_ranks(_collectives, world, timeout=180)
    assert all("checks" in r for r in res)


def _large_all_gathers(rank: int, w: int) -> None:
    """All-gathers of inputs over 1 MiB, whose local copy into the output is interleaved
    with the ring's receives: queued, so later ones start while earlier ones still receive;
    one dtype per layout; one whose input already is its part of the output (no copy)."""
    import torch.distributed as dist

    n = (1 << 20) // 8 + 13  # int64 elements

    def part(q: int, i: int, dtype: torch.dtype) -> torch.Tensor:
        return ((torch.arange(n) * 7 + q * 1000 + i) % 30_011).to(dtype)

    flats = [torch.zeros(w * n, dtype=torch.int64) for _ in range(3)]
    lists = [torch.zeros(n, dtype=torch.float16) for _ in range(w)]
    works = [dist.all_gather_into_tensor(out, part(rank, i, torch.int64), async_op=True)
             for i, out in enumerate(flats)]
    works.append(dist.all_gather(lists, part(rank, 9, torch.float16), async_op=True))
    for wk in works:
        wk.wait()
    for i, out in enumerate(flats):
        assert torch.equal(out, torch.cat([part(q, i, torch.int64) for q in range(w)])), i
    for q, got in enumerate(lists):
        assert torch.equal(got, part(q, 9, torch.float16)), q
    shared = torch.zeros(w * n, dtype=torch.int64)
    mine = shared[rank * n:(rank + 1) * n]
    mine.copy_(part(rank, 5, torch.int64))
    dist.all_gather_into_tensor(shared, mine)
    assert torch.equal(shared, torch.cat([part(q, 5, torch.int64) for q in range(w)]))


def test_large_queued_all_gathers() -> None:
    run_ranks(_large_all_gathers, 3, timeout=120)


def _pooled_reduce_scatters(rank: int, w: int) -> dict:
    """Reduce-scatters of several chunks per segment, queued and blocking, over real sockets:
    partial sums go through the cached pool whenever its slot's send was written (the
    channel's ``passed``, counted here) and through the segment buffers otherwise."""
    import collections

    import torch.distributed as dist

    from mccl import engine

    seen: collections.Counter = collections.Counter()
    passed = engine.OpChannel.passed

    def counted(self, peer: int, ticket: int) -> bool:
        ok = passed(self, peer, ticket)
        seen[ok] += 1
        return ok

    engine.OpChannel.passed = counted
    m = (3 << 20) // 4 + 5  # float32 elements per rank: several chunks per segment

    def inp(q: int, i: int, dtype: torch.dtype) -> torch.Tensor:
        return ((torch.arange(w * m) * 3 + q * 101 + i) % 4093).to(dtype)

    cases = [(dist.ReduceOp.SUM, torch.float32), (dist.ReduceOp.MAX, torch.int32),
             (dist.ReduceOp.SUM, torch.float64)]
    outs = [torch.empty(m, dtype=dt) for _, dt in cases]
    works = [dist.reduce_scatter_tensor(out, inp(rank, i, dt), op=op, async_op=True)
             for i, ((op, dt), out) in enumerate(zip(cases, outs, strict=True))]
    for wk in works:
        wk.wait()
    for i, ((op, dt), out) in enumerate(zip(cases, outs, strict=True)):
        every = torch.stack([inp(q, i, dt) for q in range(w)])
        want = every.sum(0) if op == dist.ReduceOp.SUM else every.amax(0)
        assert torch.equal(out, want[rank * m:(rank + 1) * m].to(dt)), (op, dt)
    again = torch.empty(m)
    dist.reduce_scatter_tensor(again, inp(rank, 7, torch.float32))
    want = torch.stack([inp(q, 7, torch.float32) for q in range(w)]).sum(0)
    assert torch.equal(again, want[rank * m:(rank + 1) * m])
    return dict(seen)


@pytest.mark.parametrize("world", [3, 4])
def test_reduce_scatter_partial_sums_through_the_pool(world: int) -> None:
    res = run_ranks(_pooled_reduce_scatters, world, timeout=180)
    assert all(r.get(True, 0) > 0 for r in res), res  # the pool was used on every rank


def _p2p(rank: int, w: int) -> None:
    import torch.distributed as dist

    nxt, prv = (rank + 1) % w, (rank - 1) % w
    for n in [0, 5, 200_003]:
        send = torch.arange(n, dtype=torch.float32) + 1000 * rank
        recv = torch.empty(n)
        # both orders of a ring exchange must work
        ops = [dist.P2POp(dist.irecv, recv, prv), dist.P2POp(dist.isend, send, nxt)]
        for wk in dist.batch_isend_irecv(ops):
            wk.wait()
        assert torch.equal(recv, torch.arange(n, dtype=torch.float32) + 1000 * prv)
    # tags are matched, not arrival order
    if rank == 0:
        dist.send(torch.full((4,), 1.0), 1, tag=1)
        dist.send(torch.full((4,), 2.0), 1, tag=2)
    elif rank == 1:
        a, b = torch.empty(4), torch.empty(4)
        dist.recv(b, 0, tag=2)
        dist.recv(a, 0, tag=1)
        assert bool((a == 1).all()) and bool((b == 2).all())
    dist.barrier()


@pytest.mark.parametrize("world", [2, 3])
def test_point_to_point(world: int) -> None:
    run_ranks(_p2p, world, timeout=120)


MANY = 3000  # messages each sender sends to rank 0 in one go


def _many_posted_receives(rank: int, w: int) -> None:
    """Ranks 1 and 2 each send ``MANY`` small messages and shut down as soon as they are
    sent; rank 0 posts every receive before waiting for any: rank 2's first, then rank 1's,
    half of them into adjacent slices of one buffer, two tags interleaved."""
    import torch.distributed as dist

    if rank:
        works = [dist.isend(torch.full((4,), float(rank * 100_000 + i)), 0, tag=i % 2)
                 for i in range(MANY)]
        for wk in works:
            wk.wait()
        return  # and the harness shuts the group down while rank 0 is still reading
    slab = torch.full((MANY // 2, 4), -1.0)
    bufs = {src: [slab[i] if src == 1 and i < MANY // 2 else torch.full((4,), -1.0)
                  for i in range(MANY)] for src in (1, 2)}
    works = [dist.irecv(bufs[src][i], src, tag=i % 2) for src in (2, 1) for i in range(MANY)]
    for wk in works:
        wk.wait()
    for src in (1, 2):
        got = torch.stack(bufs[src])[:, 0]
        want = torch.arange(MANY, dtype=torch.float32) + src * 100_000
        assert torch.equal(got, want), (src, (got != want).nonzero()[:5].tolist())


def test_thousands_of_posted_receives_all_arrive_though_their_senders_have_left() -> None:
    run_ranks(_many_posted_receives, 3, timeout=120)


def _slow_stream(rank: int, w: int, n: int, gap_s: float) -> None:
    import time

    import torch.distributed as dist

    if rank == 1:
        for i in range(n):
            time.sleep(gap_s)
            dist.send(torch.full((3,), float(i)), 0)
    else:
        bufs = [torch.empty(3) for _ in range(n)]
        works = [dist.irecv(b, 1) for b in bufs]
        for wk in works:
            wk.wait()
        assert [int(b[0]) for b in bufs] == list(range(n))


def test_receives_posted_ahead_wait_from_their_senders_last_message_not_from_posting() -> None:
    """Six receives posted at once, filled one every 0.6 s: 3.6 s in all, past the 2 s group
    timeout, but the sender is never silent for that long."""
    run_ranks(_slow_stream, 2, 6, 0.6, timeout=120, pg_timeout_s=2.0)


def _message_behind_a_queued_collective(rank: int, w: int) -> bool:
    """Rank 0 queues an async scatter (2 MiB parts), then sends the message rank 1 waits
    for before it joins the scatter: on rank 0's connection the message comes behind the
    scatter's large frame, which rank 1, idle with its receive posted, must read past."""
    import time

    import torch.distributed as dist

    n = (2 << 20) // 4
    if rank == 0:
        work = dist.scatter(torch.empty(n), [torch.zeros(n), torch.ones(n)], src=0,
                            async_op=True)
        time.sleep(0.3)  # the scatter's frame is on its way first
        dist.send(torch.arange(1024.0), 1, tag=9)
        work.wait()
        return True
    got = torch.empty(1024)
    dist.recv(got, 0, tag=9)
    out = torch.empty(n)
    dist.scatter(out, None, src=0)
    return torch.equal(got, torch.arange(1024.0)) and bool((out == 1).all())


def test_a_message_behind_a_queued_collective_reaches_its_posted_receive() -> None:
    """A large frame of a later collective stayed in the socket of an idle rank whose
    posted receive wanted the message behind it: the receive timed out (gloo completes)."""
    assert run_ranks(_message_behind_a_queued_collective, 2, timeout=120,
                     pg_timeout_s=20) == [True, True]


def _bad_input(rank: int, w: int) -> list[str]:
    import torch.distributed as dist

    errors = []
    cases = [
        lambda: dist.all_reduce(torch.ones(1).expand(4)),  # result into shared elements
        lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.BAND),  # op/dtype
        lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.AVG),
        lambda: dist.all_reduce(torch.ones(4, device="meta")),  # device
        lambda: dist.all_gather([torch.ones(2)] * (w + 1), torch.ones(2)),  # list length
        lambda: dist.all_gather_into_tensor(torch.ones(3), torch.ones(2)),  # output size
        lambda: dist.reduce_scatter_tensor(torch.ones(2), torch.ones(3)),
        lambda: dist.broadcast(torch.ones(2), src=w + 5),
    ]
    for case in cases:
        try:
            case()
        except (TypeError, ValueError, RuntimeError) as e:
            errors.append(f"{type(e).__name__}: {e}")
        else:
            errors.append("NO ERROR")
    # the group is still usable
    t = torch.ones(8)
    dist.all_reduce(t)
    assert bool((t == w).all())
    return errors


def test_bad_input_raises_before_sending() -> None:
    res = run_ranks(_bad_input, 2, timeout=90)
    for errs in res:
        assert "NO ERROR" not in errs, errs
    text = "\n".join(res[0])
    assert "expanded" in text
    assert "BAND" in text and "float32" in text
    assert "AVG" in text and "int32" in text


def _autograd_sees_the_writes(rank: int, w: int) -> dict:
    """Outputs gloo fills with a copy (the gathers, reduce-scatters, list all-to-all,
    coalesced all-reduce) count as in-place writes for autograd, as on gloo."""
    import torch.distributed as dist

    def outcome(call) -> str:
        try:
            call()
            return "no error"
        except RuntimeError as e:
            return str(e)

    got = {}
    x = torch.ones(4, requires_grad=True)
    o = torch.zeros(4 * w)
    y = (x.repeat(w) * o).sum()  # saves o for backward
    dist.all_gather_into_tensor(o, torch.full((4,), float(rank + 1)))
    got["saved"] = outcome(y.backward)
    # a leaf that requires grad, on the last rank only: its op fails, the others' completes
    leaf = torch.zeros(4 * w, requires_grad=rank == w - 1)
    got["leaf"] = outcome(lambda: dist.all_gather_into_tensor(leaf, torch.ones(4)))
    p = torch.nn.Parameter(torch.zeros(w))  # views of a leaf, as outputs
    got["view"] = outcome(lambda: dist.all_gather([p[i:i + 1] for i in range(w)], torch.ones(1)))
    got["untouched"] = p.detach().tolist() + leaf.detach().tolist()
    # a non-leaf output: the op replaces its history (no gradient flows to what it held)
    a = torch.ones(2, requires_grad=True)
    outs = [a * 3 for _ in range(w)]
    dist.all_gather(outs, torch.full((2,), float(rank)))
    sum(out.sum() for out in outs).backward()
    got["non_leaf_grad"] = a.grad.tolist()
    got["non_leaf_values"] = [out.tolist() for out in outs]
    with torch.no_grad():  # allowed there, as on gloo
        dist.all_gather_into_tensor(leaf, torch.full((4,), float(rank)))
    got["no_grad"] = leaf.detach().tolist()
    # gather: only the root has outputs
    outs = [torch.empty(2, requires_grad=True) for _ in range(w)] if rank == 0 else None
    got["gather"] = outcome(lambda: dist.gather(torch.ones(2), outs, dst=0))
    t = torch.ones(8)
    dist.all_reduce(t)  # the group is in step and usable
    got["after"] = t.tolist()
    return got


def test_outputs_written_by_a_copy_on_gloo_count_as_in_place_writes_for_autograd() -> None:
    w = 2
    for rank, got in enumerate(run_ranks(_autograd_sees_the_writes, w, timeout=90)):
        assert "modified by an inplace operation" in got["saved"], got["saved"]
        if rank == w - 1:
            assert "mccl all_gather_into_tensor: a leaf Variable that requires grad" in (
                got["leaf"]), got["leaf"]
        else:
            assert got["leaf"] == "no error", got["leaf"]
        assert "mccl all_gather: a view of a leaf Variable" in got["view"], got["view"]
        written = 0.0 if rank == w - 1 else 1.0  # refused outputs are not written
        assert got["untouched"] == [0.0] * w + [written] * (4 * w), got["untouched"]
        assert got["non_leaf_grad"] == [0.0, 0.0]
        assert got["non_leaf_values"] == [[float(r)] * 2 for r in range(w)]
        assert got["no_grad"] == [float(r) for r in range(w) for _ in range(4)]
        if rank == 0:
            assert "mccl gather: a leaf Variable that requires grad" in got["gather"]
        else:
            assert got["gather"] == "no error"
        assert got["after"] == [float(w)] * 8


def _store_init(rank: int, w: int, port: int) -> float:
    import torch.distributed as dist

    import mccl  # noqa: F401

    store = dist.TCPStore("127.0.0.1", port, w, is_master=rank == 0,
                          timeout=timedelta(seconds=30))
    dist.init_process_group("mccl", store=store, rank=rank, world_size=w)
    assert dist.get_backend() == "mccl"
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()


def test_explicit_store() -> None:
    port = free_port()
    res = run_ranks(_store_init, 3, port, init=False, timeout=90)
    assert res == [3.0, 3.0, 3.0]


TORCHRUN_SCRIPT = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    import mccl
    dist.init_process_group("mccl")
    t = torch.full((1000,), float(dist.get_rank()))
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    w = dist.get_world_size()
    assert bool((t == (w - 1) / 2).all()), t[:3]
    print("RESULT", dist.get_rank(), t[0].item(), flush=True)
    dist.destroy_process_group()
""")


def test_torchrun_env_init(tmp_path) -> None:
    script = tmp_path / "job.py"
    script.write_text(TORCHRUN_SCRIPT)
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3",
           "--master-addr", "127.0.0.1", "--master-port", str(port),
           "--log-dir", str(tmp_path / "torchrun"), str(script)]  # else a dir left in /tmp
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.count("RESULT") == 3


def _device_id_init(rank: int, w: int, port: int, kind: str) -> str:
    import torch.distributed as dist

    import mccl  # noqa: F401

    # init_process_group(device_id=...) only accepts the build's accelerator; pretend this
    # CPU build has one so the path users take on Macs (mps:0) and GPUs (cuda:0) is exercised.
    torch.accelerator.current_accelerator = lambda *a, **k: torch.device(kind)
    torch.accelerator.device_count = lambda: 1
    dist.init_process_group("mccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=w, device_id=torch.device(kind, 0))
    pg = dist.group.WORLD
    # torch sets bound_device_id on a placeholder group that a Python group replaces.
    assert pg._get_backend(torch.device(kind, 0)) is pg
    sub = dist.new_group([0, 1])  # new groups consult the bound device's backend too
    t = torch.ones(2)
    dist.all_reduce(t, group=sub)
    dist.destroy_process_group()
    return f"ok {t.tolist()}"


@pytest.mark.parametrize("kind", ["cuda", "mps"])
def test_device_id_init_path(kind: str) -> None:
    port = free_port()
    res = run_ranks(_device_id_init, 2, port, kind, init=False, timeout=90)
    assert res == ["ok [2.0, 2.0]"] * 2


def _per_device_backends(rank: int, w: int, port: int, spec: str) -> tuple:
    import torch.distributed as dist

    import mccl  # noqa: F401

    dist.init_process_group(spec, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=w, timeout=timedelta(seconds=30))
    pg = dist.group.WORLD
    t = torch.full((300_001,), float(rank + 1))  # the ring, not just the small-op path
    dist.all_reduce(t)
    sub = dist.new_group(list(range(w)))
    u = torch.full((5,), float(rank))
    dist.all_reduce(u, group=sub)
    kinds = (type(pg).__name__, type(sub).__name__)
    named = dist.get_backend()
    dist.destroy_process_group()
    return kinds, named == spec, bool(t.eq(t[0]).all()), t[0].item(), u.tolist()


@pytest.mark.parametrize("spec", ["cpu:gloo,mps:mccl", "mps:mccl,cpu:gloo", "cpu:mccl"])
def test_a_backend_per_device_gives_one_mccl_group(spec: str) -> None:
    """``init_process_group("cpu:gloo,mps:mccl")``, as Mac users write it: torch lets the
    Python group stand for the whole group, so CPU tensors go through mccl too, with the same
    results, whichever device the string names first."""
    res = run_ranks(_per_device_backends, 3, free_port(), spec, init=False, timeout=90)
    assert res == [(("ProcessGroupMCCL", "ProcessGroupMCCL"), True, True, 6.0, [3.0] * 5)] * 3


def _init_with_pg_options(rank: int, w: int, port: int) -> tuple:
    import logging

    import torch.distributed as dist

    import mccl  # noqa: F401

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logging.getLogger("mccl").addHandler(Keep())

    class NcclStyleOptions:
        is_high_priority_stream = True

    dist.init_process_group("mccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=w, pg_options=NcclStyleOptions())
    dist.new_group([0, 1], pg_options=NcclStyleOptions())  # said once per process
    t = torch.ones(2)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.tolist(), [m for m in seen if "pg_options" in m]


def test_pg_options_are_named_as_ignored_once() -> None:
    """mccl has no backend options: options a user passes are not dropped without a word."""
    res = run_ranks(_init_with_pg_options, 2, free_port(), init=False, timeout=90)
    said = ("mccl takes no backend options: pg_options=NcclStyleOptions is ignored (the "
            "timeout and device come from init_process_group's own arguments)")
    assert res == [([2.0, 2.0], [said])] * 2


def test_socket_ifname_unknown_interface_is_clear() -> None:
    from mccl.transport.address import choose_address

    with pytest.raises(ValueError, match="MCCL_SOCKET_IFNAME"):
        choose_address("no-such-if0", None)
    assert choose_address("lo", None) == "127.0.0.1"
    # names the kernel would cut to an existing interface's name (at 15 bytes or a NUL)
    for name in ("lo\0x", "lo" + "\0" * 14 + "x"):
        with pytest.raises(ValueError, match="MCCL_SOCKET_IFNAME"):
            choose_address(name, None)


#: A Mac's interfaces in the kernel's order, with their IPv4 addresses (None: none).
MAC_IFACES = {"lo0": "127.0.0.1", "en0": "192.168.1.5", "en1": None, "utun0": None,
              "bridge0": "10.0.0.1", "en10": "172.16.0.2"}


@pytest.fixture
def on_a_mac(monkeypatch: pytest.MonkeyPatch):
    """address, seeing MAC_IFACES as this machine's interfaces, the route to the master
    through en0."""
    from mccl.transport import address

    monkeypatch.setattr(address, "interface_names", lambda: list(MAC_IFACES))
    monkeypatch.setattr(address, "ipv4_address", MAC_IFACES.get)
    monkeypatch.setattr(address, "_ifname_ipv6", lambda name: None)
    monkeypatch.setattr(address, "route_address", lambda master: "192.168.1.5")
    return address


@pytest.mark.parametrize("spec,want", [
    ("en0", "192.168.1.5"),             # a name
    ("en1,bridge0", "10.0.0.1"),        # first with an address wins
    ("en", "192.168.1.5"),              # a prefix, in the kernel's order
    ("en1", "172.16.0.2"),              # en1 has no address, en10 starts with en1
    ("=en1,en10", "172.16.0.2"),        # exact names only
    ("^lo,en", "10.0.0.1"),             # excluded prefixes
    ("^=en0", "10.0.0.1"),              # the route's interface excluded: first non-loopback
    (" ^ lo0 , bridge0 ", "192.168.1.5"),
    ("^en,bridge", "127.0.0.1"),        # only loopback is left
])
def test_socket_ifname_takes_nccls_syntax(spec: str, want: str, on_a_mac) -> None:
    """MCCL_SOCKET_IFNAME is written as NCCL_SOCKET_IFNAME: names or prefixes, '=' exact,
    '^' excluded; with '^' the address on the route to the master is preferred."""
    assert on_a_mac.choose_address(spec, "mac0.local") == want


@pytest.mark.parametrize("spec,words", [
    ("^lo0,en,utun,bridge", "other than those"),
    ("=en", "matching that"),
    ("^", "names no interface"),
    (" , ", "names no interface"),
    ("=", "names no interface"),
])
def test_socket_ifname_that_leaves_nothing_is_clear(spec: str, words: str, on_a_mac) -> None:
    with pytest.raises(ValueError, match=f"MCCL_SOCKET_IFNAME.*{words}"):
        on_a_mac.choose_address(spec, None)


def test_socket_ifname_exclusion_prefers_the_route_to_the_master(
        on_a_mac, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(on_a_mac, "route_address", lambda master: "10.0.0.1")
    assert on_a_mac.choose_address("^lo", "mac0.local") == "10.0.0.1"  # not en0, the first


def _ipv6_init(rank: int, w: int, port: int) -> tuple:
    import socket

    import torch.distributed as dist

    import mccl  # noqa: F401

    dist.init_process_group("mccl", init_method=f"tcp://[::1]:{port}", rank=rank,
                            world_size=w, timeout=timedelta(seconds=30))
    t = torch.full((300_001,), float(rank + 1))  # the ring, not just the small-op path
    dist.all_reduce(t)
    peers = [p for p in dist.group.WORLD._mesh.peers if p is not None]
    families = {p.sock.family == socket.AF_INET6 for p in peers}
    dist.destroy_process_group()
    return t[0].item(), bool(t.eq(t[0]).all()), families


def test_an_ipv6_master_gives_ipv6_connections() -> None:
    """With the master at an IPv6 address (no IPv4 to reach it by), ranks listen, advertise
    and connect over IPv6."""
    import socket

    if not socket.has_ipv6:
        pytest.skip("this Python has no IPv6")
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    w = 3
    res = run_ranks(_ipv6_init, w, free_port(), init=False, timeout=90)
    assert res == [(float(w * (w + 1) // 2), True, {True})] * w


@pytest.mark.parametrize("host,port,text", [
    ("10.0.0.2", 29500, "10.0.0.2:29500"),
    ("::1", 1, "[::1]:1"),
    ("fe80::1%en0", 65535, "[fe80::1%en0]:65535"),
])
def test_listen_addresses_round_trip(host: str, port: int, text: str) -> None:
    from mccl.transport.address import join_host_port, split_host_port

    assert join_host_port(host, port) == text
    assert split_host_port(text) == (host, port)


def test_a_link_local_address_keeps_its_interface_and_is_dialled_through_ours() -> None:
    """A link-local IPv6 address is only usable with an interface: the route's source address
    keeps it (``%lo``), and a peer's (its own interface's name, ``%en1``) is dialled through
    this rank's interface, whose name may differ."""
    import socket

    from mccl.transport import address

    lo = socket.if_nameindex()[0]
    assert address._with_scope(("fe80::1", 0, 0, lo[0])) == f"fe80::1%{lo[1]}"
    assert address._with_scope(("fe80::1%x", 0, 0, lo[0])) == "fe80::1%x"
    assert address._with_scope(("fd00::2", 0, 0, 0)) == "fd00::2"
    assert address._with_scope(("10.0.0.2", 0)) == "10.0.0.2"
    assert address.through_own_interface("fe80::2%en1", "fe80::1%en0") == "fe80::2%en0"
    assert address.through_own_interface("fd00::2", "fd00::1") == "fd00::2"
    assert address.through_own_interface("10.0.0.2", "10.0.0.1") == "10.0.0.2"


def test_the_route_prefers_the_masters_ipv4_address(monkeypatch: pytest.MonkeyPatch) -> None:
    """A master name with both kinds of address (``localhost`` on a Mac lists ::1 first)
    keeps the IPv4 route every earlier version took; an IPv6-only one gets IPv6."""
    import socket

    from mccl.transport import address

    both = [(socket.AF_INET6, socket.SOCK_DGRAM, 17, "", ("::1", 9, 0, 0)),
            (socket.AF_INET, socket.SOCK_DGRAM, 17, "", ("127.0.0.1", 9))]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: both)
    assert address._resolve("localhost") == (socket.AF_INET, ("127.0.0.1", 9))
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: both[:1])
    assert address._resolve("[::1]") == (socket.AF_INET6, ("::1", 9, 0, 0))
    monkeypatch.undo()
    assert address._resolve("no-such-host.invalid") is None
    assert address.route_address("127.0.0.1") == "127.0.0.1"


@pytest.mark.parametrize("spec,want", [
    ("utun0", "fd00::5"),               # no IPv4 address: its IPv6 one
    ("en1,utun0", "fd00::5"),           # en1 has neither
    ("en0,utun0", "192.168.1.5"),       # the first that has one wins
    ("bridge0", "10.0.0.1"),            # IPv4 before IPv6 on one interface
    ("^lo0,en,bridge", "fd00::5"),      # excluded, the route elsewhere: the first left
    ("^en,bridge,utun", "127.0.0.1"),   # only loopback is left
])
def test_socket_ifname_takes_an_interface_with_ipv6_only(
        spec: str, want: str, on_a_mac, monkeypatch: pytest.MonkeyPatch) -> None:
    six = {"utun0": "fd00::5", "bridge0": "fd00::1", "lo0": "::1"}
    monkeypatch.setattr(on_a_mac, "_ifname_ipv6", six.get)
    assert on_a_mac.choose_address(spec, "mac0.local") == want


def test_a_bsd_link_local_address_loses_its_embedded_interface_index() -> None:
    """macOS's getifaddrs hands a link-local address with the interface index in its second
    16-bit word (fe80:4::1): the text is the address without it, with the interface name."""
    import ipaddress
    import struct

    from mccl.transport.ifaddrs import sockaddr_in6_text

    def raw(addr: str, scope: int) -> bytes:  # BSD layout: length, family, port, flow, addr
        return (struct.pack("=BBHI", 28, 30, 0, 0) + ipaddress.IPv6Address(addr).packed
                + struct.pack("=I", scope))

    assert sockaddr_in6_text(raw("fe80:4::1", 4), "en0") == (True, "fe80::1%en0")
    assert sockaddr_in6_text(raw("fe80::aa", 0), "en1") == (True, "fe80::aa%en1")
    assert sockaddr_in6_text(raw("fd00:4::1", 0), "en0") == (False, "fd00:4::1")


def test_an_interfaces_ipv6_addresses_are_read() -> None:
    """getifaddrs through ctypes: loopback's ::1, nothing for a name no interface has."""
    import socket

    from mccl.transport.ifaddrs import ipv6_addresses

    assert ipv6_addresses("no-such-if0") == []
    lo = socket.if_nameindex()[0][1]
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    assert "::1" in ipv6_addresses(lo)


@pytest.mark.parametrize("seconds", [0, -1])
def test_a_timeout_that_is_not_positive_is_refused(seconds: int) -> None:
    from mccl.process_group import ProcessGroupMCCL

    with pytest.raises(ValueError, match="timeout must be positive"):
        ProcessGroupMCCL(torch.distributed.HashStore(), 0, 2, timedelta(seconds=seconds))


@pytest.mark.parametrize("value, level", [("", "WARNING"), ("info", "INFO"), ("10", 10)])
def test_log_level_names_and_numbers(monkeypatch, value: str, level) -> None:
    from mccl import config

    monkeypatch.setenv(config.LOG_LEVEL_ENV, value)
    assert config.load().log_level == level


@pytest.mark.parametrize("var, value", [("MCCL_LOG_LEVEL", "verbose"), ("MCCL_LOG_LEVEL", "-5"),
                                        ("MCCL_UNIFIED_COLLECTIVE", "maybe")])
def test_bad_environment_values_name_their_variable(monkeypatch, var: str, value: str) -> None:
    from mccl import config

    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=var):
        config.load()


def test_chunk_cap_follows_the_fewest_cores_per_rank() -> None:
    """Ranks sharing a machine share its cores; a rank's own affinity mask can be smaller;
    the group takes the fewest. Below MIN_CORES_PER_RANK the CPU-bound cap applies."""
    from mccl.algorithms import base
    from mccl.transport.machine import fewest_cores

    assert fewest_cores([("a", 16, 16)] * 8) == 2.0  # 8 ranks on one 16-core machine
    assert fewest_cores([("a", 2, 2)] * 4) == 0.5  # 4 ranks on 2 cores
    assert fewest_cores([("a", 64, 4), ("b", 8, 8)]) == 4.0  # a 4-core affinity mask
    assert fewest_cores([("a", 24, 24), ("b", 24, 24), ("c", 8, 8), ("c", 8, 8)]) == 4.0
    assert base.chunk_cap(2.0) == base.chunk_cap(24.0) == base.MAX_CHUNK_BYTES
    assert base.chunk_cap(1.5) == base.chunk_cap(0.5) == base.CPU_BOUND_CHUNK_BYTES
    assert base.MAX_CHUNK_BYTES < base.CPU_BOUND_CHUNK_BYTES


def test_machines_sharing_a_host_name_differ_by_their_boot(monkeypatch) -> None:
    """Macs imaged alike share a host name: their boot session ids (``kern.bootsessionuuid``
    on macOS; this is the plumbing, faked: no Mac here) still tell them apart, so their
    cores are not pooled as one machine's. Without any boot id they count as one."""
    from mccl.transport import machine

    monkeypatch.setattr(machine, "_BOOT_ID", "/nonexistent/boot_id")
    monkeypatch.setattr(machine.sys, "platform", "darwin")
    monkeypatch.setattr(machine.socket, "gethostname", lambda: "Mac-Studio.local")
    ids = []
    for boot in ("5A0C6E2B-0000-4000-8000-000000000001",
                 "5A0C6E2B-0000-4000-8000-000000000002", "", ""):
        monkeypatch.setattr(machine, "sysctl_string", lambda name, b=boot: b)
        ids.append(machine.machine_id())
    assert ids[0] != ids[1] and ids[2] == ids[3] and len(set(ids)) == 3
    monkeypatch.undo()
    got = machine.sysctl_string(b"kern.bootsessionuuid")
    if sys.platform == "darwin":
        assert len(got) >= 32, got  # read for real where the tests run on a Mac
    else:
        assert got == ""  # glibc has no sysctlbyname: unknown, and no error


def _chunk_caps(rank: int, w: int, port: int) -> dict:
    """Every rank reports itself on its own 64-core machine, except that rank 1 may use only
    one core in the first group: all ranks must agree on each group's cap and compute right."""
    import torch.distributed as dist

    import mccl  # noqa: F401
    from mccl.algorithms import base
    from mccl.transport import machine

    own = [64] * w
    own[1] = 1
    machine.machine_facts = lambda: (f"machine{rank}", 64, own[rank])
    store = dist.TCPStore("127.0.0.1", port, w, is_master=rank == 0,
                          timeout=timedelta(seconds=30))
    dist.init_process_group("mccl", store=store, rank=rank, world_size=w)
    short = dist.distributed_c10d._get_default_group()
    own[1] = 64
    roomy = dist.new_group(list(range(w)))
    n = (3 << 20) + 5  # 12 MB: segments cut into chunks at either cap
    ok = []
    for g in (short, roomy):
        t = torch.arange(n, dtype=torch.float32) % 1000 + rank
        dist.all_reduce(t, group=g)
        ok.append(bool(torch.equal(t, (torch.arange(n) % 1000 * w + sum(range(w))).float())))
        out = torch.empty(n // w)
        dist.reduce_scatter_tensor(out, torch.full((n // w * w,), float(rank)), group=g)
        ok.append(bool((out == sum(range(w))).all()))
    caps = (short._engine.chunk_cap, roomy._engine.chunk_cap)
    dist.destroy_process_group()
    return {"ok": ok, "caps": caps, "want": (base.CPU_BOUND_CHUNK_BYTES, base.MAX_CHUNK_BYTES)}


def test_ranks_agree_on_the_chunk_cap() -> None:
    res = run_ranks(_chunk_caps, 3, free_port(), init=False, timeout=120)
    for r in res:
        assert all(r["ok"]), res
        assert r["caps"] == r["want"], res


def test_log_level_from_the_environment_is_shown_without_logging_setup(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """MCCL_LOG_LEVEL=DEBUG in a script that configured no logging: the records reach stderr
    (Python alone shows only warnings and worse); with the application's own handler they go
    there instead, and without the variable nothing is added."""
    import logging

    from mccl import config

    logger = logging.getLogger("mccl")
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # no application setup
    monkeypatch.setattr(logger, "handlers", [logging.NullHandler()])  # mccl/__init__.py's
    monkeypatch.setattr(logger, "propagate", True)
    monkeypatch.setattr(logger, "level", logger.level)
    monkeypatch.delenv(config.LOG_LEVEL_ENV, raising=False)
    config.apply_log_level("WARNING")
    assert len(logger.handlers) == 1
    monkeypatch.setenv(config.LOG_LEVEL_ENV, "DEBUG")
    config.apply_log_level(config.load().log_level)
    config.apply_log_level(config.load().log_level)  # a second group adds no second handler
    logging.getLogger("mccl.engine").debug("a debug line")
    assert len(logger.handlers) == 2
    err = capsys.readouterr().err
    assert "DEBUG mccl.engine: a debug line" in err and err.count("a debug line") == 1, err
    mine = logging.Handler()
    monkeypatch.setattr(logger, "handlers", [mine])
    config.apply_log_level("DEBUG")
    assert logger.handlers == [mine]


def test_ranks_that_did_not_join_are_named_in_both_numberings() -> None:
    """A subgroup's rendezvous waits by group rank, its member check by global rank: the
    error says which, so "rank 1" of group [2, 5] is not mistaken for global rank 1."""
    from mccl.transport.rendezvous import agree_members, await_ranks, namespace

    store = torch.distributed.HashStore()
    with pytest.raises(TimeoutError, match=r"rank\(s\) \[1\] \(global \[5\]\) did not join"):
        await_ranks(store, namespace("g"), "cores", [1], 0.2, members=[2, 5])
    with pytest.raises(TimeoutError, match=r"global rank\(s\) \[2\] did not join"):
        agree_members(store, 5, [2, 5], "g2", 0.2)


def _join_or_why(rank: int, w: int, port: int) -> str | None:
    """Join the default mccl group; None, or why not (``Type: message``). Its group timeout
    is far beyond the tests' limits: the others must not wait it out."""
    import torch.distributed as dist

    import mccl  # noqa: F401

    try:
        dist.init_process_group("mccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=w, timeout=timedelta(seconds=600))
        return None
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


def _one_rank_cannot_start(rank: int, w: int, port: int, bad: str) -> str:
    if rank == 1:
        os.environ[bad] = {"MCCL_SOCKET_IFNAME": "nosuchif0",
                           "MCCL_LOG_LEVEL": "LOUD"}[bad]
    return _join_or_why(rank, w, port) or "joined"


@pytest.mark.parametrize("bad", ["MCCL_SOCKET_IFNAME", "MCCL_LOG_LEVEL"])
def test_a_rank_that_cannot_start_fails_the_others_at_once_with_its_reason(bad: str) -> None:
    """Rank 1 of 3 fails before it connects (its interface, or its environment, is wrong):
    ranks 0 and 2 stop waiting as soon as it gives up, and say why, instead of waiting out
    the group timeout (600 s here; the test's own limit is 90 s) and saying only that rank 1
    did not join."""
    res = run_ranks(_one_rank_cannot_start, 3, free_port(), bad, init=False, timeout=90)
    assert bad in res[1], res[1]
    for rank in (0, 2):
        assert res[rank].startswith("GaveUpError: mccl group"), res[rank]
        assert "cannot form" in res[rank] and "global rank 1: " in res[rank], res[rank]
        assert bad in res[rank] and res[1].split(": ", 1)[1][:60] in res[rank], res[rank]


def _join_as(rank: int, w: int, port: int, ranks: dict, sizes: dict) -> str | None:
    import torch.distributed as dist

    import mccl  # noqa: F401

    try:
        dist.init_process_group("mccl", init_method=f"tcp://127.0.0.1:{port}",
                                rank=ranks.get(rank, rank), world_size=sizes.get(rank, w),
                                timeout=timedelta(seconds=600))
        return None
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


@pytest.mark.parametrize("ranks, sizes, own, others", [
    # the last process says rank 7 of 3: nobody may wait for rank 2 the group timeout
    ({2: 7}, {}, "ValueError: mccl: rank 7 is out of range for world size 3",
     "a process: mccl: rank 7 is out of range"),
    # rank 1 says the world has 4 ranks
    ({}, {1: 4}, "ValueError: mccl group", "with world size 4"),
])
def test_a_rank_or_world_size_that_does_not_fit_fails_every_rank_at_once(
        ranks: dict, sizes: dict, own: str, others: str) -> None:
    res = run_ranks(_join_as, 3, free_port(), ranks, sizes, init=False, timeout=90)
    assert all(r is not None for r in res), res
    assert any(r.startswith(own) for r in res), res
    assert all(r.startswith(own) or r.startswith("GaveUpError") and others in r
               for r in res), res


def test_the_mesh_phase_reads_the_store_for_give_ups_at_most_so_often() -> None:
    """Dials and the acceptor look for give-ups every ``GIVE_UP_LOOK_S``, not on every retry;
    a refused dial's last look is made at once."""
    from mccl.transport.rendezvous import GaveUpError, GiveUpWatch, give_up, namespace

    store = torch.distributed.HashStore()
    watch = GiveUpWatch(store, namespace("g"), [0, 1], every_s=3600.0)
    watch.look()  # nothing yet; the next look is an hour away
    give_up(store, "g", 1, ValueError("its disk is full"))
    watch.look()
    with pytest.raises(GaveUpError, match="global rank 1: its disk is full"):
        watch.look(now=True)


def _one_rank_dies_while_connecting(rank: int, w: int, port: int) -> str:
    from mccl.transport import rendezvous

    if rank == 1:  # killed right after it published its address: it leaves no reason
        real = rendezvous.await_ranks

        def die_once_published(store, ns, what, *args, **kwargs):
            if what == "addr":
                os._exit(17)
            return real(store, ns, what, *args, **kwargs)

        rendezvous.await_ranks = die_once_published
    return _join_or_why(rank, w, port) or "joined"


def test_a_rank_killed_while_the_group_connects_fails_the_others_at_once() -> None:
    """Rank 1 of 4 dies once its address is published: ranks 2 and 3, which dial it, find
    it refusing and give up; rank 0, which waits for their dials, learns why from the
    store. Before, all three waited out the group timeout (600 s here; the test's own limit
    is 90 s)."""
    res = run_ranks(_one_rank_dies_while_connecting, 4, free_port(), init=False, timeout=90,
                    expect_missing=(1,))
    for rank in (0, 2, 3):
        assert "rank 1 exited or was killed" in res[rank], res[rank]
    assert res[0].startswith("GaveUpError: mccl group"), res[0]


def _top_rank_dies_before_it_listens(rank: int, w: int, port: int) -> str:
    import torch.distributed as dist

    import mccl  # noqa: F401
    from mccl import process_group

    if rank == w - 1:  # killed before it listens or dials: the others wait for its dials

        def die(*args, **kwargs):
            os._exit(17)

        process_group.connect_mesh = die
    try:
        dist.init_process_group("mccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=w, timeout=timedelta(seconds=3))
        return "joined"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


@pytest.mark.parametrize("w", [3, 5])
def test_ranks_that_time_out_on_a_dead_rank_are_not_blamed_for_it(w: int) -> None:
    """The top rank dies before anyone can dial it: the ranks connect among themselves and
    wait for its dials until the group timeout (3 s here). The first to time out closes its
    connections; the others, seeing them close, blamed it ("rank 0 closed its connection
    ... it exited or was killed") though it lived. A rank now leaves its reason before its
    connections close, and a rank that sees them close reads it: every survivor names the
    dead rank."""
    res = run_ranks(_top_rank_dies_before_it_listens, w, free_port(), init=False,
                    timeout=60, expect_missing=(w - 1,))
    for rank in range(w - 1):
        assert res[rank].startswith(("TimeoutError: ", "GaveUpError: ")), (rank, res[rank])
        assert f"ranks [{w - 1}] never connected to rank " in res[rank], (rank, res[rank])
        assert "closed its connection" not in res[rank], (rank, res[rank])


def _a_rank_dies_before_a_new_group(rank: int, w: int, port: int) -> str:
    import torch.distributed as dist

    failed = _join_or_why(rank, w, port)
    if failed:
        return f"init: {failed}"
    dist.barrier()
    if rank == w - 1:  # gone before the group below: nobody waits on it in an op
        os._exit(17)
    try:
        dist.new_group(list(range(w)))
        return "new_group returned"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


def test_a_new_group_with_a_rank_already_gone_fails_at_once() -> None:
    """Rank 2 of 3 dies between ops of the (idle, healthy) default group; ranks 0 and 1
    then create a group with it. They see its default-group connection closed without a
    BYE and fail the set-up, naming it, instead of waiting for its keys for the group
    timeout (600 s here; the test's own limit is 90 s)."""
    res = run_ranks(_a_rank_dies_before_a_new_group, 3, free_port(), init=False, timeout=90,
                    expect_missing=(2,))
    for rank in (0, 1):
        assert res[rank].startswith(("PeerGoneError", "GaveUpError")), res[rank]
        assert "global rank 2" in res[rank], res[rank]


def _top_rank_dies_between_its_dials(rank: int, w: int, port: int,
                                     first: str = "all_reduce") -> str:
    import torch.distributed as dist

    from mccl.transport import rendezvous

    if rank == w - 1:  # dials w - 2 .. 1, then is killed before it dials rank 0
        real = rendezvous._dial

        def die_before_rank_0(addr, secret, group, me, peer, *args, **kwargs):
            if peer == 0:
                os._exit(17)
            return real(addr, secret, group, me, peer, *args, **kwargs)

        rendezvous._dial = die_before_rank_0
    failed = _join_or_why(rank, w, port)
    if failed:
        return f"init: {failed}"
    try:  # ranks 1 .. w - 2 have their connections: their first op finds the dead rank
        if first == "gather":  # data for rank 0 first, then an op that needs rank 3
            dist.gather(torch.ones(4), dst=0)
        dist.all_reduce(torch.ones(4))
        return "all_reduce returned"
    except Exception as e:  # noqa: BLE001
        return f"op: {type(e).__name__}: {e}"


@pytest.mark.parametrize("first", ["all_reduce", "gather"])
def test_a_rank_killed_once_its_dials_are_done_fails_the_rank_still_waiting_for_it(
        first: str) -> None:
    """Rank 3 of 4 connects to ranks 2 and 1 and dies before it dials rank 0, which nobody
    else dials. Ranks 1 and 2 see its connection close while they still wait for a dial, or
    form the group and fail their first op on it; rank 0, still waiting for rank 3's dial,
    hears of it from their connections (an error frame, the end of the stream) or from the
    store (their give-up, left also by a formed rank whose op failed), instead of waiting
    out the group timeout (600 s here; the test's own limit is 90 s). With ``gather`` their
    first op sends rank 0 data, so their error frames queue behind it, where rank 0 does
    not look. A formed rank whose op then waits on rank 0 gets rank 0's reason (an error
    frame it writes before it closes its connections), not a reset blamed on rank 0."""
    res = run_ranks(_top_rank_dies_between_its_dials, 4, free_port(), first, init=False,
                    timeout=90, expect_missing=(3,))
    for rank in (1, 2):
        assert res[rank].startswith(("op: CollectiveError", "init: PeerGoneError: rank 3 ",
                                     "init: GaveUpError")), res[rank]
        # rank 0 lives: it gave up waiting for rank 3 and says so on its connections before
        # it closes them (a formed rank whose op waits on it took the reset for its death)
        assert "[peer rank 0]" not in res[rank] and "rank 0 was reset" not in res[rank], \
            res[rank]
    assert res[0].startswith(("init: PeerGoneError: rank ", "init: GaveUpError")), res[0]


def test_a_store_that_fails_at_the_end_of_set_up_is_named() -> None:
    """The last store call of a group's set-up (``check_claims``) failing, as when the
    store's host exits then: the error names the store and its host, as every other wait's
    does, instead of torch's bare DistNetworkError; it is a ``StoreFailedError``, for which a
    rank leaves no word (the store cannot take it)."""
    from mccl.transport.rendezvous import StoreFailedError, check_claims

    class Gone(torch.distributed.HashStore):
        def check(self, keys):
            raise torch.distributed.DistNetworkError("Connection reset by peer")

    with pytest.raises(StoreFailedError, match=r"mccl group 'g': the rendezvous store failed "
                       r"while checking its ranks' claims: Connection reset by peer \(the "
                       r"process hosting the store"):
        check_claims(Gone(), "g")


def _hold_dial_to_rank_0(signal: str, polls: int, then_s: float = 0.0) -> None:
    """This rank's dial to rank 0 waits until the file ``signal`` exists (at most ``polls``
    looks, 50 ms apart), then ``then_s`` more."""
    import time

    from mccl.transport import rendezvous

    real = rendezvous._dial

    def held(addr, secret, group, me, peer, *args, **kwargs):
        if peer == 0:
            for _ in range(polls):
                if os.path.exists(signal):
                    break
                time.sleep(0.05)
            time.sleep(then_s)
        return real(addr, secret, group, me, peer, *args, **kwargs)

    rendezvous._dial = held


def _ranks_2_and_3_mismatch_before_rank_1_dials_rank_0(rank: int, w: int, port: int,
                                                       signal: str) -> str:
    import torch.distributed as dist

    import mccl  # noqa: F401

    if rank == 1:  # rank 0 still waits for this dial when ranks 2 and 3 have failed their op
        _hold_dial_to_rank_0(signal, 600, then_s=1.0)  # rank 0 looks every 0.25 s
    dist.init_process_group("mccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=w, timeout=timedelta(seconds=60))
    odd = torch.ones(8, dtype=torch.int32 if rank == 3 else torch.float32)
    try:
        dist.all_reduce(odd)
        return "all_reduce returned"
    except Exception as e:  # noqa: BLE001
        if rank == 2:
            open(signal, "w").close()
        return f"op: {type(e).__name__}: {e}"


def test_a_mismatch_among_formed_ranks_reaches_a_rank_still_forming_in_its_op(tmp_path) -> None:
    """Ranks 2 and 3 have their connections and issue mismatched first ops while rank 0 still
    waits for rank 1's dial: rank 0 keeps waiting (the failure blames neither rank it waits
    for), forms the group, and its own first op reports the mismatch, as on every rank."""
    res = run_ranks(_ranks_2_and_3_mismatch_before_rank_1_dials_rank_0, 4, free_port(),
                    str(tmp_path / "rank2-failed"), init=False, timeout=120)
    for rank, text in enumerate(res):
        assert text.startswith("op: CollectiveError: "), (rank, text)
        assert "collective mismatch" in text, (rank, text)


def _ranks_2_and_3_mismatch_and_rank_1_never_dials_rank_0(rank: int, w: int, port: int,
                                                          signal: str) -> str:
    import torch.distributed as dist

    import mccl  # noqa: F401
    from mccl.transport import rendezvous

    rendezvous.REPORTED_FAILURE_GRACE_S = 1.0  # the test's own: 10 s by default
    if rank == 1:  # alive, but its dial to rank 0 waits until rank 0 has given up
        _hold_dial_to_rank_0(signal, 1200)
    try:
        dist.init_process_group("mccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=w, timeout=timedelta(seconds=600))
    except Exception as e:  # noqa: BLE001
        if rank == 0:
            open(signal, "w").close()
        return f"init: {type(e).__name__}: {e}"
    odd = torch.ones(8, dtype=torch.int32 if rank == 3 else torch.float32)
    try:
        dist.all_reduce(odd)
        return "all_reduce returned"
    except Exception as e:  # noqa: BLE001
        return f"op: {type(e).__name__}: {e}"


def test_a_reported_failure_fails_a_rank_still_forming_once_its_missing_peer_stays_away(
        tmp_path) -> None:
    """As above, but rank 1 never dials rank 0 (it waits until rank 0 gave up): rank 0 fails
    its set-up with the mismatch its peers reported once rank 1 stayed away for the grace
    (1 s here), not after the group timeout (600 s; the test's own limit is 120 s)."""
    res = run_ranks(_ranks_2_and_3_mismatch_and_rank_1_never_dials_rank_0, 4, free_port(),
                    str(tmp_path / "rank0-gave-up"), init=False, timeout=120)
    assert res[0].startswith("init: PeerGoneError: rank "), res[0]
    assert "before the group formed at rank 0" in res[0], res[0]
    assert "collective mismatch" in res[0], res[0]
    for rank in (2, 3):
        assert res[rank].startswith("op: CollectiveError: "), (rank, res[rank])
    assert res[1].startswith("init: "), res[1]


def test_a_rank_giving_up_on_another_groups_members_does_not_fail_this_one() -> None:
    """Ranks that passed new_group other member lists share the group's name: a give-up by a
    rank outside this group's members is not this group's failure; one inside is, at once."""
    from mccl.transport.rendezvous import GaveUpError, await_ranks, give_up, namespace

    store = torch.distributed.HashStore()
    give_up(store, "g", 7, ValueError("other members"))
    with pytest.raises(TimeoutError, match="did not join"):
        await_ranks(store, namespace("g"), "cores", [1], 0.2, members=[2, 5])
    give_up(store, "g", 5, ValueError("its interface is wrong"))
    with pytest.raises(GaveUpError, match="global rank 5: its interface is wrong"):
        await_ranks(store, namespace("g"), "cores", [1], 60.0, members=[2, 5])


def test_no_word_is_left_in_a_store_whose_host_is_the_rank_that_failed(monkeypatch) -> None:
    """A formed rank whose group broke leaves word in the store for ranks still forming it
    (``_leave_word``), except when the culprit is global rank 0, which hosts the store
    unless torchrun's agent does: writing to its dead store only made torch print a C++
    trace on every survivor; nor once every rank formed the group."""
    import threading
    import time
    from types import SimpleNamespace

    from mccl import process_group
    from mccl.errors import CollectiveError

    left = []
    monkeypatch.setattr(process_group, "give_up",
                        lambda store, label, rank, note: left.append((rank, str(note))))
    pg = SimpleNamespace(_formed_at=time.monotonic(), _timeout_s=600.0, _rank=1, _size=3,
                         _global_ranks=[4, 0, 7], _store=None, _label="g",
                         _engine=SimpleNamespace(all_formed=False))

    def word(culprit: int | None, agent: str | None = None) -> bool:
        if agent is None:
            monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
        else:
            monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", agent)
        left.clear()
        before = set(threading.enumerate())
        process_group.ProcessGroupMCCL._leave_word(
            pg, CollectiveError("mccl all_reduce failed", op="all_reduce", peer=culprit))
        for t in set(threading.enumerate()) - before:
            t.join(timeout=10)
        return bool(left)

    assert word(0)  # group rank 0 is global rank 4
    assert word(2)
    assert word(None)
    pg._global_ranks = [0, 4, 7]
    assert not word(0)  # global rank 0: its store is gone with it
    assert word(0, agent="True")  # torchrun's agent hosts the store
    pg._rank = 0
    assert word(0)  # blamed on itself (the peers gave up on it): it lives, and so does the store
    pg._engine.all_formed = True  # an op needing every rank's data completed: none is forming
    assert not word(2) and not word(None)


def _file_init_job(rank: int, w: int, path: str) -> list[float]:
    import gc
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group("mccl", init_method=f"file://{path}", rank=rank, world_size=w,
                            timeout=timedelta(seconds=20))
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    dist.destroy_process_group()
    gc.collect()  # (the test's ranks end in os._exit, which runs no finalizer)
    return t.tolist()


def _file_store_counts(path) -> dict[str, int]:
    """The last value of each counter a FileStore keeps in its file (entries are a 4-byte
    length and the key, then the same for the value)."""
    data, at, counts = path.read_bytes(), 0, {}
    while at < len(data):
        fields = []
        for _ in range(2):
            n = int.from_bytes(data[at:at + 4], "little")
            fields.append(data[at + 4:at + 4 + n])
            at += 4 + n
        if fields[0] in (b"cleanup/", b"refcount/"):
            counts[fields[0].decode()] = int(fields[1])
    return counts


def test_jobs_in_a_row_on_one_init_file(tmp_path) -> None:
    """The init file goes once a job's groups are destroyed (FileStore deletes it with its
    last user), so the next job on that path starts clean, as on gloo. An idle store thread
    kept the store, and the file stayed when the processes exited: every later job read the
    first one's keys and failed. (torch's FileStore destructor counts its finished users and
    its live references in two separately locked steps: two ranks letting go at once can
    each miss the other's count and leave the file, about once in 40 jobs under load here.
    Its counters then show every user gone, which is what this checks; the file is removed
    for the next job, as torch would have.)"""
    path = tmp_path / "init"
    for _ in range(2):
        assert run_ranks(_file_init_job, 2, str(path), init=False, timeout=60) == [[3.0] * 5] * 2
        if path.exists():
            assert _file_store_counts(path) == {"cleanup/": 2, "refcount/": 0}
            path.unlink()


def _after_a_job_alone(rank: int, w: int, port: int) -> list[float]:
    """Rank 0 first runs a job of its own (one rank), as a notebook's sanity check does;
    then it joins a fresh process for the real job."""
    from datetime import timedelta

    import torch.distributed as dist

    if rank == 0:
        dist.init_process_group("mccl", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=1, timeout=timedelta(seconds=10))
        dist.all_reduce(torch.ones(2))
        dist.destroy_process_group()
    dist.init_process_group("mccl", init_method=f"tcp://127.0.0.1:{port + 1}", rank=rank,
                            world_size=w, timeout=timedelta(seconds=10))
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.tolist()


def test_a_process_that_ran_a_job_before_joins_a_fresh_one() -> None:
    """Default groups are counted per store (a count per process made the one that had run a
    job before wait in another key space than the fresh one: both timed out, each naming
    the other as never joined)."""
    port = free_port()
    assert run_ranks(_after_a_job_alone, 2, port, init=False, timeout=60) == [[3.0] * 3] * 2


def _reinit_on_one_port(rank: int, w: int, port: int) -> list[object]:
    """Three jobs in turn on one ``tcp://`` port, the cycle collector off: each group must be
    freed by ``destroy_process_group`` itself, as gloo's is, and with it rank 0's store,
    which holds the port. (A reference cycle through the engine's hook kept both until the
    collector ran: re-inits on one port with a collection between jobs failed in 10 of 12
    trials of 10 jobs, gloo's in none.)"""
    import gc
    import socket
    import weakref

    import torch.distributed as dist

    gc.disable()
    seen: list[object] = []
    for job in range(3):
        dist.init_process_group("mccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=w, timeout=timedelta(seconds=20))
        group = weakref.ref(dist.group.WORLD)
        t = torch.full((3,), float(rank + 1 + job))
        dist.all_reduce(t)
        dist.destroy_process_group()
        seen += [t.tolist(), group() is None]
    if rank == 0:  # the store's host: its port is free again (bind fails while it listens)
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
                seen.append("port free")
            except OSError as e:
                seen.append(f"port still taken: {e}")
    return seen


def test_a_destroyed_group_frees_its_store_at_once() -> None:
    port = free_port()
    jobs = [[3.0] * 3, True, [5.0] * 3, True, [7.0] * 3, True]
    assert run_ranks(_reinit_on_one_port, 2, port, init=False, timeout=90) == [
        jobs + ["port free"], jobs]


def _two_jobs_one_store(rank: int, w: int, port: int, forming: bool) -> str:
    """Ranks 0-1 are job A's ranks 0-1, ranks 2-3 job B's, on one store (no prefix). B's
    ranks start while A runs ops; or (``forming``) B's rank 0 alone starts while A's rank 0
    waits for its rank 1, which starts once B is done. A runs ops until B is done."""
    import time
    from datetime import timedelta

    import torch.distributed as dist

    job, r = divmod(rank, 2)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
    if job == 1 and forming and r == 1:  # B's rank 1 stays away: A's rank 1 is not
        store.add("test/b-left", 1)       # claimed twice, only its rank 0 is
        return "stayed away"
    if job == 1:
        store.wait(["test/a-runs"])
        if forming:
            time.sleep(0.5)  # A's rank 0 has claimed its rank by now
    elif r == 1 and forming:
        store.wait(["test/b-done"])
    if forming and job == 0 and r == 0:
        store.set("test/a-runs", "1")
    try:
        dist.init_process_group("mccl", store=store, rank=r, world_size=2,
                                timeout=timedelta(seconds=8))
        for i in range(1000):
            if job == 0 and r == 0 and i == 1:
                store.set("test/a-runs", "1")
            stop = torch.tensor([float(job == 0 and r == 0 and store.check(["test/b-done"]))])
            dist.all_reduce(stop)  # every rank of A stops at the same op
            if stop.item():
                break
            t = torch.full((4,), float(100 * job + 10 * r + i))
            dist.all_reduce(t)
            if t.tolist() != [float(200 * job + 10 + 2 * i)] * 4:
                return f"WRONG {t.tolist()}"
        dist.barrier()
        dist.destroy_process_group()
        return "right"
    except Exception as e:  # noqa: BLE001 - the outcome is the test's result
        return f"error: {e}"
    finally:
        if job == 1 and store.add("test/b-left", 1) == 2:
            store.set("test/b-done", "1")


@pytest.mark.parametrize("forming", [False, True], ids=["running", "forming"])
def test_a_second_job_on_a_jobs_store_fails_instead_of_pairing_up(forming: bool) -> None:
    """Two jobs sharing a store by mistake (no PrefixStore): ranks of the second read the
    first one's keys, authenticated with its ranks (one secret) and summed with them without
    an error. Now a rank of a group is taken once: the second job fails, saying why; a job
    that is still forming fails too (its ranks may belong to either job); one that runs goes
    on untouched, as on gloo. (Ranks of two jobs that form one group before any rank is
    claimed twice cannot tell: the README says so.)"""
    from datetime import timedelta

    import torch.distributed as dist

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
    outcomes = run_ranks(_two_jobs_one_store, 4, port, forming, init=False, timeout=90)
    del store
    assert not [o for o in outcomes if o.startswith("WRONG")], outcomes
    for o in outcomes[2:3 if forming else 4] + (outcomes[:2] if forming else []):
        assert o.startswith("error") and "already taken by another process" in o, outcomes
    if not forming:
        assert outcomes[:2] == ["right", "right"], outcomes


def test_ranks_that_are_threads_of_one_process_form_groups_on_one_store() -> None:
    """Each rank a thread of this process, one HashStore, the threads starting apart and
    making three default groups in a row (each shut down before the next): they share one
    count of default groups, so they meet in one key space every time. With a count per
    process each thread's group took the next number, the threads waited in different key
    spaces, and every one timed out (gloo forms these groups once, then reads stale keys)."""
    import threading
    import time

    from mccl.process_group import ProcessGroupMCCL

    world, rounds = 3, 3
    store = torch.distributed.HashStore()
    sums: dict[tuple[int, int], list[float]] = {}
    errors: dict[int, str] = {}

    def rank_fn(r: int) -> None:
        try:
            for k in range(rounds):
                pg = ProcessGroupMCCL(store, r, world, timedelta(seconds=15))
                t = torch.full((1000,), float(10 * k + r + 1))
                pg.allreduce([t]).wait()
                sums[(r, k)] = t.unique().tolist()
                pg.shutdown()
        except Exception as e:  # noqa: BLE001 - the test reports it
            errors[r] = f"{type(e).__name__}: {e}"

    threads = [threading.Thread(target=rank_fn, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
        time.sleep(0.2)  # each begins after the one before has counted its group
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert sums == {(r, k): [30.0 * k + 6] for r in range(world) for k in range(rounds)}


def _swap_ranks_and_init_again(rank: int, w: int, port: int) -> list[list[float]]:
    """Two default groups in a row on one store, the second with the ranks reversed."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, is_master=rank == 0, world_size=w,
                          timeout=timedelta(seconds=30))
    got = []
    for r in (rank, w - 1 - rank):
        dist.init_process_group("mccl", store=store, rank=r, world_size=w,
                                timeout=timedelta(seconds=10))
        t = torch.full((5,), float(10 ** r))
        dist.all_reduce(t)
        got.append(t.tolist())
        dist.barrier()
        dist.destroy_process_group()
    return got


def test_processes_that_swap_ranks_init_again_on_one_store() -> None:
    """A process whose default group was destroyed starts the next count, whatever rank it
    takes then (threads of one process share a count only while one of their groups lives)."""
    assert run_ranks(_swap_ranks_and_init_again, 3, free_port(), init=False,
                     timeout=60) == [[[111.0] * 5] * 2] * 3


def test_set_up_failures_are_also_torch_dist_errors() -> None:
    """A group that cannot form raises what it says (a timeout, a refused connection, a rank
    that gave up) as a class that is also torch's DistNetworkError, as gloo's set-up
    failures are RuntimeErrors: code that catches those catches mccl's too."""
    import errno

    import torch.distributed as dist

    from mccl.errors import setup_error
    from mccl.process_group import ProcessGroupMCCL
    from mccl.transport.rendezvous import GaveUpError

    with pytest.raises(RuntimeError, match=r"rank\(s\) \[1\] did not join within 1s") as got:
        ProcessGroupMCCL(dist.HashStore(), 0, 2, timedelta(seconds=1))
    assert isinstance(got.value, TimeoutError) and isinstance(got.value, dist.DistNetworkError)
    assert type(got.value).__name__ == "TimeoutError"
    for e in (GaveUpError("mccl group 'g' cannot form"),
              ConnectionRefusedError(errno.ECONNREFUSED, "refused")):
        twin = setup_error(e)
        assert isinstance(twin, type(e)) and isinstance(twin, dist.DistError), twin
        assert (type(twin).__name__, str(twin)) == (type(e).__name__, str(e))
    assert setup_error(twin) is twin
    plain = ValueError("MCCL_SOCKET_IFNAME='x' names no interface")
    assert setup_error(plain) is plain


def _sent_memory_released(rank: int, world: int) -> bool:
    import gc
    import weakref

    import numpy as np
    import torch.distributed as dist

    from tests.threads import released

    n = 4 << 20  # 16 MB: more than the socket takes at once, so the sender thread writes it
    freed = []
    for op in ("p2p", "all_reduce"):
        memory = np.ones(n, dtype=np.float32)
        gone = weakref.ref(memory)
        t = torch.from_numpy(memory)  # the tensor's storage holds the array
        del memory
        if op == "all_reduce":
            dist.all_reduce(t)
        elif rank == 0:
            dist.send(t, 1)
        else:  # and the receiving side
            dist.recv(t, 0)
        del t
        gc.collect()
        freed.append(released(gone))
        dist.barrier()
    return all(freed)


def test_a_sent_tensor_is_not_held_once_the_send_completed() -> None:
    """A sender thread waiting for its next frame kept the last one's payload, a view of the
    op's tensor: memory a user had let go of stayed allocated until the next send to that
    peer. Neither side of a send keeps it, nor an all-reduce."""
    assert run_ranks(_sent_memory_released, 2, timeout=60) == [True, True]


def _inline_flags(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from mccl.device.cpu import CpuAdapter

    seen: list[bool] = []
    prepare = CpuAdapter.prepare

    def spy(self, tensors, reads, writes, inline=False):
        seen.append(inline)
        return prepare(self, tensors, reads, writes, inline=inline)

    CpuAdapter.prepare = spy
    flags: dict[str, list[bool]] = {}

    def note(name: str, run) -> None:
        del seen[:]
        run()
        flags[name] = list(seen)

    t = torch.ones(8)
    note("blocking", lambda: dist.all_reduce(t))
    note("async", lambda: dist.all_reduce(t, async_op=True).wait())
    peer = 1 - rank
    note("p2p", lambda: dist.send(t, peer) if rank == 0 else dist.recv(t, peer))

    def coalesced() -> None:
        with dist._coalescing_manager(async_ops=True) as cm:
            dist.all_reduce(t)
            dist.all_reduce(torch.ones(3))
        cm.wait()

    note("coalesced", coalesced)
    note("blocking gather", lambda: dist.all_gather_into_tensor(torch.empty(2 * world),
                                                                torch.ones(2)))
    return flags


def test_only_blocking_collectives_are_prepared_to_run_on_the_callers_thread() -> None:
    """``prepare(inline=True)`` (CUDA then copies on the caller's stream) only for an op the
    engine may run on the caller's thread, a blocking collective; an async op, a send or a
    receive and async coalesced ops go to the comm thread."""
    for flags in run_ranks(_inline_flags, 2, timeout=60):
        assert flags.pop("blocking") == flags.pop("blocking gather") == [True], flags
        assert flags.pop("async") == [False] and flags["coalesced"], flags
        assert not any(flags["coalesced"]) and not any(flags["p2p"]), flags
