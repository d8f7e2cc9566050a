"""Soak test: many random collectives on real processes, every result checked, memory and file
descriptors watched.

    python scripts/soak.py --world 4 --ops 10000 --max-bytes 8M

Every rank draws the same op sequence from ``--seed`` (op, group, size, dtype, reduce op, root,
split sizes, send/recv pair), so all ranks issue matching ops; inputs come from deterministic
per-(op, rank) seeds, so each rank computes the expected result of every op locally and
compares bit for bit (AVG within rounding). Ops: all_reduce, broadcast, all_gather,
reduce_scatter (every other one in the flat form: all_gather_into_tensor,
reduce_scatter_tensor), all_to_all, reduce, gather, scatter and send/recv, on the world
group and on subgroups. RSS and open file descriptors are sampled after a warm-up and at the
end; they must stay flat (RSS is judged over the second half: the allocator's footprint
settles once the largest sizes have been seen). Exit status 0 only if every result was right
and fds did not grow; RSS still growing in the second half is reported.
"""

from __future__ import annotations

import argparse
import gc
import math
import multiprocessing as mp
import os
import queue
import random
import resource
import sys
import time
import traceback
from datetime import timedelta

from mccl.bench.spawn import free_port

OPS = ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "reduce",
       "gather", "scatter", "send_recv"]


def parse_bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B").rstrip("I")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def rss_bytes() -> int:
    """Current RSS where the OS tells us cheaply (Linux /proc), else the peak (macOS)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return max_rss_bytes()


def max_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def open_fds() -> int:
    return len(os.listdir("/dev/fd"))  # Linux and macOS


def fd_targets() -> set[str]:
    """What the open fds point at (Linux; empty where /dev/fd entries are not links)."""
    out = set()
    for fd in os.listdir("/dev/fd"):
        try:
            out.add(os.readlink(f"/dev/fd/{fd}"))
        except OSError:
            pass
    return out


def subgroups(world: int) -> list[list[int]]:
    """Rank lists every rank creates in the same order (the world group comes first)."""
    every = list(range(world))
    lists = [every, every[: max(2, world // 2)], every[world // 2:], every[::2], every[1::2],
             every[1:]]
    out: list[list[int]] = []
    for ranks in lists:
        if len(ranks) >= 2 and ranks not in out:
            out.append(ranks)
    return out


class Plan:
    """The op sequence: the same on every rank."""

    def __init__(self, seed: int, world: int, max_bytes: int):
        import torch

        self.rng = random.Random(seed)
        self.groups = subgroups(world)
        self.max_bytes = max_bytes
        f, i = [torch.float32, torch.float64, torch.float16, torch.bfloat16], [
            torch.int32, torch.int64, torch.int8, torch.uint8]
        self.reduce_dtypes = f + i
        self.float_dtypes = f
        self.move_dtypes = f + i + [torch.bool, torch.int16, torch.complex64]

    def nbytes(self) -> int:
        r = self.rng.random()
        if r < 0.05:
            return 0
        if r < 0.15:
            return self.rng.randint(1, 64)
        return int(math.exp(self.rng.uniform(0, math.log(self.max_bytes))))

    def next(self, i: int) -> dict:
        import torch.distributed as dist

        rng = self.rng
        kind = rng.choice(OPS)
        g = rng.randrange(len(self.groups))
        ranks = self.groups[g]
        n = len(ranks)
        reducing = kind in ("all_reduce", "reduce_scatter", "reduce")
        dtype = rng.choice(self.reduce_dtypes if reducing else self.move_dtypes)
        op = None
        if reducing:
            ops = [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX,
                   dist.ReduceOp.PRODUCT]
            ops += [dist.ReduceOp.AVG] if dtype in self.float_dtypes else [
                dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]
            op = rng.choice(ops)
        itemsize = dtype.itemsize
        numel = self.nbytes() // itemsize
        d = {"i": i, "kind": kind, "group": g, "ranks": ranks, "dtype": dtype, "op": op,
             "numel": numel, "root": rng.randrange(n)}
        if kind == "reduce_scatter":
            d["numel"] = numel // n
        if kind == "all_to_all":  # rows[src][dst], zero-sized pieces included
            per = max(1, numel // (n * n))
            d["rows"] = [[rng.choice([0, rng.randint(1, per)]) for _ in range(n)]
                         for _ in range(n)]
        if kind == "send_recv":
            a, b = rng.sample(range(n), 2)
            d["pair"] = (a, b)
            d["tag"] = rng.randrange(1000)
        return d


def make_input(d: dict, grank: int, numel: int):
    """Rank ``grank``'s input to op ``d``: deterministic, small values where it reduces."""
    import torch

    g = torch.Generator().manual_seed(d["i"] * 7919 + grank * 104729 + 17)
    dtype, op = d["dtype"], d["op"]
    if dtype == torch.bool:  # only 0/1 bytes are valid bools
        return torch.randint(0, 2, (numel,), generator=g).bool()
    if op is None:  # data movement: any bit pattern
        raw = torch.randint(0, 256, (numel * dtype.itemsize,), dtype=torch.uint8, generator=g)
        return raw.view(dtype) if numel else torch.empty(0, dtype=dtype)
    import torch.distributed as dist

    if op == dist.ReduceOp.PRODUCT:
        vals = torch.tensor([1, 2, 1, 1] if dtype == torch.uint8 else [1, 2, -1, 1])
        return vals[torch.randint(0, 4, (numel,), generator=g)].to(dtype)
    lo = 0 if dtype == torch.uint8 else -3
    return torch.randint(lo, 4, (numel,), generator=g).to(dtype)


