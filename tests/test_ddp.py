"""Issue #2: unmodified DDP trains on mccl and ends where the same script on gloo ends."""

from __future__ import annotations

import pytest
import torch

from mccl.bench.spawn import run_ranks

STEPS = 6
CONFIGS = ["default", "bucket_view", "static_graph", "find_unused", "allreduce_hook",
           "fp16_hook", "powersgd_hook", "join", "join_current_world"]
if torch.cuda.is_available() and tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 13):
    # torch 2.11's PowerSGD hook calls torch.cuda.synchronize on CPU tensors' device when a
    # GPU is present and fails for gloo too (seen on the H200); nothing to compare there.
    CONFIGS.remove("powersgd_hook")
# bf16_compress_hook is refused by torch itself unless CUDA+NCCL or XPU+XCCL are present.


class _Net(torch.nn.Module):
    def __init__(self, with_unused: bool = False) -> None:
        super().__init__()
        self.a = torch.nn.Linear(32, 64)
        self.b = torch.nn.Linear(64, 64)
        self.head = torch.nn.Linear(64, 4)
        if with_unused:  # a parameter that never gets a gradient: find_unused_parameters
            self.unused = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.b(torch.relu(self.a(x)))))


def _train(config: str, group, rank: int) -> list[torch.Tensor]:
    """``join*``: uneven inputs (rank r takes r more steps) under DDP's Join; with
    ``divide_by_initial_world_size=False`` the reducer itself waits on the Work of Join's
    all-reduce and reads its future in the backward pass, after Python dropped it."""
    import contextlib

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    net = _Net(with_unused=config == "find_unused")
    kwargs = dict(process_group=group, bucket_cap_mb=0.01)  # several buckets
    if config == "powersgd_hook":
        kwargs["bucket_cap_mb"] = 25  # one bucket: PowerSGD needs equal bucketing on ranks
    if config == "bucket_view":
        kwargs["gradient_as_bucket_view"] = True
    if config == "static_graph":
        kwargs["static_graph"] = True
    if config == "find_unused":
        kwargs["find_unused_parameters"] = True
    model = DDP(net, **kwargs)
    if config == "allreduce_hook":
        model.register_comm_hook(group, default_hooks.allreduce_hook)
    elif config == "fp16_hook":
        model.register_comm_hook(group, default_hooks.fp16_compress_hook)
    elif config == "powersgd_hook":
        state = psgd.PowerSGDState(process_group=group, matrix_approximation_rank=2,
                                   start_powerSGD_iter=2, random_seed=0)
        model.register_comm_hook(state, psgd.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)
    joined = config.startswith("join")
    with (model.join(divide_by_initial_world_size=config == "join") if joined
          else contextlib.nullcontext()):
        for _ in range(STEPS + (rank if joined else 0)):
            x = torch.randn(16, 32, generator=gen)
            y = torch.randn(16, 4, generator=gen)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _parity(rank: int, world: int) -> dict[str, float]:
    import torch.distributed as dist

    gloo = dist.new_group(backend="gloo")
    mccl = dist.group.WORLD
    worst: dict[str, float] = {}
    for config in CONFIGS:
        ref = _train(config, gloo, rank)
        got = _train(config, mccl, rank)
        diff = max((a - b).abs().max().item() for a, b in zip(ref, got, strict=True))
        moved = max((a - b).abs().max().item() for a, b in zip(ref, _initial(config), strict=True))
        assert moved > 1e-3, f"{config}: training did not move the parameters"
        worst[config] = diff
    return worst


def _initial(config: str) -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [p.detach().clone() for p in _Net(config == "find_unused").parameters()]


@pytest.mark.parametrize("world", [2, 3])
def test_ddp_matches_gloo(world: int) -> None:
    results = run_ranks(_parity, world, timeout=240)
    for rank, worst in enumerate(results):
        for config, diff in worst.items():
            tol = 5e-3 if config in ("fp16_hook", "powersgd_hook") else 1e-5
            assert diff <= tol, f"rank {rank} {config}: max |mccl - gloo| = {diff}"
