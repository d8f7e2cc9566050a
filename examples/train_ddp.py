"""Tiny DistributedDataParallel training run on synthetic data, to see mccl carry real gradients.

Each rank fits the same small MLP to its own shard of a synthetic regression problem; DDP
all-reduces the gradients every step through the chosen backend. Rank 0 prints the loss and,
at the end, samples/s and whether the parameters are identical on every rank.

    torchrun --nproc-per-node 2 examples/train_ddp.py               # backend mccl
    torchrun --nproc-per-node 2 examples/train_ddp.py --backend gloo
    python -m mccl.bench.train --world-size 2                        # same, without torchrun
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

try:  # mccl's argument checks; importing mccl also registers the "mccl" backend
    from mccl.bench.cli import at_least
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from mccl.bench.cli import at_least

IN_FEATURES = 32
TIMED_AFTER_STEP = 5  # the first steps include DDP set-up and allocator warm-up


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="mccl", help="mccl (default) or gloo")
    p.add_argument("--steps", type=at_least(1), default=40)
    p.add_argument("--batch-size", type=at_least(1), default=64, help="per rank")
    p.add_argument("--hidden", type=at_least(1), default=512)
    p.add_argument("--layers", type=at_least(1), default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--log-every", type=at_least(1), default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=at_least(0.0, float, strict=True), default=120.0,
                   help="process group timeout (s)")
    return p.parse_args(argv)


def make_model(hidden: int, layers: int) -> nn.Module:
    dims = [IN_FEATURES] + [hidden] * layers
    body: list[nn.Module] = []
    for a, b in zip(dims[:-1], dims[1:], strict=True):
        body += [nn.Linear(a, b), nn.GELU()]
    return nn.Sequential(*body, nn.Linear(hidden, 1))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("WORLD_SIZE", 1))))
    dist.init_process_group(args.backend, timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(args.seed)  # same teacher and same initial weights on every rank
    teacher = torch.randn(IN_FEATURES, 1) / IN_FEATURES**0.5
    model = DDP(make_model(args.hidden, args.layers))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    data = torch.Generator().manual_seed(args.seed + 1000 * (rank + 1))  # own shard per rank
    nparams = sum(p.numel() for p in model.parameters())
    if rank == 0:
        print(f"backend={args.backend} world_size={world} params={nparams} "
              f"({nparams * 4 / 2**20:.1f} MiB of fp32 gradients per step)", flush=True)

    t_start = None
    for step in range(1, args.steps + 1):
        if step == TIMED_AFTER_STEP + 1:
            t_start = time.perf_counter()
        x = torch.randn(args.batch_size, IN_FEATURES, generator=data)
        y = torch.sin(x @ teacher) + 0.01 * torch.randn(args.batch_size, 1, generator=data)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces gradients here
        opt.step()
        if step % args.log_every == 0 or step == 1:
            avg = loss.detach().clone()
            dist.all_reduce(avg)
            if rank == 0:
                print(f"step {step:4d}  loss {avg.item() / world:.5f}", flush=True)

    timed = args.steps - TIMED_AFTER_STEP
    elapsed = time.perf_counter() - t_start if t_start else float("nan")
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    lo, hi = flat.clone(), flat.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    in_sync = bool(torch.equal(lo, hi))
    if rank == 0 and timed > 0:
        print(f"samples/s {timed * args.batch_size * world / elapsed:.1f} "
              f"(global, {world} ranks x {args.batch_size}), "
              f"{timed / elapsed:.2f} steps/s; params in sync: {in_sync}", flush=True)
    dist.destroy_process_group()
    return 0 if in_sync else 1


if __name__ == "__main__":
    raise SystemExit(main())
