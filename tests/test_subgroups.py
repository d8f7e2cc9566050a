"""Subgroups: membership, group/global rank translation, nesting, concurrency, split_group.

One spawned run of 4 ranks; checks collect failures instead of stopping at the first.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from mccl.bench.spawn import run_ranks
from tests.test_surface import Checker


def _translation(c: Checker, rank: int, world: int) -> None:
    g = dist.new_group([2, 0])  # torch orders members by global rank: group rank 1 is rank 2
    if rank not in (0, 2):
        c.eq("non-member gets NON_GROUP_MEMBER", g, dist.GroupMember.NON_GROUP_MEMBER)
        return
    me = 0 if rank == 0 else 1
    c.eq("group rank", (g.rank(), g.size(), dist.get_rank(g)), (me, 2, me))
    c.eq("ranks of the group", dist.get_process_group_ranks(g), [0, 2])
    c.eq("get_global_rank", dist.get_global_rank(g, 1), 2)
    c.eq("get_group_rank", dist.get_group_rank(g, 2), 1)
    c.eq("backend", dist.get_backend(g), "mccl")
    c.eq("group_name", isinstance(g.group_name, str) and len(g.group_name) > 0, True)
    t = torch.full((3,), float(rank))
    dist.broadcast(t, src=2, group=g)  # global rank
    c.eq("broadcast src=<global 2>", t, torch.full((3,), 2.0))
    t = torch.full((3,), float(rank))
    dist.broadcast(t, group_src=0, group=g)  # group rank 0 is global 0
    c.eq("broadcast group_src=0", t, torch.full((3,), 0.0))
    t = torch.full((2,), float(rank + 1))
    dist.reduce(t, dst=2, group=g)
    if rank == 2:
        c.eq("reduce dst=<global 2>", t, torch.full((2,), 4.0))
    gl = [torch.empty(1) for _ in range(2)] if rank == 0 else None
    dist.gather(torch.tensor([float(rank)]), gl, group_dst=0, group=g)
    if rank == 0:
        c.eq("gather group_dst=0", torch.cat(gl), torch.tensor([0.0, 2.0]))
    o = torch.empty(1)
    dist.scatter(o, [torch.tensor([10.0]), torch.tensor([12.0])] if rank == 2 else None, src=2,
                 group=g)
    c.eq("scatter src=<global 2>", o.item(), 10.0 + rank)
    outs = [torch.empty(1) for _ in range(2)]
    dist.all_gather(outs, torch.tensor([float(rank)]), group=g)
    c.eq("all_gather order is group order", torch.cat(outs), torch.tensor([0.0, 2.0]))
    if rank == 2:
        dist.send(torch.tensor([5.0]), dst=0, group=g)  # global dst
        dist.send(torch.tensor([6.0]), group_dst=0, group=g, tag=3)
    else:
        t = torch.empty(1)
        src = dist.recv(t, group=g)  # any source: returns the *global* rank
        c.eq("recv any source in a group returns the global rank", (src, t.item()), (2, 5.0))
        dist.recv(t, group_src=1, group=g, tag=3)
        c.eq("recv group_src=1", t.item(), 6.0)
    dist.barrier(group=g)


def _nested(c: Checker, rank: int, world: int) -> None:
    outer = dist.new_group([1, 2, 3])
    inner = dist.new_group([2, 3])
    for i in range(3):  # interleave the world, outer and inner groups
        t = torch.ones(4)
        dist.all_reduce(t)
        c.eq(f"world all_reduce #{i}", t, torch.full((4,), float(world)))
        if rank in (1, 2, 3):
            t = torch.full((2,), float(rank))
            dist.all_reduce(t, group=outer)
            c.eq(f"outer all_reduce #{i}", t, torch.full((2,), 6.0))
        if rank in (2, 3):
            t = torch.full((2,), float(rank))
            dist.all_reduce(t, group=inner, op=dist.ReduceOp.MAX)
            c.eq(f"inner all_reduce #{i}", t, torch.full((2,), 3.0))
            t = torch.full((1,), float(rank))
            dist.broadcast(t, src=3, group=inner)
            c.eq(f"inner broadcast #{i}", t.item(), 3.0)
    sub, _ = dist.new_subgroups(group_size=2)
    t = torch.full((1,), float(rank))
    dist.all_reduce(t, group=sub)
    c.eq("new_subgroups all_reduce", t.item(), float(4 * (rank // 2) + 1))
    sub, _ = dist.new_subgroups_by_enumeration([[0, 3], [1, 2]])
    t = torch.full((1,), float(rank))
    dist.all_reduce(t, group=sub)
    c.eq("new_subgroups_by_enumeration all_reduce", t.item(), 3.0)


def _split(c: Checker, rank: int, world: int) -> None:
    # torch's split_group needs an accelerator and a C++ backend that implements split; a
    # Python process group has neither, so torch refuses before reaching mccl (documented).
    c.raises("split_group refuses clearly", RuntimeError,
             lambda: dist.split_group(split_ranks=[[0, 1], [2, 3]]), "split")
    t = torch.ones(1)
    dist.all_reduce(t)
    c.eq("world usable after split_group", t.item(), float(world))


def _concurrent(c: Checker, rank: int, world: int) -> None:
    """Two groups over the same ranks, driven from two threads at once: same shapes and dtypes
    and tags, so crosstalk would show as wrong values rather than a size error."""
    ga = dist.new_group(list(range(world)))
    gb = dist.new_group(list(range(world)))
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    errors: list[str] = []

    def drive(g, scale: float, label: str) -> None:
        try:
            for i in range(40):
                n = 7 if i % 4 else 40_000  # both the small-message path and the ring
                t = torch.full((n,), scale * (rank + 1) + i)
                dist.all_reduce(t, group=g)
                want = scale * world * (world + 1) / 2 + world * i
                if not torch.equal(t, torch.full((n,), want)):
                    errors.append(f"{label} all_reduce #{i}: {t[0].item()} != {want}")
                s = torch.full((5,), scale * rank + i)
                r = torch.empty(5)
                ops = [dist.P2POp(dist.isend, s, nxt, group=g),
                       dist.P2POp(dist.irecv, r, prv, group=g)]
                for w in dist.batch_isend_irecv(ops):
                    w.wait()
                if r[0].item() != scale * prv + i:
                    errors.append(f"{label} p2p #{i}: {r[0].item()} != {scale * prv + i}")
        except Exception as e:  # noqa: BLE001
            errors.append(f"{label} raised {type(e).__name__}: {e}")

    threads = [threading.Thread(target=drive, args=(ga, 1.0, "group A")),
               threading.Thread(target=drive, args=(gb, 1000.0, "group B"))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    if any(th.is_alive() for th in threads):
        errors.append("threads did not finish")
    for e in errors:
        c.bad.append(f"rank {rank}: concurrent: {e}")


def _disagreeing(c: Checker, rank: int, world: int) -> None:
    """Rank 2 asks for members [1, 2] where ranks 0 and 1 ask for [0, 1] (torch names both
    groups alike, by a counter): rank 2 is told at once, and 0 and 1 get their own group,
    not rank 2 in rank 1's place."""
    ranks = [1, 2] if rank == 2 else [0, 1]
    if rank == 2:
        c.raises("new_group with other members", ValueError,
                 lambda: dist.new_group(ranks, timeout=timedelta(seconds=30)),
                 "rank 2 created it with ranks [1, 2], but rank 1 with [0, 1]")
        return
    g = dist.new_group(ranks, timeout=timedelta(seconds=30))
    if rank in ranks:
        t = torch.full((4,), float(rank + 1))
        dist.all_reduce(t, group=g)
        c.eq("all_reduce of the agreeing members", t, torch.full((4,), 3.0))


