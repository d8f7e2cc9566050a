"""One benchmark rank: ``python -m mccl.bench.worker --config JSON`` with env:// rendezvous vars.

Why a separate process per rank: that is how the backend is used, and it keeps a hung or
crashed backend from taking the parent down (the parent kills the process group). Timing
follows nccl-tests: a sample is a run of back-to-back ops started by a barrier, its time per op
is the slowest rank's elapsed time over the number of ops, and the row reports the median
sample. Short ops are repeated until a sample lasts MIN_SAMPLE_S, because the barrier's exit
skew between ranks (0.4-0.9 ms for 4 ranks on 2 cores) would otherwise be counted as op
time; ``per_op_barrier`` restores one op per sample. Barriers and the max-reduction run on a
separate gloo group so they are never what is measured. Rank 0 reports on stdout, one JSON event per
line prefixed with EVENT_PREFIX; everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
import traceback
from datetime import timedelta
from typing import Any

log = logging.getLogger(__name__)

EVENT_PREFIX = "MCCLBENCH "
BUILTIN_BACKENDS = ("gloo", "nccl", "mpi", "ucc")
MIN_ITERS = 3  # even when the time budget says fewer
MIN_SAMPLE_S = 0.05  # back-to-back ops per sample until it lasts this long (--min-sample)...
MAX_REPS = 200  # ...but no more ops than this in one sample
# Fault injection for the runner's own tests: "hang:OP,crash:OP2" makes the last rank sleep
# forever / exit 3 when that op starts, to prove deadlines and relaunches work.
FAULT_ENV = "MCCL_BENCH_FAULT"
FAULT_EXIT_CODE = 3


def emit(event: str, **fields: Any) -> None:
    """Rank 0's report line for the parent (parsed by runner)."""
    print(EVENT_PREFIX + json.dumps({"event": event, **fields}), flush=True)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
    elif device.startswith("mps"):
        torch.mps.synchronize()


def bench_one(op: str, size: int, cfg: dict[str, Any], rank: int, world: int,
              tgroup: Any) -> dict[str, Any]:
    """Time op at size bytes; returns the row (identical on all ranks)."""
    import torch
    import torch.distributed as dist

    from mccl.bench.ops import bus_factor, element_count, element_size, make_case

    dtype = getattr(torch, cfg["dtype"])
    elem = element_size(dtype)
    device = cfg.get("device", "cpu")
    case = make_case(op, element_count(op, size, world, elem), dtype, rank, world, device,
                     queue=int(cfg.get("queue", 1)))

    def timed(reps: int = 1) -> float:
        """Seconds per op (a rep is ``case.queue`` ops)."""
        dist.barrier(group=tgroup)
        t0 = time.perf_counter()
        for _ in range(reps):
            case.run()
        _sync(device)
        return (time.perf_counter() - t0) / (reps * case.queue)

    def agreed(seconds: float) -> float:
        """The slowest rank's value, so every rank derives the same repetition counts."""
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=tgroup)
        return max(t.item(), 1e-9)

    iters, reps = int(cfg["iters"]), 1
    warm = [timed() for _ in range(int(cfg["warmup"]))]
    budget = float(cfg.get("time_budget") or 0.0)
    if warm:
        est = agreed(statistics.median(warm))
        if not cfg.get("per_op_barrier"):
            min_sample = float(cfg.get("min_sample_s", MIN_SAMPLE_S))

            def reps_for(per_op: float) -> int:
                return max(1, min(MAX_REPS, int(min_sample / (per_op * case.queue))))

            # A single-op warm-up counts the barrier's exit skew and first-use costs, which
            # overstate a 1 MB op several-fold at times (a 10 Gbit reduce-scatter once got 7
            # ops per sample instead of ~40). The counts come from a back-to-back run, which
            # also warms that pattern.
            reps = reps_for(est)
            est = min(est, agreed(timed(reps)))
            reps = reps_for(est)
        if budget > 0:
            iters = max(min(iters, int(budget / (est * reps * case.queue))),
                        min(MIN_ITERS, iters))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    local = torch.tensor([timed(reps) for _ in range(iters)], dtype=torch.float64)
    # CPU time of the whole process (every thread, user and system) over the timed samples,
    # per op and as cores kept busy; the samples' barriers are counted in (they block).
    cpu = torch.tensor([time.process_time() - cpu0, time.perf_counter() - wall0],
                       dtype=torch.float64)
    dist.all_reduce(local, op=dist.ReduceOp.MAX, group=tgroup)  # per-iteration slowest rank
    dist.all_reduce(cpu, group=tgroup)
    cpu_s, wall_s = cpu.tolist()
    times = local.tolist()
    med = statistics.median(times)
    check_ok = None
    if cfg.get("check"):
        ok = torch.tensor([1 if case.check() else 0], dtype=torch.int64)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=tgroup)
        check_ok = bool(ok.item())
    algbw = case.nbytes / med / 1e9
    return {"op": op, "size": case.nbytes, "requested_size": size, "count": case.count,
            "dtype": cfg["dtype"], "world_size": world, "iters": iters, "reps": reps,
            "queue": case.queue,
            "time_us": med * 1e6, "min_us": min(times) * 1e6, "max_us": max(times) * 1e6,
            "algbw_gbs": algbw, "busbw_gbs": algbw * bus_factor(op, world), "check": check_ok,
            "cpu_us": cpu_s / world / (iters * reps * case.queue) * 1e6,
            "cpu_cores": cpu_s / max(wall_s, 1e-9)}


