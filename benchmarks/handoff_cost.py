"""What a staged CUDA op's copies cost on their own, with 1, 4 or 8 ranks sharing one GPU.

    python benchmarks/handoff_cost.py --worlds 1,4,8 --op all_gather --size 1M --reps 200
        [--json OUT]

No network: each rank runs only the device half of an op, after a barrier, as its ranks
would in step: ``staged`` is mccl's CUDA hand-off (``CudaAdapter.prepare``, ``acquire``, the
ring's host-side copy of this rank's segment, ``release``, the consumer's ``gate`` and the
Future's context (entered only for a Future someone asked for, which a blocking op never
does: most of the 18-21 us its gate phase took over the bare one's in call s58a), then a
sync of the caller's stream, as a blocking call followed by a read would); ``direct`` is
mccl's hand-off of a blocking op run on the caller's thread (``prepare(inline=True)``: its
copies on the caller's stream, sixtieth session); ``side`` makes
the same CUDA calls on a side stream of its own, written out bare (what the hand-off's
Python around them costs); ``caller`` does the same copies on the caller's stream with
nothing else (the floor for any hand-off that copies through host memory); ``cpu`` only the
host-side copy. Per variant and world: medians and 90th percentiles of each phase, and
"slowest", the median over ops of the slowest rank's total (a ring waits for its slowest
rank). 10 Gbit moves a 1 MB all-gather's 0.75 MB per link in about 660 us, so this says how
much of a 1 MB CUDA op's gap to the link the copies explain.
A diagnostic, not a test (CUDA).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mccl.bench.report import parse_size  # noqa: E402
from mccl.bench.spawn import run_ranks  # noqa: E402

VARIANTS = ("staged", "direct", "side", "caller", "cpu")
WARMUP = 20
TIMEOUT_S = 300.0


def _shapes(op: str, nbytes: int, world: int) -> tuple[int, int]:
    """(input, output) bytes of one rank's tensors; an all-reduce's one tensor is both."""
    part = max(nbytes // max(world, 1), 4)
    return {"all_gather": (part, nbytes), "reduce_scatter": (nbytes, part),
            "all_reduce": (nbytes, nbytes)}[op]


def _rank(rank: int, world: int, op: str, nbytes: int, reps: int) -> dict:
    import torch
    import torch.distributed as dist

    from mccl.device.cuda import CudaAdapter

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    n_in, n_out = _shapes(op, nbytes, world)
    inp = torch.ones(n_in // 4, device=dev)
    out = inp if op == "all_reduce" else torch.empty(n_out // 4, device=dev)
    tensors, reads, writes = (([inp], [True], [True]) if op == "all_reduce"
                              else ([inp, out], [True, False], [False, True]))
    adapter = CudaAdapter(dev)
    seg = min(n_in, n_out) // 4
    h_in = torch.empty(n_in // 4, pin_memory=True)
    h_out = h_in if op == "all_reduce" else torch.empty(n_out // 4, pin_memory=True)
    stream = torch.cuda.current_stream(dev)

    def handed_off(inline: bool) -> list[float]:
        """mccl's hand-off: ``staged`` (side stream) or, ``inline``, ``direct``."""
        t = [time.perf_counter()]
        handoff = adapter.prepare(tensors, reads, writes, inline=inline)
        t.append(time.perf_counter())
        hosts = handoff.acquire()
        t.append(time.perf_counter())
        hosts[-1][:seg].copy_(hosts[0][:seg])  # the ring's host-side work, in small
        t.append(time.perf_counter())
        handoff.release()
        t.append(time.perf_counter())
        gate, ctx = handoff.gate(), handoff.result_context()  # (direct: both None)
        if gate is not None:
            gate()
        if ctx is not None:
            with ctx():
                pass
        t.append(time.perf_counter())
        stream.synchronize()
        t.append(time.perf_counter())
        return t

    side = torch.cuda.Stream(dev)

    def side_bare() -> list[float]:
        t = [time.perf_counter()]
        ready = torch.cuda.Event(blocking=True)
        ready.record(stream)
        t.append(time.perf_counter())
        side.wait_event(ready)
        with torch.cuda.stream(side):
            h_in.copy_(inp, non_blocking=True)
            fence = torch.cuda.Event()
            fence.record(side)
        ready.synchronize()
        fence.synchronize()
        t.append(time.perf_counter())
        h_out[:seg].copy_(h_in[:seg])
        t.append(time.perf_counter())
        with torch.cuda.stream(side):
            out.copy_(h_out, non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        t.append(time.perf_counter())
        stream.wait_event(done)
        t.append(time.perf_counter())
        stream.synchronize()
        t.append(time.perf_counter())
        return t

    def caller() -> list[float]:
        t = [time.perf_counter()]
        t.append(t[0])
        h_in.copy_(inp)  # blocking: waits for the producer and the copy
        t.append(time.perf_counter())
        h_out[:seg].copy_(h_in[:seg])
        t.append(time.perf_counter())
        out.copy_(h_out, non_blocking=True)
        t.append(time.perf_counter())
        t.append(t[-1])
        stream.synchronize()
        t.append(time.perf_counter())
        return t

    def cpu() -> list[float]:
        t = [time.perf_counter()] * 3
        h_out[:seg].copy_(h_in[:seg])
        t += [time.perf_counter()] * 4
        return t

    runs = {"staged": partial(handed_off, False), "direct": partial(handed_off, True),
            "side": side_bare, "caller": caller, "cpu": cpu}
    phases: dict[str, list[list[float]]] = {v: [] for v in VARIANTS}
    for i in range(WARMUP + reps):
        for name in VARIANTS:  # interleaved, so drift hits every variant alike
            dist.barrier()
            stamps = runs[name]()
            if i >= WARMUP:
                phases[name].append([(b - a) * 1e6 for a, b in itertools.pairwise(stamps)])
    return phases


PHASES = ("prepare", "acquire", "ring", "release", "gate", "sync")


def _summary(per_rank: list[dict], reps: int) -> dict:
    out = {}
    for name in VARIANTS:
        ops = [r[name] for r in per_rank]  # [rank][op][phase]
        row = {}
        for k, phase in enumerate(PHASES):
            vals = sorted(op[k] for rank in ops for op in rank)
            row[phase] = {"median_us": statistics.median(vals),
                          "p90_us": vals[int(0.9 * (len(vals) - 1))]}
        slowest = [max(sum(rank[i]) for rank in ops) for i in range(reps)]
        row["total_median_us"] = statistics.median(sum(op) for rank in ops for op in rank)
        row["slowest_rank_median_us"] = statistics.median(slowest)
        out[name] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", default="1,4,8")
    ap.add_argument("--op", default="all_gather",
                    choices=("all_gather", "reduce_scatter", "all_reduce"))
    ap.add_argument("--size", default="1M")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    nbytes = parse_size(args.size)
    report = {"op": args.op, "size_bytes": nbytes, "reps": args.reps, "worlds": {}}
    for world in (int(w) for w in args.worlds.split(",")):
        per_rank = run_ranks(_rank, world, args.op, nbytes, args.reps, timeout=TIMEOUT_S)
        summary = _summary(per_rank, args.reps)
        report["worlds"][world] = summary
        for name, row in summary.items():
            cells = " ".join(f"{p}={row[p]['median_us']:.0f}/{row[p]['p90_us']:.0f}"
                             for p in PHASES)
            print(f"{args.op} {args.size} world={world} {name:7s} total="
                  f"{row['total_median_us']:.0f} slowest={row['slowest_rank_median_us']:.0f}"
                  f"  (median/p90 us) {cells}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