def _roots_disagree(c: Checker, rank: int, world: int) -> None:
    """In group [1, 3] rank 1 broadcasts from global rank 1, rank 3 from global rank 3 (and
    likewise in [0, 3]): both are told of the mismatch, with each root named as the group rank
    on the wire and as the global rank the caller passed, also where the two are equal."""
    for members in ([1, 3], [0, 3]):  # group rank 0 is global rank 0 in the second
        g = dist.new_group(members, timeout=timedelta(seconds=30))
        if rank not in members:
            continue
        t = torch.full((4,), float(rank))
        c.raises(f"broadcast with roots that disagree in {members}", RuntimeError,
                 lambda g=g, t=t: dist.broadcast(t, src=rank, group=g),
                 "collective mismatch", f"root=0 (global {members[0]})",
                 f"root=1 (global {members[1]})")


def _subgroups(rank: int, world: int) -> list[str]:
    c = Checker(rank)
    for part in (_translation, _nested, _split, _concurrent, _disagreeing,
                     _roots_disagree):
        c.run(part.__name__, lambda part=part: part(c, rank, world))
        dist.barrier()
    return c.bad


def test_subgroups() -> None:
    results = run_ranks(_subgroups, 4, timeout=120)
    failures = [f for r in results for f in r]
    assert not failures, "\n".join(failures)
