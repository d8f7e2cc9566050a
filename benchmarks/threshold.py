"""Where should all-reduce (and broadcast) switch from log2(n)-round algorithms to the ring?

Runs ``--world`` ranks and, for each message size, times the op with
``mccl.collectives.SMALL_BYTES`` (and ``BROADCAST_SMALL_BYTES``) forced above the size
(recursive doubling / binomial tree) and forced below it (the ring / pipelined chain),
interleaving the two so background load hits both alike. Prints a table of median latencies
(slowest rank) and the crossover, and writes JSON.

    python benchmarks/threshold.py                        # 4 ranks on loopback, 4 KiB .. 1 MiB
    python benchmarks/threshold.py --max-bytes 4194304    # .. 4 MiB
    python benchmarks/threshold.py --rate 1gbit           # emulated hosts, 1 Gbit/s links
                                                          # (Linux, root, iproute2: mccl.bench)

Loopback has no bandwidth limit, so it favours doubling (which moves log2(n) times the data
per rank, the ring under 2x); the emulated-link run shows the other side. The crossover is the
largest size at which doubling is still faster, with every smaller size agreeing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mccl.bench.spawn import Hosts, run_ranks  # noqa: E402

SIZES = [4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10,
         1 << 20, 2 << 20, 4 << 20]
ALGOS = {"doubling": 1 << 62, "ring": -1}  # the value given to SMALL_BYTES


def _iters(nbytes: int) -> int:
    """Enough iterations that one timing sample is well above timer noise."""
    return max(5, min(100, (4 << 20) // nbytes))


PG_TIMEOUT_S = 120.0
RUN_TIMEOUT_S = 1800.0


def worker(rank: int, world: int, ops: list[str], sizes: list[int], reps: int) -> dict:
    """One rank: returns {op: {bytes: {algo: [seconds per op, slowest rank, per rep]}}}."""
    import torch
    import torch.distributed as dist

    import mccl.collectives as coll

    original = (coll.SMALL_BYTES, coll.BROADCAST_SMALL_BYTES)

    def force(limit: int) -> None:
        coll.SMALL_BYTES = coll.BROADCAST_SMALL_BYTES = limit

    results: dict = {}
    try:
        for op in ops:
            results[op] = {}
            for nbytes in sizes:
                t = torch.ones(nbytes // 4)
                samples: dict[str, list[float]] = {a: [] for a in ALGOS}
                for rep in range(reps + 1):  # rep 0 warms up
                    for algo in (list(ALGOS) if rep % 2 else list(reversed(ALGOS))):
                        force(ALGOS[algo])
                        dist.barrier()
                        t0 = time.perf_counter()
                        for _ in range(_iters(nbytes)):
                            if op == "all_reduce":
                                dist.all_reduce(t)
                            else:
                                dist.broadcast(t, src=0)
                        worst = torch.tensor([(time.perf_counter() - t0) / _iters(nbytes)])
                        coll.SMALL_BYTES, coll.BROADCAST_SMALL_BYTES = original
                        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
                        if rep:
                            samples[algo].append(worst.item())
                results[op][nbytes] = samples
    finally:
        coll.SMALL_BYTES, coll.BROADCAST_SMALL_BYTES = original
    return results


def crossover(rows: list[dict]) -> int:
    """Largest size where doubling wins and every smaller size agrees (0 if it never wins)."""
    best = 0
    for row in rows:
        if row["doubling_us"] > row["ring_us"]:
            break
        best = row["bytes"]
    return best


def _launch(args, sizes: list[int]) -> tuple[dict, dict]:
    """Run the ranks (on loopback, or one per emulated host); rank 0's results."""
    work = (args.ops.split(","), sizes, args.reps)
    kw = dict(timeout=RUN_TIMEOUT_S, pg_timeout_s=PG_TIMEOUT_S)
    if not args.rate:
        return run_ranks(worker, args.world, *work, **kw)[0], {"network": "loopback"}
    from mccl.bench.cluster import Cluster

    with Cluster(hosts=args.world, rate=args.rate, prefix="mthresh") as cluster:
        hosts = Hosts(tuple(cluster.hosts), cluster.addr(0), cluster.iface)
        res = run_ranks(worker, args.world, *work, hosts=hosts, **kw)
        return res[0], {"network": "emulated", **cluster.describe()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ops", default="all_reduce,broadcast")
    ap.add_argument("--max-bytes", type=int, default=1 << 20, help="largest size (<= 4 MiB)")
    ap.add_argument("--rate", default=None, help="run on emulated hosts with links of this rate "
                    "(e.g. 1gbit, 10gbit) instead of loopback")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/"
                    "threshold-<network>.json)")
    args = ap.parse_args()

    import torch

    sizes = [n for n in SIZES if n <= args.max_bytes]
    raw, setting = _launch(args, sizes)
    where = f"{setting['network']}" + (f" {setting.get('rate')}" if args.rate else "")
    report = {"world": args.world, "reps": args.reps, "host": platform.node(),
              "cpus": os.cpu_count(), "torch": torch.__version__, "setting": setting, "ops": {}}
    for op in args.ops.split(","):
        rows = []
        for nbytes in sizes:
            d = statistics.median(raw[op][nbytes]["doubling"]) * 1e6
            r = statistics.median(raw[op][nbytes]["ring"]) * 1e6
            rows.append({"bytes": nbytes, "doubling_us": round(d, 1), "ring_us": round(r, 1),
                         "ring_over_doubling": round(r / d, 2)})
        report["ops"][op] = {"rows": rows, "crossover_bytes": crossover(rows)}
        print(f"\n{op}, {args.world} ranks, {where} (median of {args.reps}, slowest rank)")
        print("| size | doubling (us) | ring (us) | ring / doubling |")
        print("|---:|---:|---:|---:|")
        for row in rows:
            print(f"| {row['bytes'] >> 10} KiB | {row['doubling_us']:.0f} | {row['ring_us']:.0f} "
                  f"| {row['ring_over_doubling']:.2f} |")
        print(f"crossover: doubling wins up to {crossover(rows) >> 10} KiB")
    default = Path(__file__).parent / "results" / (
        f"threshold-{args.rate or 'loopback'}-{args.world}ranks.json")
    out = Path(args.out) if args.out else default
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