def _maybe_fault(op: str, rank: int, world: int) -> None:
    faults = {}
    for spec in os.environ.get(FAULT_ENV, "").split(","):
        kind, _, target = spec.partition(":")
        faults[target] = kind
    kind = faults.get(op)
    if kind is None or rank != world - 1:
        return
    if kind == "hang":
        log.warning("rank %d: injected hang in %s", rank, op)
        time.sleep(3600)
    elif kind == "crash":
        log.warning("rank %d: injected crash in %s", rank, op)
        os._exit(FAULT_EXIT_CODE)


def run(cfg: dict[str, Any]) -> int:
    """Init the backend under test and a gloo timing group, then bench every op x size."""
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = cfg["backend"]
    if backend not in BUILTIN_BACKENDS:
        import mccl  # noqa: F401  (registers the backend)
    torch.set_num_threads(max(1, int(cfg.get("threads") or 1)))
    if cfg.get("device") == "cuda":  # all ranks share this machine: spread them over its GPUs
        cfg["device"] = f"cuda:{rank % max(torch.cuda.device_count(), 1)}"
        torch.cuda.set_device(cfg["device"])
    timeout = timedelta(seconds=float(cfg.get("op_timeout", 120)))
    dist.init_process_group(backend=backend, rank=rank, world_size=world, timeout=timeout)
    tgroup = dist.new_group(backend="gloo", timeout=timeout)
    if rank == 0:
        emit("init", backend=backend, world_size=world, pid=os.getpid())
    status = 0
    for op in cfg["ops"]:
        for size in cfg.get("sizes_by_op", {}).get(op, cfg["sizes"]):  # runner.distinct_sizes
            if rank == 0:
                emit("start", op=op, size=size)
            _maybe_fault(op, rank, world)
            try:
                row = bench_one(op, size, cfg, rank, world, tgroup)
                err = None
            except Exception as exc:  # report and move on to the next op
                err = f"{type(exc).__name__}: {exc}"
                log.error("rank %d %s size %d failed:\n%s", rank, op, size,
                          traceback.format_exc())
            failed = torch.tensor([1 if err else 0], dtype=torch.int64)
            dist.all_reduce(failed, group=tgroup)
            if failed.item():
                status = 1
                if rank == 0:
                    emit("error", op=op, size=size,
                         error=err or f"failed on {failed.item()} other rank(s)")
                break
            if rank == 0:
                emit("row", **row)
    dist.barrier(group=tgroup)
    if rank == 0:
        emit("done")
    dist.destroy_process_group()
    return status


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mccl.bench.worker")
    p.add_argument("--config", required=True, help="JSON benchmark config (see runner)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format=f"[rank {os.environ.get('RANK', '?')}] %(message)s")
    return run(json.loads(args.config))


if __name__ == "__main__":
    raise SystemExit(main())
