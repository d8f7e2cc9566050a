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
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

SIZES = [4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10,
         1 << 20, 2 << 20, 4 << 20]
ALGOS = {"doubling": 1 << 62, "ring": -1}  # the value given to SMALL_BYTES


def _iters(nbytes: int) -> int:
    """Enough iterations that one timing sample is well above timer noise."""
    return max(5, min(100, (4 << 20) // nbytes))


def worker(rank: int, world: int, init: str, ops: list[str], sizes: list[int],
           reps: int) -> dict:
    """One rank: returns {op: {bytes: {algo: [seconds per op, slowest rank, per rep]}}}."""
    import torch
    import torch.distributed as dist

    import mccl.collectives as coll

    torch.set_num_threads(1)
    dist.init_process_group("mccl", init_method=init, rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
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
        dist.destroy_process_group()
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
    """Start the ranks (on loopback, or one per emulated host); rank 0's results."""
    out_dir = Path(tempfile.mkdtemp(prefix="mccl-threshold-"))
    result = out_dir / "rank0.json"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    common = ["--ops", args.ops, "--reps", str(args.reps), "--world", str(args.world),
              "--sizes", ",".join(map(str, sizes)), "--result", str(result)]
    me = [sys.executable, str(Path(__file__).resolve())]
    setting: dict = {"network": "loopback"}
    if args.rate:
        from mccl.bench.cluster import Cluster

        cluster = Cluster(hosts=args.world, rate=args.rate, prefix="mthresh").up()
        try:
            init = f"tcp://{cluster.addr(0)}:29517"
            env["MCCL_SOCKET_IFNAME"] = cluster.iface
            procs = [cluster.popen(r, me + ["--worker", str(r), "--init", init] + common,
                                   env=env) for r in range(args.world)]
            codes = [p.wait(timeout=1800) for p in procs]
            setting = {"network": "emulated", **cluster.describe()}
        finally:
            cluster.down()
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            init = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        procs = [subprocess.Popen(me + ["--worker", str(r), "--init", init] + common, env=env)
                 for r in range(args.world)]
        codes = [p.wait(timeout=1800) for p in procs]
    if any(codes):
        raise SystemExit(f"ranks exited with {codes}")
    return json.loads(result.read_text()), setting


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
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--init", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        res = worker(args.worker, args.world, args.init, args.ops.split(","),
                     [int(s) for s in args.sizes.split(",")], args.reps)
        if args.worker == 0:
            Path(args.result).write_text(json.dumps(res))
        return

    import torch

    sizes = [n for n in SIZES if n <= args.max_bytes]
    raw, setting = _launch(args, sizes)
    where = f"{setting['network']}" + (f" {setting.get('rate')}" if args.rate else "")
    report = {"world": args.world, "reps": args.reps, "host": platform.node(),
              "cpus": os.cpu_count(), "torch": torch.__version__, "setting": setting, "ops": {}}
    for op in args.ops.split(","):
        rows = []
        for nbytes in sizes:
            d = statistics.median(raw[op][str(nbytes)]["doubling"]) * 1e6
            r = statistics.median(raw[op][str(nbytes)]["ring"]) * 1e6
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
