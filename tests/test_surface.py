"""Every c10d entry point, through the public torch.distributed API, on mccl.

One spawned run of 3 ranks does all the checks and returns the list
of failures, so one broken entry point does not hide the others. Values are checked exactly.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _coalescing_manager

from mccl.bench.spawn import run_ranks


class Checker:
    """Collects failures instead of stopping at the first one."""

    def __init__(self, rank: int):
        self.rank = rank
        self.bad: list[str] = []

    def eq(self, what: str, got, want) -> None:
        if isinstance(want, torch.Tensor):
            ok = isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got,
                                                                                           want)
        else:
            ok = got == want
        if not ok:
            self.bad.append(f"rank {self.rank}: {what}: got {got!r}, want {want!r}")

    def run(self, what: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - record and go on to the next entry point
            self.bad.append(f"rank {self.rank}: {what} raised {type(e).__name__}: {e}")

    def raises(self, what: str, excs, fn: Callable[[], object], *needles: str) -> None:
        try:
            fn()
        except excs as e:
            for n in needles:
                if n not in str(e):
                    self.bad.append(f"rank {self.rank}: {what}: message lacks {n!r}: {e}")
            return
        except Exception as e:  # noqa: BLE001
            self.bad.append(f"rank {self.rank}: {what}: wrong exception {type(e).__name__}: {e}")
            return
        self.bad.append(f"rank {self.rank}: {what}: no exception")


def _collectives(c: Checker, rank: int, world: int) -> None:
    full = float(sum(range(1, world + 1)))

    def all_reduce() -> None:
        t = torch.full((5,), float(rank + 1))
        dist.all_reduce(t)
        c.eq("all_reduce", t, torch.full((5,), full))
        t = torch.full((5,), float(rank + 1))
        w = dist.all_reduce(t, async_op=True)
        fut = w.get_future()
        w.wait()
        c.eq("all_reduce async", t, torch.full((5,), full))
        c.eq("all_reduce future value", fut.wait()[0], torch.full((5,), full))
        c.eq("all_reduce is_completed", w.is_completed(), True)
        c.raises("wait with a timeout that is not one", TypeError, lambda: w.wait("abc"),
                 "timeout", "'abc'")
        # the storage stays resizable, as on gloo (FSDP1 and batched PowerSGD resize theirs)
        c.eq("storage resizable after an op", t.untyped_storage().resizable(), True)
        # a Future asked for before the op finished is done once wait() returns (its value
        # readable at once, as on gloo; it used to be completed on another thread later)
        late = []
        for i in range(40):
            t = torch.full((1 << 14,), float(rank + i))
            w = dist.all_reduce(t, async_op=True)
            fut = w.get_future()
            w.wait()
            if not fut.done():
                late.append(i)
            elif not torch.equal(fut.value()[0], torch.full((1 << 14,), full - world + world * i)):
                late.append(f"{i}: wrong value")
        c.eq("futures done when wait() returns", late, [])
        z = torch.tensor([1 + 2j, rank * 1j], dtype=torch.complex64)
        dist.all_reduce(z)
        c.eq("all_reduce complex64", z, torch.tensor([world + 2 * world * 1j,
                                                      sum(range(world)) * 1j],
                                                     dtype=torch.complex64))
        # complex reductions go as (real, imaginary) pairs; only SUM and AVG mean anything
        z = torch.tensor([1 + 2j, rank * 1j], dtype=torch.complex128)
        dist.reduce(z, dst=1)
        if rank == 1:
            c.eq("reduce complex128", z, torch.tensor([world + 2 * world * 1j,
                                                       sum(range(world)) * 1j],
                                                      dtype=torch.complex128))
        zo = torch.empty(2, dtype=torch.complex64)
        zi = (torch.arange(2.0 * world) * (1 + 1j) + rank * 1j).to(torch.complex64)
        dist.reduce_scatter_tensor(zo, zi, op=dist.ReduceOp.AVG)
        want = (torch.arange(2.0 * rank, 2.0 * rank + 2) * (1 + 1j)
                + sum(range(world)) / world * 1j).to(torch.complex64)
        c.eq("reduce_scatter_tensor complex64 AVG", zo, want)
        zl = [torch.full((3,), complex(r, rank)) for r in range(world)]
        zo = torch.empty(3, dtype=torch.complex64)
        dist.reduce_scatter(zo, zl)
        c.eq("reduce_scatter complex64", zo,
             torch.full((3,), complex(world * rank, sum(range(world)))))
        c.raises("reduce complex MAX", TypeError,
                 lambda: dist.reduce(torch.ones(2, dtype=torch.complex64), dst=0,
                                     op=dist.ReduceOp.MAX), "MAX", "complex")
        # -0.0 and 0.0 compare equal: every rank must still end with the same bits
        for op in (dist.ReduceOp.MAX, dist.ReduceOp.MIN):
            t = torch.tensor([-0.0, 0.0] if rank % 2 == 0 else [0.0, -0.0])
            dist.all_reduce(t, op=op)
            bits = [torch.empty(2, dtype=torch.bool) for _ in range(world)]
            dist.all_gather(bits, torch.signbit(t))
            c.eq(f"all_reduce {op} signed zeros agree", torch.stack(bits),
                 bits[0].expand(world, 2))

    def coalesced() -> None:
        ts = [torch.full((3,), float(rank)), torch.full((2, 2), 1.0), torch.empty(0)]
        dist.all_reduce_coalesced(ts)
        c.eq("all_reduce_coalesced[0]", ts[0], torch.full((3,), float(sum(range(world)))))
        c.eq("all_reduce_coalesced[1]", ts[1], torch.full((2, 2), float(world)))
        for device in (None, torch.device("cpu")):
            ts = [torch.full((3,), float(rank)), torch.full((4,), 2.0)]
            with _coalescing_manager(device=device):
                for t in ts:
                    dist.all_reduce(t)
            c.eq(f"coalescing_manager(device={device}) all_reduce", ts[1],
                 torch.full((4,), 2.0 * world))
        ts = [torch.full((3,), float(rank)), torch.full((4,), 2.0)]
        with _coalescing_manager(async_ops=True) as cm:
            for t in ts:
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
        cm.wait()
        c.eq("coalescing_manager async MAX", ts[0], torch.full((3,), float(world - 1)))
        outs = [torch.empty(world * 2) for _ in range(2)]
        with _coalescing_manager():
            for i, o in enumerate(outs):
                dist.all_gather_into_tensor(o, torch.full((2,), float(rank * 10 + i)))
        c.eq("coalescing_manager all_gather_into_tensor", outs[1],
             torch.tensor([float(r * 10 + 1) for r in range(world) for _ in range(2)]))
        outs = [torch.empty(2) for _ in range(2)]
        with _coalescing_manager():
            for i, o in enumerate(outs):
                dist.reduce_scatter_tensor(o, torch.arange(2.0 * world) + i)
        c.eq("coalescing_manager reduce_scatter_tensor", outs[1],
             (torch.arange(2.0 * rank, 2.0 * rank + 2) + 1) * world)
        # a coalesced op that raises at the block's end (BAND on floats): torch then skips
        # _end_coalescing; the group must not stay in coalescing mode
        pg = dist.group.WORLD
        c.raises("coalescing_manager BAND on float", TypeError, lambda: _band_coalesced(),
                 "BAND")
        c.eq("coalescing state dropped after the error", pg._coalesced, None)
        ts = [torch.full((3,), float(rank))]
        with _coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
            dist.all_reduce(ts[0])
        cm.wait()
        c.eq("coalescing_manager after an error", ts[0], torch.full((3,), float(sum(range(world)))))
        # all_gather_coalesced: output_lists[rank][i] gets that rank's input i
        ins = [torch.full((2,), float(rank)), torch.full((1, 3), float(-rank))]
        outs2 = [[torch.empty(2), torch.empty(1, 3)] for _ in range(world)]
        dist.all_gather_coalesced(outs2, ins)
        for r in range(world):
            c.eq(f"all_gather_coalesced[{r}][1]", outs2[r][1], torch.full((1, 3), float(-r)))

    def rooted() -> None:
        for root in range(world):
            t = torch.full((4,), float(rank))
            dist.broadcast(t, src=root)
            c.eq(f"broadcast src={root}", t, torch.full((4,), float(root)))
            t = torch.full((4,), float(rank + 1))
            dist.reduce(t, dst=root, op=dist.ReduceOp.PRODUCT)
            if rank == root:
                c.eq(f"reduce dst={root}", t, torch.full((4,), float(torch.arange(1, world + 1)
                                                                     .prod())))
            gl = [torch.empty(2, dtype=torch.int64) for _ in range(world)] if rank == root else None
            dist.gather(torch.tensor([rank, root]), gl, dst=root)
            if rank == root:
                c.eq(f"gather dst={root}", torch.stack(gl),
                     torch.tensor([[r, root] for r in range(world)]))
            sl = [torch.tensor([r, root]) for r in range(world)] if rank == root else None
            o = torch.empty(2, dtype=torch.int64)
            dist.scatter(o, sl, src=root)
            c.eq(f"scatter src={root}", o, torch.tensor([rank, root]))

    def gathers() -> None:
        o = [torch.empty(2, 2) for _ in range(world)]
        dist.all_gather(o, torch.full((2, 2), float(rank)))
        c.eq("all_gather", torch.stack(o),
             torch.arange(float(world)).view(-1, 1, 1).expand(-1, 2, 2))
        # a gather's future holds the root's list itself, as gloo's does (not nested)
        o = [torch.empty(2) for _ in range(world)] if rank == 1 else None
        got = dist.gather(torch.full((2,), float(rank)), o, dst=1,
                          async_op=True).get_future().wait()
        c.eq("gather future value", [t.tolist() for t in got],
             [[float(r)] * 2 for r in range(world)] if rank == 1 else [])
        o = torch.empty(world * 2)
        dist.all_gather_into_tensor(o, torch.full((2,), float(rank)))
        c.eq("all_gather_into_tensor cat", o, torch.arange(float(world)).repeat_interleave(2))
        o = torch.empty(world, 2)
        dist.all_gather_into_tensor(o, torch.full((2,), float(rank)))
        c.eq("all_gather_into_tensor stack", o,
             torch.arange(float(world)).view(-1, 1).expand(-1, 2))
        o = torch.empty(2)
        dist.reduce_scatter(o, [torch.full((2,), float(r * 10 + rank)) for r in range(world)])
        c.eq("reduce_scatter", o, torch.full((2,), float(rank * 10 * world + sum(range(world)))))
        o = torch.empty(2, dtype=torch.int32)
        dist.reduce_scatter_tensor(o, torch.arange(2 * world, dtype=torch.int32),
                                   op=dist.ReduceOp.MIN)
        c.eq("reduce_scatter_tensor MIN", o, torch.arange(2 * rank, 2 * rank + 2,
                                                         dtype=torch.int32))
        # ops that only move bytes take any dtype whose elements view as bytes (float8 here,
        # as FSDP's float8 all-gather sends); a reduction of one says so
        f8 = torch.float8_e4m3fn

        def eight(r: int) -> torch.Tensor:
            return torch.tensor([0.5 * r, -2.0, 448.0]).to(f8)

        o = torch.empty(world * 3, dtype=f8)
        dist.all_gather_into_tensor(o, eight(rank))
        c.eq("all_gather_into_tensor float8 (bytes)", o.view(torch.uint8),
             torch.cat([eight(r) for r in range(world)]).view(torch.uint8))
        b = eight(rank)
        dist.broadcast(b, src=1)
        c.eq("broadcast float8 (bytes)", b.view(torch.uint8), eight(1).view(torch.uint8))
        c.raises("all_reduce float8", TypeError, lambda: dist.all_reduce(eight(rank)),
                 "float8_e4m3fn")
        q = torch.quantize_per_tensor(torch.ones(3), 0.5, 0, torch.qint8)  # bytes + a scale
        c.raises("broadcast quantized", TypeError, lambda: dist.broadcast(q, src=0), "quantized")

    def alltoall() -> None:
        o = [torch.empty(1) for _ in range(world)]
        dist.all_to_all(o, [torch.tensor([float(rank * 10 + r)]) for r in range(world)])
        c.eq("all_to_all", torch.cat(o), torch.tensor([float(r * 10 + rank) for r in range(world)]))
        o = torch.empty(world, 3)
        dist.all_to_all_single(o, torch.arange(world * 3.0).view(world, 3) + 100 * rank)
        c.eq("all_to_all_single even", o, torch.stack(
            [torch.arange(rank * 3.0, rank * 3.0 + 3) + 100 * r for r in range(world)]))
        # uneven: rank r sends (r + j) % 3 rows of width 2 to rank j (some are 0)
        ins = [(rank + j) % 3 for j in range(world)]
        outs = [(j + rank) % 3 for j in range(world)]
        inp = torch.cat([torch.full((n, 2), float(rank * 100 + j)) for j, n in enumerate(ins)])
        o = torch.empty(sum(outs), 2)
        dist.all_to_all_single(o, inp, outs, ins)
        c.eq("all_to_all_single uneven", o,
             torch.cat([torch.full((n, 2), float(j * 100 + rank)) for j, n in enumerate(outs)]))

    def strided() -> None:
        # Non-contiguous tensors are exchanged in their logical element order, whatever the
        # layout (as gloo does): results land in the strided originals.
        base = torch.arange(12.0).view(3, 4)
        t = (base * (rank + 1)).t()  # transposed
        dist.all_reduce(t)
        c.eq("all_reduce transposed", t, (base * full).t())
        # the layout may differ between ranks: rank 0 channels_last, the others not
        img = torch.arange(24.0).view(1, 2, 3, 4) + rank
        x = img.to(memory_format=torch.channels_last) if rank == 0 else img.clone()
        w = dist.all_reduce(x, op=dist.ReduceOp.MAX, async_op=True)
        w.wait()
        c.eq("all_reduce channels_last (async, mixed layouts)", x,
             torch.arange(24.0).view(1, 2, 3, 4) + world - 1)
        c.eq("channels_last kept", x.is_contiguous(memory_format=torch.channels_last),
             rank == 0)
        buf = torch.zeros(8)
        b = buf[1::2]  # every other element: the rest untouched
        if rank == 1:
            b.copy_(torch.arange(4.0) + 7)
        dist.broadcast(b, src=1)
        c.eq("broadcast strided slice", buf,
             torch.tensor([0.0, 7, 0, 8, 0, 9, 0, 10]))
        out = torch.zeros(2, world * 3)
        dist.all_gather_into_tensor(out.t(), torch.full((3, 2), float(rank)))
        c.eq("all_gather_into_tensor transposed output", out.t(),
             torch.cat([torch.full((3, 2), float(r)) for r in range(world)]))
        outs = [torch.zeros(3, 2).t() for _ in range(world)]
        dist.all_gather(outs, torch.full((2, 3), float(rank)).t().contiguous().t())
        c.eq("all_gather transposed list", torch.stack(outs),
             torch.stack([torch.full((2, 3), float(r)) for r in range(world)]))
        rs = torch.zeros(4, 2)
        dist.reduce_scatter_tensor(rs[:, 1], torch.arange(4.0 * world) + rank)
        c.eq("reduce_scatter_tensor into a column", rs[:, 1],
             torch.arange(4.0 * rank, 4.0 * rank + 4) * world + sum(range(world)))
        c.eq("the other column untouched", rs[:, 0], torch.zeros(4))
        a2a = torch.zeros(2, world)
        dist.all_to_all_single(a2a.t(), (torch.arange(world * 2.0) + 10 * rank).view(2, world).t())
        c.eq("all_to_all_single transposed", a2a.t(), torch.stack(
            [torch.tensor([rank + 10.0 * r, world + rank + 10.0 * r]) for r in range(world)]))
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        got = torch.zeros(4, 4).t()
        reqs = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, (torch.arange(16.0).view(4, 4) + rank).t(), nxt),
            dist.P2POp(dist.irecv, got, prv)])
        for r in reqs:
            r.wait()
        c.eq("send/recv transposed", got, (torch.arange(16.0).view(4, 4) + prv).t())
        # lazy negated views: their values are exchanged, not their raw bytes
        neg = torch._neg_view(torch.full((6,), float(rank + 1)))
        dist.all_reduce(neg)
        c.eq("all_reduce into a neg view", neg.resolve_neg(), torch.full((6,), -full))
        im = torch.tensor([complex(1, rank + 1)] * 3).conj().imag  # public: a neg view
        dist.broadcast(im, src=1)
        c.eq("broadcast into the imag of a conj view", im.resolve_neg(), torch.full((3,), -2.0))
        got = torch.zeros(3)
        for r in dist.batch_isend_irecv([
                dist.P2POp(dist.isend, torch._neg_view(torch.full((3,), float(rank))), nxt),
                dist.P2POp(dist.irecv, got, prv)]):
            r.wait()
        c.eq("send of a neg view", got, torch.full((3,), -float(prv)))

    for name, fn in (("all_reduce", all_reduce), ("coalesced", coalesced), ("rooted", rooted),
                     ("gathers", gathers), ("all_to_all", alltoall), ("strided", strided)):
        c.run(name, fn)


def _p2p(c: Checker, rank: int, world: int) -> None:
    def tags() -> None:
        if rank == 0:
            dist.send(torch.tensor([1.0]), 1, tag=7)
            dist.send(torch.tensor([2.0]), 1, tag=3)
        elif rank == 1:
            a, b = torch.empty(1), torch.empty(1)
            dist.recv(b, 0, tag=3)  # out of order: tag 7 waits in the stash
            dist.recv(a, 0, tag=7)
            c.eq("recv tags", (a.item(), b.item()), (1.0, 2.0))
        w = dist.isend(torch.tensor([float(rank)]), (rank + 1) % world)
        t = torch.empty(1)
        dist.irecv(t, (rank - 1) % world).wait()
        w.wait()
        c.eq("isend/irecv ring", t.item(), float((rank - 1) % world))

    def any_source() -> None:
        dist.barrier()
        if rank == 0:
            got = set()
            for _ in range(world - 1):
                t = torch.empty(1)
                src = dist.recv(t)
                c.eq("recv() returns the sender", src, int(t.item()))
                got.add(src)
            c.eq("recv() from every rank", got, set(range(1, world)))
        else:
            dist.send(torch.tensor([float(rank)]), 0)
        dist.barrier()
        if rank == 0:
            got = set()
            for _ in range(world - 1):
                t = torch.empty(1)
                w = dist.irecv(t, tag=5)
                w.wait()
                c.eq("irecv().source_rank()", w.source_rank(), int(t.item()))
                got.add(w.source_rank())
            c.eq("irecv() from every rank", got, set(range(1, world)))
        else:
            dist.send(torch.tensor([float(rank)]), 0, tag=5)
        dist.barrier()
        # Arrival order, not rank order: the last rank's message is read (and kept) by rank 0
        # before the others send theirs, so the first receive from any rank takes it.
        last, many = world - 1, 3
        if rank == 0:
            dist.recv(torch.empty(1), last, tag=99)  # read behind the last rank's message
            for r in range(1, last):
                dist.send(torch.empty(1), r, tag=98)  # go
                dist.recv(torch.empty(1), r, tag=97)  # read behind r's messages
            order = []
            for _ in range(1 + many * (last - 1)):
                t = torch.empty(1)
                order.append(dist.recv(t, tag=6))
                c.eq("any-source message from its sender", int(t.item()), order[-1])
            c.eq("any-source receives follow arrival", order[0], last)
        elif rank == last:
            dist.send(torch.tensor([float(rank)]), 0, tag=6)
            dist.send(torch.empty(1), 0, tag=99)
        else:
            dist.recv(torch.empty(1), 0, tag=98)
            for _ in range(many):
                dist.send(torch.tensor([float(rank)]), 0, tag=6)
            dist.send(torch.empty(1), 0, tag=97)
        dist.barrier()
        # Messages that wait unread in several sockets are taken a peer at a time: the last
        # rank's one message does not wait behind every message rank 1 sent before it.
        store = dist.distributed_c10d._get_default_store()
        if rank == 0:
            store.wait(["sent/1", f"sent/{last}"])
            order = [dist.recv(torch.empty(1), tag=4) for _ in range(100 + 1)]
            c.eq("a peer's message among another's many", order.index(last) <= 1, True)
        elif rank in (1, last):
            if rank == last:
                store.wait(["sent/1"])
            for _ in range(100 if rank == 1 else 1):
                dist.send(torch.tensor([float(rank)]), 0, tag=4)
            store.set(f"sent/{rank}", "1")
        dist.barrier()

    def batch() -> None:
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        for n in (3, 1 << 20):  # small (inline) and 4 MB (queued, larger than socket buffers)
            for order in ("send-first", "recv-first"):
                s = torch.full((n,), float(rank))
                r = torch.empty(n)
                ops = [dist.P2POp(dist.isend, s, nxt, tag=n % 97),
                       dist.P2POp(dist.irecv, r, prv, tag=n % 97)]
                if order == "recv-first":
                    ops.reverse()
                for w in dist.batch_isend_irecv(ops):
                    w.wait()
                c.eq(f"batch_isend_irecv ring {order} n={n}", r, torch.full((n,), float(prv)))
        # both directions at once
        s1, s2 = torch.full((4,), float(rank)), torch.full((4,), -float(rank))
        r1, r2 = torch.empty(4), torch.empty(4)
        ops = [dist.P2POp(dist.irecv, r1, prv), dist.P2POp(dist.irecv, r2, nxt),
               dist.P2POp(dist.isend, s1, nxt), dist.P2POp(dist.isend, s2, prv)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        c.eq("batch_isend_irecv both ways", (r1[0].item(), r2[0].item()),
             (float(prv), -float(nxt)))

    def beside_collectives() -> None:
        """A posted receive does not hold up the group's later ops (as on gloo): each message
        here is sent only after ops the receiver issued behind its irecv."""
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        for n in (3, 2 << 20):  # small, and 8 MB (larger than the socket buffers)
            got = torch.empty(n)
            w = dist.irecv(got, prv, tag=7)
            t = torch.full((n,), float(rank))
            dist.all_reduce(t)
            dist.send(torch.full((n,), float(rank)), nxt, tag=7)
            w.wait()
            c.eq(f"irecv before all_reduce n={n}: message", got, torch.full((n,), float(prv)))
            c.eq(f"irecv before all_reduce n={n}: sum", t,
                 torch.full((n,), float(sum(range(world)))))
        # receives into disjoint slices of one buffer are independent of each other: both
        # posted before a collective, their messages sent after it
        flat = torch.zeros(2 * world)
        ws = [dist.irecv(flat[2 * p:2 * p + 2], p, tag=11) for p in range(world) if p != rank]
        dist.barrier()
        for p in range(world):
            if p != rank:
                dist.send(torch.full((2,), float(rank)), p, tag=11)
        for w in ws:
            w.wait()
        want = torch.arange(world, dtype=torch.float32).repeat_interleave(2)
        want[2 * rank:2 * rank + 2] = 0.0
        c.eq("receives into slices of one buffer", flat, want)
        # ops on one tensor keep their issue order: the all-reduce waits for the receive
        buf = torch.empty(5)
        w = dist.irecv(buf, prv, tag=9)
        w2 = dist.all_reduce(buf, async_op=True)
        dist.send(torch.full((5,), float(rank)), nxt, tag=9)
        w.wait()
        w2.wait()
        c.eq("irecv then all_reduce of its tensor", buf, torch.full((5,), float(sum(range(world)))))
        # any source, posted before a barrier; two receives from one peer and tag keep order
        if rank == 0:
            first, second = torch.empty(2), torch.empty(2)
            wa = dist.irecv(first, tag=8)
            wb = dist.irecv(second, world - 1, tag=8)
            dist.barrier()
            wa.wait()
            wb.wait()
            c.eq("any-source receive: sender", wa.source_rank(), world - 1)
            c.eq("posted receives fill in order: first", first, torch.tensor([1.0, 1.0]))
            c.eq("posted receives fill in order: second", second, torch.tensor([2.0, 2.0]))
        else:
            dist.barrier()
            if rank == world - 1:
                dist.send(torch.tensor([1.0, 1.0]), 0, tag=8)
                dist.send(torch.tensor([2.0, 2.0]), 0, tag=8)
        dist.barrier()

    for name, fn in (("send/recv tags", tags), ("any source", any_source),
                     ("batch_isend_irecv", batch), ("p2p beside collectives", beside_collectives)):
        c.run(name, fn)


def _band_coalesced() -> None:
    with _coalescing_manager(device=torch.device("cpu"), async_ops=True):
        dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND)


def _objects(c: Checker, rank: int, world: int) -> None:
    def objects() -> None:
        lst = [{"a": 1, "t": torch.arange(3)}, "x", None] if rank == 1 else [None] * 3
        dist.broadcast_object_list(lst, src=1)
        c.eq("broadcast_object_list", (lst[0]["a"], lst[1], lst[0]["t"].tolist()), (1, "x",
                                                                                  [0, 1, 2]))
        out = [None] * world
        dist.all_gather_object(out, ("r", rank, [rank] * rank))
        c.eq("all_gather_object", out, [("r", r, [r] * r) for r in range(world)])
        got = [None] * world if rank == 2 else None
        dist.gather_object({"rank": rank}, got, dst=2)
        if rank == 2:
            c.eq("gather_object", got, [{"rank": r} for r in range(world)])
        out = [None]
        dist.scatter_object_list(out, [f"s{r}" * (r + 1) for r in range(world)] if rank == 0
                                 else None, src=0)
        c.eq("scatter_object_list", out[0], f"s{rank}" * (rank + 1))
        if rank == 0:
            dist.send_object_list([1, "two", {3: 4}], dst=2)
        elif rank == 2:
            got = [None] * 3
            dist.recv_object_list(got, src=0)
            c.eq("send/recv_object_list", got, [1, "two", {3: 4}])

    def state_dict_from_rank0() -> None:
        """torch's checkpoint helpers pick their device from the group's device types (a
        Python group registers none with c10d): load on rank 0, broadcast to a meta model."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        types = dist.group.WORLD._device_types
        c.eq("group device types include cpu", torch.device("cpu") in types, True)
        torch.manual_seed(0)
        full = torch.nn.Linear(4, 3).state_dict()
        with torch.device("meta"):
            model = torch.nn.Linear(4, 3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch's own deprecation notice
            set_model_state_dict(model, full if rank == 0 else {}, options=StateDictOptions(
                full_state_dict=True, broadcast_from_rank0=True))
        c.eq("set_model_state_dict(broadcast_from_rank0)", model.weight.detach(),
             full["weight"])

    c.run("object collectives", objects)
    c.run("state dict from rank 0", state_dict_from_rank0)


def _barriers_and_errors(c: Checker, rank: int, world: int) -> None:
    def barriers() -> None:
        dist.barrier()
        dist.barrier(device_ids=[0])
        dist.barrier(async_op=True).wait()
        pg = dist.group.WORLD
        # torch's dist.monitored_barrier only accepts gloo by name; the group method is mccl's.
        pg.monitored_barrier(timedelta(seconds=20))
        pg.monitored_barrier(timedelta(seconds=20), wait_all_ranks=True)

    def monitored_failures() -> None:
        # Ranks 1 and 2 never enter: rank 0 names the first missing rank, or all of them.
        g1, g2, g3 = (dist.new_group(list(range(world))) for _ in range(3))
        if rank == 0:
            c.raises("monitored_barrier names the first missing rank", RuntimeError,
                     lambda: g1.monitored_barrier(timedelta(seconds=1)), "Rank 1")
            c.raises("monitored_barrier wait_all_ranks names all", RuntimeError,
                     lambda: g2.monitored_barrier(timedelta(seconds=1), wait_all_ranks=True),
                     "Ranks 1, 2")
        # Rank 1 enters seconds before rank 0 (which sat in the two waits above), the last
        # rank never: rank 0 still names it, and rank 1 hears that from rank 0.
        if rank < world - 1:
            c.raises("monitored_barrier entered late by rank 0", RuntimeError,
                     lambda: g3.monitored_barrier(timedelta(seconds=1)), f"Rank {world - 1}")
        dist.barrier()  # the world group is untouched by the broken subgroups

    def errors() -> None:
        wide = torch.zeros(3, 1).expand(3, 4)  # elements share memory
        c.raises("all_reduce into an expanded view", ValueError, lambda: dist.all_reduce(wide),
                 "expanded")
        c.raises("all_gather_into_tensor into an expanded view", ValueError,
                 lambda: dist.all_gather_into_tensor(torch.zeros(1).expand(2 * world),
                                                     torch.ones(2)), "expanded")
        c.raises("BAND on float", (TypeError, ValueError),
                 lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND), "BAND",
                 "float32")
        c.raises("AVG on int", (TypeError, ValueError),
                 lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32),
                                         op=dist.ReduceOp.AVG), "AVG", "int32")
        c.raises("all_gather wrong list length", ValueError,
                 lambda: dist.all_gather([torch.empty(1)], torch.ones(1)), "ranks")
        c.raises("all_gather_into_tensor wrong size", ValueError,
                 lambda: dist.all_gather_into_tensor(torch.empty(1), torch.ones(1)), "elements")
        c.raises("all_to_all_single bad splits", ValueError,
                 lambda: dist.all_to_all_single(torch.empty(world), torch.ones(world),
                                                [1] * world, [2] * world), "split")
        c.raises("reduce_scatter_tensor wrong size", ValueError,
                 lambda: dist.reduce_scatter_tensor(torch.empty(2), torch.ones(3)), "elements")
        c.raises("unsupported dtype", TypeError,
                 lambda: dist.all_reduce(torch.ones(2, dtype=torch.float8_e4m3fn)),
                 "all_reduce", "SUM", "float8")
        c.raises("unsupported dtype, reduce-scatter", TypeError,
                 lambda: dist.reduce_scatter_tensor(torch.zeros(3, dtype=torch.uint16),
                                                    torch.zeros(3 * world, dtype=torch.uint16),
                                                    op=dist.ReduceOp.MAX),
                 "reduce_scatter_tensor", "MAX", "uint16")
        t = torch.full((2,), float(rank))
        dist.all_reduce(t)  # every error above left the group usable
        c.eq("all_reduce after errors", t, torch.full((2,), float(sum(range(world)))))

    def ddp_failure() -> None:
        # A collective that fails under DDP must surface as an error from backward(), not
        # crash the process: DDP's C++ reducer reads the op's Future, so the failure has to
        # be an error of that Future in C++ (a Python exception value made it segfault).
        import mccl.collectives as coll

        g = dist.new_group(list(range(world)))
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4),
                                                          process_group=g)
        model(torch.ones(2, 4)).sum().backward()
        real = coll.AllReduce.finish
        if rank == 0:
            def broken(*args, **kwargs):
                raise RuntimeError("injected failure")

            coll.AllReduce.finish = broken
        try:
            c.raises("DDP backward after a failed all_reduce", RuntimeError,
                     lambda: model(torch.ones(2, 4)).sum().backward(), "all_reduce")
        finally:
            coll.AllReduce.finish = real
        dist.barrier()  # the world group is untouched by the broken subgroup

    def after_shutdown() -> None:
        # A CPU send does not queue behind the engine: it asks whether the group still runs
        # (it said "Bad file descriptor" from the closed socket).
        g = dist.new_group(list(range(world)))
        g.shutdown()
        c.raises("send on a shut-down group", RuntimeError,
                 lambda: g.send([torch.ones(1)], (rank + 1) % world, 0), "was shut down")
        c.raises("all_reduce on a shut-down group", RuntimeError,
                 lambda: g.allreduce([torch.ones(1)]), "was shut down")

    for name, fn in (("barriers", barriers), ("monitored_barrier failures", monitored_failures),
                     ("errors", errors), ("DDP with a failing collective", ddp_failure),
                     ("ops after shutdown", after_shutdown)):
        c.run(name, fn)


def _surface(rank: int, world: int) -> list[str]:
    c = Checker(rank)
    for part in (_collectives, _p2p, _objects, _barriers_and_errors):
        part(c, rank, world)
        dist.barrier()
    return c.bad


def test_c10d_surface() -> None:
    results = run_ranks(_surface, 3, timeout=120)
    failures = [f for r in results for f in r]
    assert not failures, "\n".join(failures)
