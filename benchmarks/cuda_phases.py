"""Where does a staged CUDA all-reduce lose time against the same op on CPU tensors?

    python benchmarks/cuda_phases.py --hosts 4 --rate 10gbit --size 64M --reps 8 --json OUT

One run on emulated hosts: back-to-back blocking all-reduces of CPU tensors, then of CUDA
tensors (the ranks share the GPU), each timed by phase on every rank by wrapping the staging
hand-off's steps: head (call to the ring's first segment on the host), the ring itself, tail
(ring end to return), the time the ring spent in ``wait_range`` (blocked on copies out, plus
enqueuing more), the comm thread's time enqueuing copies out and back (``copy_out_ms``,
``copy_back_ms``, with their call counts), and, to size what a copy costs here, every rank
copying one ring segment device -> host and back at the same time. A diagnostic, not a test
(Linux, root, CUDA).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mccl.bench.report import parse_size  # noqa: E402
from mccl.bench.spawn import Hosts, run_ranks  # noqa: E402


def _rank(rank: int, world: int, size: int, reps: int, devices: tuple[str, ...]) -> dict:
    import torch
    import torch.distributed as dist

    from mccl import collectives
    from mccl.algorithms import ring
    from mccl.device import staging

    marks: list[tuple[str, float, float]] = []

    def timed(owner, name: str) -> None:
        inner = getattr(owner, name)

        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                marks.append((name, t0, time.perf_counter()))

        setattr(owner, name, wrapper)

    for name in ("acquire", "wait_range", "copy_back", "release", "_copy_out"):
        timed(staging.StagingHandoff, name)
    timed(collectives.ring, "all_reduce_start")  # the ring's first sends (the op's start part)
    timed(collectives.ring, "all_reduce")
    assert collectives.ring is ring

    def phases(device: str) -> dict:
        t = torch.ones(size // 4, device=device)
        dist.all_reduce(t)  # warm-up: buffers, connections, pinned pool
        if device == "cuda":
            torch.cuda.synchronize()
        ops = []
        for _ in range(reps):
            dist.barrier()
            marks.clear()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            if device == "cuda":
                torch.cuda.synchronize()
            t1 = time.perf_counter()
            starts = [m for m in marks if m[0] == "all_reduce_start"]
            rings = [m for m in marks if m[0] == "all_reduce"]
            waits = [m for m in marks if m[0] == "wait_range"]
            row = {"op_ms": (t1 - t0) * 1e3}
            if rings and starts:
                r0, r1 = starts[-1][1], rings[-1][2]
                row.update(head_ms=(r0 - t0) * 1e3, ring_ms=(r1 - r0) * 1e3,
                           tail_ms=(t1 - r1) * 1e3)
            if waits:
                row.update(first_wait_ms=(waits[0][2] - t0) * 1e3,
                           wait_blocked_ms=sum(b - a for _, a, b in waits) * 1e3)
            for name in ("_copy_out", "copy_back"):  # comm-thread time enqueuing copies
                spans = [b - a for n, a, b in marks if n == name]
                if spans:
                    row[f"{name.strip('_')}_ms"] = sum(spans) * 1e3
                    row[f"{name.strip('_')}_calls"] = len(spans)
            ops.append(row)
        keys = sorted({k for row in ops for k in row})
        return {k: statistics.median(row[k] for row in ops if k in row) for k in keys}

    out: dict = {d: phases(d) for d in devices}
    if "cuda" not in devices:
        return out
    # what one ring segment's copies cost when every rank copies at once
    seg = torch.ones(size // 4 // world, device="cuda")
    host = torch.empty(seg.shape, pin_memory=True)
    times = {"d2h": [], "h2d": []}
    for _ in range(5):
        for way in ("d2h", "h2d"):
            dist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if way == "d2h":
                host.copy_(seg, non_blocking=True)
            else:
                seg.copy_(host, non_blocking=True)
            torch.cuda.synchronize()
            times[way].append((time.perf_counter() - t0) * 1e3)
    out["segment_copy_ms"] = {k: statistics.median(v) for k, v in times.items()}
    out["segment_bytes"] = seg.numel() * 4
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--rate", default="10gbit")
    ap.add_argument("--size", default="64M")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--devices", default="cpu,cuda")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    from mccl.bench.cluster import Cluster

    size = parse_size(args.size)
    with Cluster(args.hosts, args.rate) as c:
        res = run_ranks(_rank, args.hosts, size, args.reps,
                        tuple(args.devices.split(",")), timeout=240, pg_timeout_s=120,
                        hosts=Hosts(tuple(c.hosts), c.addr(0), c.iface))
    out = {"hosts": args.hosts, "rate": args.rate, "size": size, "reps": args.reps,
           "ranks": res}
    for r, row in enumerate(res):
        print(f"rank {r}: " + json.dumps({k: ({kk: round(vv, 3) for kk, vv in v.items()}
                                              if isinstance(v, dict) else v)
                                          for k, v in row.items()}))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
