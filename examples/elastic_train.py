"""Elastic training over mccl: survive a worker crash by letting torchrun restart the group
and resuming from the last checkpoint.

    torchrun --nproc-per-node 2 --max-restarts 2 --rdzv-backend c10d \\
        --rdzv-endpoint 127.0.0.1:29400 examples/elastic_train.py --ckpt-dir /tmp/mccl-ckpt

A deterministic linear-regression model is trained with all-reduced gradients (float64, data
seeded per step and rank), so the weights after N steps are the same however often the job
was restarted; ``reference()`` computes them in one process. ``--crash-at-step S`` kills rank 1
with SIGKILL at step S of the first attempt, to show (and test) the restart. When a worker dies,
the survivors' pending collective fails with ``mccl.CollectiveError`` within moments; torchrun
then restarts every worker, and mccl's rendezvous keys are namespaced by
TORCHELASTIC_RESTART_COUNT so the new attempt never reads the dead attempt's addresses.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist

import mccl  # noqa: F401 - registers the "mccl" backend

DIM = 8
BATCH = 16
LR = 0.05

log = logging.getLogger("elastic_train")


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's data for ``step``: the same on every attempt."""
    g = torch.Generator().manual_seed(1_000_003 * step + rank)
    x = torch.randn(BATCH, DIM, generator=g, dtype=torch.float64)
    w_true = torch.arange(1, DIM + 1, dtype=torch.float64) / DIM
    y = x @ w_true + 0.01 * torch.randn(BATCH, generator=g, dtype=torch.float64)
    return x, y


def grad(w: torch.Tensor, step: int, rank: int) -> torch.Tensor:
    x, y = batch(step, rank)
    return 2.0 * x.T @ (x @ w - y) / BATCH


def reference(steps: int, world: int) -> torch.Tensor:
    """The weights after ``steps`` steps without any crash, computed in one process."""
    w = torch.zeros(DIM, dtype=torch.float64)
    for step in range(steps):
        total = grad(w, step, 0)
        for r in range(1, world):
            total = total + grad(w, step, r)
        w = w - LR * (total / world)
    return w


def save(ckpt: Path, step: int, w: torch.Tensor) -> None:
    """Atomic: a crash mid-write leaves the previous checkpoint intact."""
    tmp = ckpt.with_suffix(".tmp")
    torch.save({"step": step, "w": w.clone()}, tmp)
    os.replace(tmp, ckpt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--ckpt-every", type=int, default=5)
    ap.add_argument("--crash-at-step", type=int, default=-1,
                    help="rank 1 kills itself (SIGKILL) at this step of the first attempt")
    ap.add_argument("--out", help="rank 0 writes the final weights here (JSON)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("mccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    ckpt = Path(args.ckpt_dir) / "state.pt"

    # Rank 0 owns the checkpoint and broadcasts it, so ranks agree even without shared disk.
    state = torch.zeros(DIM + 1, dtype=torch.float64)
    if rank == 0 and ckpt.exists():
        saved = torch.load(ckpt)
        state[0] = saved["step"]
        state[1:] = saved["w"]
    dist.broadcast(state, src=0)
    start, w = int(state[0].item()), state[1:].clone()
    log.info("rank %d attempt %d resumes at step %d", rank, attempt, start)

    for step in range(start, args.steps):
        if attempt == 0 and rank == 1 and step == args.crash_at_step:
            log.info("rank 1 crashes at step %d", step)
            os.kill(os.getpid(), signal.SIGKILL)
        g = grad(w, step, rank)
        dist.all_reduce(g)  # a dead peer makes this raise mccl.CollectiveError, never hang
        w -= LR * (g / world)
        if rank == 0 and (step + 1) % args.ckpt_every == 0:
            save(ckpt, step + 1, w)

    if rank == 0 and args.out:
        Path(args.out).write_text(json.dumps({"w": w.tolist(), "attempt": attempt,
                                              "resumed_from": start}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