def reduce_ref(d: dict, xs: list):
    """Reduction of ``xs`` as torch would compute it (exact for the small values we use)."""
    import torch
    import torch.distributed as dist

    op, dtype = d["op"], d["dtype"]
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    acc = xs[0].to(wide)
    for x in xs[1:]:
        x = x.to(wide)
        if op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            acc = acc + x
        elif op == dist.ReduceOp.PRODUCT:
            acc = acc * x
        elif op == dist.ReduceOp.MIN:
            acc = torch.minimum(acc, x)
        elif op == dist.ReduceOp.MAX:
            acc = torch.maximum(acc, x)
        elif op == dist.ReduceOp.BAND:
            acc = acc & x
        elif op == dist.ReduceOp.BOR:
            acc = acc | x
        elif op == dist.ReduceOp.BXOR:
            acc = acc ^ x
    if op == dist.ReduceOp.AVG:
        acc = acc / len(xs)
    return acc.to(dtype)


def same(d: dict, got, want) -> bool:
    import torch
    import torch.distributed as dist

    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if d["op"] == dist.ReduceOp.AVG:
        return bool(torch.allclose(got.double(), want.double(), rtol=1e-2, atol=1e-2))
    if got.numel() == 0:
        return True
    return bool(torch.equal(got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)))


