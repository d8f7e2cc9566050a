"""A tiny deterministic DDP training run, compared across backends by the device tests."""

from __future__ import annotations

import numpy as np
import torch


def train_ddp(rank: int, device: torch.device, steps: int = 4,
              uneven: bool = False) -> list[np.ndarray]:
    """Same init on every rank, rank-specific data, several buckets; returns the parameters.
    ``uneven``: rank r takes r more steps, under DDP's Join dividing by the ranks still in
    (the reducer then waits on the Work of Join's all-reduce itself, in the backward pass)."""
    import contextlib

    from torch.nn.parallel import DistributedDataParallel as DDP

    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(128, 512), torch.nn.GELU(), torch.nn.Linear(512, 512), torch.nn.GELU(),
        torch.nn.Linear(512, 10)).to(device)
    ddp = DDP(model, device_ids=[device] if device.type == "cuda" else None,
              bucket_cap_mb=0.25)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + rank)
    with (ddp.join(divide_by_initial_world_size=False) if uneven
          else contextlib.nullcontext()):
        for _ in range(steps + (rank if uneven else 0)):
            x = torch.randn(64, 128, generator=gen).to(device)
            y = torch.randint(0, 10, (64,), generator=gen).to(device)
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return [p.detach().cpu().numpy().copy() for p in model.parameters()]
