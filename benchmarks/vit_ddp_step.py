"""One rank of a DDP training step of a ViT at the published size (~113.5 M parameters).

Run it on emulated hosts through the launcher (one rank per network namespace), once per
backend, e.g. on the H200 with 10 Gbit links::

    python -m mccl.bench.train --cluster --rate 10gbit --world-size 4 --backend mccl \\
        --script benchmarks/vit_ddp_step.py -- --device cuda --json /tmp/vit_mccl.json

Rank 0 reports the median step time with DDP (T_step), the same step under ``no_sync``
(T_compute: no gradient communication) and a bare all-reduce of all gradients (T_comm), and
hidden = (T_compute + T_comm - T_step) / T_comm: the share of communication that DDP's bucketed
all-reduce hid behind backward.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: Bare all-reduces of all gradients timed at least (their median is T_comm): with two, one
#: slow sample read mccl's 460 MB all-reduce at 0.68 s on the H200 x2 machine, with five 0.59
#: (fifteenth session, benchmarks/results/h200/call_s15c, call_s15d).
COMM_REPS = 5


class ViT(nn.Module):
    """Patch embedding + pre-norm transformer encoder + class head (ViT-B width, 16 layers)."""

    def __init__(self, width: int, layers: int, patch: int = 16, image: int = 224,
                 classes: int = 1000):
        super().__init__()
        self.embed = nn.Conv2d(3, width, patch, patch)
        n = (image // patch) ** 2 + 1
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.pos = nn.Parameter(torch.zeros(1, n, width))
        layer = nn.TransformerEncoderLayer(width, width // 64, 4 * width, dropout=0.0,
                                           batch_first=True, norm_first=True,
                                           activation="gelu")
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.encoder(x))[:, 0])


def _median_time(fn, steps: int, sync) -> float:
    times = []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _trace_ops(ops: list[dict]) -> None:
    """Record every mccl op's submission (caller's thread) and execution (comm thread) times
    into ``ops``, and when its first sends went out early (``early_start``, during the op
    before it; a diagnostic: wraps three Engine methods in this process)."""
    from mccl.engine import Engine

    submit, execute, start_next = Engine.submit, Engine._execute, Engine._start_next

    def traced_start_next(self, running):
        t = time.perf_counter()
        start_next(self, running)
        job = self._next
        if getattr(job, "early", None) is not None and hasattr(job, "trace"):
            job.trace["early_start"] = t

    def traced_submit(self, job, inline=False):
        job.trace = {"op": job.name, "count": job.sig.count, "submit": time.perf_counter()}
        ops.append(job.trace)
        return submit(self, job, inline)

    def traced_execute(self, job):
        rec = getattr(job, "trace", {})
        rec["start"] = time.perf_counter()
        try:
            return execute(self, job)
        finally:
            rec["end"] = time.perf_counter()

    Engine.submit, Engine._execute = traced_submit, traced_execute
    Engine._start_next = traced_start_next


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="mccl")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--batch", type=int, default=32, help="images per rank")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--json", default=None)
    p.add_argument("--trace", default=None,
                   help="write rank 0's timeline of the last DDP step here: forward and "
                        "backward ends and, with mccl, every op's submission, start and end")
    args = p.parse_args(argv)
    if args.backend == "mccl":
        import mccl  # noqa: F401
    dist.init_process_group(args.backend, timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.device == "cuda":  # the ranks share this machine: spread over its GPUs
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank))
                           % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    sync = (lambda: torch.cuda.synchronize(dev)) if args.device == "cuda" else (lambda: None)
    torch.manual_seed(0)
    model = ViT(args.width, args.layers).to(dev)
    nparams = sum(q.numel() for q in model.parameters())
    ddp = DDP(model, device_ids=[dev.index] if args.device == "cuda" else None,
              bucket_cap_mb=25)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.randn(args.batch, 3, 224, 224, device=dev)
    y = torch.randint(0, 1000, (args.batch,), device=dev)

    marks: dict[str, float] = {}
    ops: list[dict] = []
    if args.trace and args.backend == "mccl":
        _trace_ops(ops)

    def step() -> None:
        marks.clear()
        ops.clear()
        marks["start"] = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(ddp(x), y)
        marks["forward"] = time.perf_counter()
        loss.backward()
        marks["backward"] = time.perf_counter()  # DDP waited for every bucket's all-reduce
        opt.step()
        sync()
        marks["end"] = time.perf_counter()

    def local_step() -> None:
        with ddp.no_sync():
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()

    flat = torch.zeros(nparams, device=dev)

    def bare_comm() -> None:
        dist.all_reduce(flat)

    for _ in range(args.warmup):
        step()
        local_step()
    bare_comm()
    t_step = _median_time(step, args.steps, sync)
    traced = dict(marks), list(ops)  # the last DDP step (the runs below add ops)
    t_compute = _median_time(local_step, args.steps, sync)
    t_comm = _median_time(bare_comm, max(COMM_REPS, args.steps // 2), sync)
    stats = torch.tensor([t_step, t_compute, t_comm], dtype=torch.float64, device=dev)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)  # the slowest rank's times
    t_step, t_compute, t_comm = stats.tolist()
    hidden = (t_compute + t_comm - t_step) / t_comm
    result = dict(backend=args.backend, world=world, params=nparams, batch_per_rank=args.batch,
                  device=args.device, t_step=t_step, t_compute=t_compute, t_comm=t_comm,
                  hidden=hidden, images_per_s=args.batch * world / t_step,
                  grad_mb=nparams * 4 / 1e6)
    if rank == 0 and args.trace:
        t0 = traced[0]["start"]
        Path(args.trace).write_text(json.dumps({
            **{k: v - t0 for k, v in traced[0].items()},
            "ops": [{k: (v - t0 if k in ("submit", "early_start", "start", "end") else v)
                     for k, v in o.items()}
                    for o in traced[1]]}, indent=1))
    if rank == 0:
        print(json.dumps(result), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