def run_op(d: dict, rank: int, group) -> tuple[bool, int]:
    """Issue op ``d`` on ``group`` and check the result; returns (ok, bytes this rank sent)."""
    import torch
    import torch.distributed as dist

    ranks, n, kind = d["ranks"], len(d["ranks"]), d["kind"]
    me = ranks.index(rank)
    numel, root = d["numel"], d["root"]
    x = make_input(d, rank, numel)
    xs = lambda m=numel: [make_input(d, r, m) for r in ranks]  # noqa: E731
    nb = numel * d["dtype"].itemsize
    if kind == "all_reduce":
        t = x.clone()
        dist.all_reduce(t, op=d["op"], group=group)
        return same(d, t, reduce_ref(d, xs())), nb
    if kind == "broadcast":
        t = x.clone() if me == root else torch.zeros_like(x)
        dist.broadcast(t, group_src=root, group=group)
        return same(d, t, make_input(d, ranks[root], numel)), nb
    flat = d["i"] % 2 == 0  # every other one in the flat form (which may run on a grid)
    if kind == "all_gather":
        if flat:
            out = torch.empty(n * numel, dtype=d["dtype"])
            (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(
                out, x, group=group)
            return same(d, out, torch.cat(xs())), nb
        outs = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(outs, x, group=group)
        return all(same(d, o, w) for o, w in zip(outs, xs(), strict=True)), nb
    if kind == "reduce_scatter":
        out = torch.empty(numel, dtype=d["dtype"])
        if flat:
            (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(
                out, make_input(d, rank, numel * n), op=d["op"], group=group)
        else:
            ins = [make_input(d, rank, numel * n)[k * numel:(k + 1) * numel] for k in range(n)]
            dist.reduce_scatter(out, ins, op=d["op"], group=group)
        parts = [make_input(d, r, numel * n)[me * numel:(me + 1) * numel] for r in ranks]
        return same(d, out, reduce_ref(d, parts)), nb * n
    if kind == "reduce":
        t = x.clone()
        dist.reduce(t, group_dst=root, op=d["op"], group=group)
        return (me != root or same(d, t, reduce_ref(d, xs()))), nb
    if kind == "gather":
        outs = [torch.empty_like(x) for _ in range(n)] if me == root else None
        dist.gather(x, outs, group_dst=root, group=group)
        return (me != root or all(same(d, o, w) for o, w in zip(outs, xs(), strict=True))), nb
    if kind == "scatter":
        src = make_input(d, ranks[root], numel * n)
        ins = [src[k * numel:(k + 1) * numel].clone() for k in range(n)] if me == root else None
        out = torch.empty(numel, dtype=d["dtype"])
        dist.scatter(out, ins, group_src=root, group=group)
        return same(d, out, src[me * numel:(me + 1) * numel]), nb
    if kind == "all_to_all":
        rows = d["rows"]
        send = [rows[me][k] for k in range(n)]
        recv = [rows[k][me] for k in range(n)]
        inp = make_input(d, rank, sum(send))
        out = torch.empty(sum(recv), dtype=d["dtype"])
        dist.all_to_all_single(out, inp, recv, send, group=group)
        want = []
        for k, r in enumerate(ranks):
            theirs = make_input(d, r, sum(rows[k]))
            off = sum(rows[k][:me])
            want.append(theirs[off:off + rows[k][me]])
        return same(d, out, torch.cat(want)), sum(send) * d["dtype"].itemsize
    if kind == "send_recv":
        a, b = d["pair"]
        if me == a:
            dist.send(x, group_dst=b, group=group, tag=d["tag"])
            return True, nb
        if me == b:
            t = torch.empty_like(x)
            dist.recv(t, group_src=a, group=group, tag=d["tag"])
            return same(d, t, make_input(d, ranks[a], numel)), 0
        return True, 0
    raise ValueError(kind)


def worker(rank: int, world: int, port: int, args: argparse.Namespace, q) -> None:
    try:
        import torch
        import torch.distributed as dist

        import mccl  # noqa: F401

        torch.set_num_threads(1)
        dist.init_process_group("mccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=args.pg_timeout))
        plan = Plan(args.seed, world, args.max_bytes)
        groups = [dist.group.WORLD] + [dist.new_group(r) for r in plan.groups[1:]]
        counts = dict.fromkeys(OPS, 0)
        failures: list[str] = []
        sent = 0
        warm, half = max(1, args.ops // 10), args.ops // 2
        start: dict = {}
        mid: dict = {}
        # torch's barrier() looks up the machine's accelerator, which initialises CUDA where
        # there is one (about a dozen fds): do that once before fds are first counted.
        dist.barrier()
        start_targets = fd_targets()
        start.update(rss=rss_bytes(), fds=open_fds())  # replaced after the warm-up ops
        t0 = time.monotonic()
        for i in range(args.ops):
            if i in (warm, half):
                gc.collect()
                (start if i == warm else mid).update(rss=rss_bytes(), fds=open_fds())
                if i == warm:
                    start_targets = fd_targets()
            d = plan.next(i)
            if rank not in d["ranks"]:
                continue
            ok, nb = run_op(d, rank, groups[d["group"]])
            counts[d["kind"]] += 1
            sent += nb
            if not ok:
                failures.append(f"op {i} {d['kind']} {d['dtype']} {d['op']} numel={d['numel']} "
                                f"group={d['ranks']} root={d['root']}")
                if len(failures) >= 20:
                    break
            if args.progress and rank == 0 and (i + 1) % args.progress == 0:
                print(f"  {i + 1} ops, {time.monotonic() - t0:.0f}s, "
                      f"rss {rss_bytes() / 2**20:.0f} MiB, fds {open_fds()}", flush=True)
        dist.barrier()
        elapsed = time.monotonic() - t0
        gc.collect()
        end = {"rss": rss_bytes(), "fds": open_fds(),
               "new_fds": sorted(fd_targets() - start_targets)[:8]}
        peak = max_rss_bytes()
        dist.destroy_process_group()
        q.put((rank, {"counts": counts, "failures": failures, "sent": sent, "elapsed": elapsed,
                      "start": start, "mid": mid or start, "end": end, "max_rss": peak}))
    except BaseException:  # noqa: BLE001 - report every failure to the parent
        q.put((rank, {"error": traceback.format_exc()}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--ops", type=int, default=10_000)
    ap.add_argument("--max-bytes", type=parse_bytes, default=8 << 20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pg-timeout", type=float, default=120.0)
    ap.add_argument("--timeout", type=float, default=4 * 3600.0, help="hard limit (seconds)")
    ap.add_argument("--progress", type=int, default=0, help="print every N ops (rank 0)")
    args = ap.parse_args(argv)

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()  # below the ephemeral range: see spawn.LOOPBACK_PORTS
    procs = [ctx.Process(target=worker, args=(r, args.world, port, args, q), daemon=True)
             for r in range(args.world)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    results: dict[int, dict] = {}
    deadline = t0 + args.timeout
    while len(results) < args.world and time.monotonic() < deadline:
        try:
            rank, res = q.get(timeout=1.0)
            results[rank] = res
        except queue.Empty:
            if not any(p.is_alive() for p in procs) and q.empty():
                break
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    wall = time.monotonic() - t0

    mib = 2**20
    print(f"soak: {args.world} ranks, {args.ops} ops (seed {args.seed}, sizes 0-"
          f"{args.max_bytes / mib:.2f} MiB) in {wall:.1f}s")
    ok = len(results) == args.world
    if not ok:
        print(f"  ranks {sorted(set(range(args.world)) - set(results))} did not report")
    total_fail = 0
    for rank in sorted(results):
        r = results[rank]
        if "error" in r:
            ok = False
            print(f"  rank {rank} FAILED:\n{r['error']}")
            continue
        total_fail += len(r["failures"])
        s, m, e = r["start"], r["mid"], r["end"]
        fds_flat = e["fds"] <= s["fds"]
        # The allocator settles within the first ops of the largest sizes; a leak keeps growing
        # through the second half.
        late = e["rss"] - m["rss"]
        rss_flat = late <= max(64 * mib, 0.05 * m["rss"])
        ok = ok and fds_flat and not r["failures"]
        done = sum(r["counts"].values())
        print(f"  rank {rank}: {done} ops in {r['elapsed']:.1f}s ({done / r['elapsed']:.1f}/s), "
              f"sent {r['sent'] / mib:.0f} MiB; rss {s['rss'] / mib:.1f} (10%) -> "
              f"{m['rss'] / mib:.1f} (50%) -> {e['rss'] / mib:.1f} MiB (end), peak "
              f"{r['max_rss'] / mib:.1f}, second half {late / mib:+.1f} MiB"
              f"{'' if rss_flat else ' STILL GROWING'}; fds {s['fds']} -> {e['fds']}"
              f"{'' if fds_flat else ' GREW: ' + ', '.join(e.get('new_fds', []))}")
        for f in r["failures"]:
            print(f"    WRONG RESULT: {f}")
    if 0 in results and "counts" in results[0]:
        print("  rank 0 op mix: " + ", ".join(f"{k} {v}" for k, v in results[0]["counts"].items()))
    print(f"  wrong results: {total_fail}")
    print(f"  verdict: {'OK' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
