"""torch's parallelism APIs over mccl: functional collectives, DTensor tensor parallelism on
1-D and 2-D device meshes, and ``torch.distributed.pipelining`` schedules.

These reach the process group by other roads than ``torch.distributed``'s collectives:
functional collectives find it by group name and wait through ``wait_tensor``, tensor
parallelism runs them inside autograd, device meshes build their groups with ``new_group``,
and pipeline stages exchange shapes and activations with ``batch_isend_irecv``. Each result
is checked against exact values or against the same code on gloo in the same ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from mccl.bench.spawn import run_ranks

STEPS = 4
MICROBATCHES = 4


def _functional(rank: int, world: int) -> dict:
    import torch.distributed._functional_collectives as fc

    reduce_scatter = getattr(fc, "reduce_scatter_single", None) or fc.reduce_scatter_tensor
    group = dist.group.WORLD
    x = torch.arange(6, dtype=torch.float32) + 10 * rank
    parts = torch.cat([x + 1000 * k for k in range(world)])  # part k goes to rank k
    leaf = x.clone().requires_grad_()
    gathered = fc.all_gather_tensor_autograd(leaf, 0, group)
    (gathered * torch.arange(gathered.numel(), dtype=torch.float32)).sum().backward()
    out = {"all_reduce": fc.all_reduce(x, "sum", group),
           "all_gather": fc.all_gather_tensor(x, 0, group),
           "reduce_scatter": reduce_scatter(parts, "sum", 0, group),
           "all_to_all": fc.all_to_all_single(torch.arange(world, dtype=torch.float32)
                                              + 100 * rank, None, None, group),
           "gather_grad": leaf.grad}
    return {k: v.tolist() for k, v in out.items()}


def test_functional_collectives_give_exact_values() -> None:
    world = 3
    results = run_ranks(_functional, world, timeout=120)
    xs = [torch.arange(6, dtype=torch.float32) + 10 * r for r in range(world)]
    total = sum(xs)
    for rank, got in enumerate(results):
        assert got["all_reduce"] == total.tolist()
        assert got["all_gather"] == torch.cat(xs).tolist()
        assert got["reduce_scatter"] == (total + world * 1000 * rank).tolist()
        assert got["all_to_all"] == [float(rank + 100 * r) for r in range(world)]
        # all_gather's backward reduce-scatters the gradient: every rank weighted the
        # gathered vector by its position, so rank r's part gets world times its positions.
        n = xs[0].numel()
        assert got["gather_grad"] == (world * torch.arange(rank * n, (rank + 1) * n,
                                                           dtype=torch.float32)).tolist()


class _MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def _tensor_parallel(mesh) -> tuple[list[float], torch.Tensor]:
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    model = parallelize_module(_MLP(), mesh, {"up": ColwiseParallel(),
                                              "down": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(STEPS):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, torch.cat([p.full_tensor().reshape(-1) for p in model.parameters()])


def _tp_parity(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    mccl_mesh = init_device_mesh("cpu", (world,))
    assert dist.get_backend(mccl_mesh.get_group()) == "mccl"
    gloo_mesh = DeviceMesh.from_group(dist.new_group(backend="gloo"), "cpu")
    mccl_losses, mccl_params = _tensor_parallel(mccl_mesh)
    gloo_losses, gloo_params = _tensor_parallel(gloo_mesh)
    # The groups of a 2-D mesh: "tp" joins ranks 2i and 2i + 1, "dp" ranks i and i + 2.
    mesh2 = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    sums = {}
    for dim in ("dp", "tp"):
        t = torch.full((5,), float(rank + 1))
        dist.all_reduce(t, group=mesh2.get_group(dim))
        sums[dim] = t.tolist()
    return {"mccl": mccl_losses, "gloo": gloo_losses, "sums": sums,
            "param_diff": (mccl_params - gloo_params).abs().max().item()}


def test_tensor_parallel_matches_gloo_and_2d_mesh_groups() -> None:
    world = 4
    results = run_ranks(_tp_parity, world, timeout=150)
    for rank, r in enumerate(results):
        assert len(r["mccl"]) == STEPS
        torch.testing.assert_close(torch.tensor(r["mccl"]), torch.tensor(r["gloo"]),
                                   rtol=1e-5, atol=1e-6)
        assert r["param_diff"] < 1e-5
        tp_peer, dp_peer = rank ^ 1, (rank + 2) % world
        assert r["sums"]["tp"] == [float(rank + 1 + tp_peer + 1)] * 5
        assert r["sums"]["dp"] == [float(rank + 1 + dp_peer + 1)] * 5
    assert results[0]["mccl"][-1] < results[0]["mccl"][0], "the model did not train"


def _pipeline_step(rank: int, world: int, schedule_name: str, group) -> dict:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    torch.manual_seed(0)
    layers = [nn.Linear(8, 8) for _ in range(world)]
    stage = PipelineStage(layers[rank], rank, world, torch.device("cpu"), group=group)
    schedule_cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule_name]
    schedule = schedule_cls(stage, n_microbatches=MICROBATCHES,
                            loss_fn=lambda out, target: (out - target).pow(2).mean())
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(1))
    target = torch.randn(8, 8, generator=torch.Generator().manual_seed(2))
    losses: list[torch.Tensor] = []
    if rank == 0:
        out = schedule.step(x)
    elif rank == world - 1:
        out = schedule.step(target=target, losses=losses)
    else:
        out = schedule.step()
    return {"losses": [loss.item() for loss in losses],
            "out": None if out is None else out.tolist(),
            "grad": layers[rank].weight.grad.reshape(-1).tolist()}


def _pipelines(rank: int, world: int) -> dict:
    gloo = dist.new_group(backend="gloo")
    return {name: {"mccl": _pipeline_step(rank, world, name, None),
                   "gloo": _pipeline_step(rank, world, name, gloo)}
            for name in ("gpipe", "1f1b")}


def test_pipeline_schedules_match_gloo() -> None:
    world = 3
    results = run_ranks(_pipelines, world, timeout=150)
    for rank, r in enumerate(results):
        for name, runs in r.items():
            # Point-to-point only: the same bytes arrive, so the results are identical.
            assert runs["mccl"] == runs["gloo"], f"{name} differs on rank {rank}"
            assert any(g != 0.0 for g in runs["mccl"]["grad"]), f"{name}: no gradient"
    last = results[-1]
    for name in ("gpipe", "1f1b"):
        assert len(last[name]["mccl"]["losses"]) == MICROBATCHES
        assert last[name]["mccl"]["out"] is not None


def _compiled_ddp(rank: int, group) -> tuple[list[float], torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))
    ddp = nn.parallel.DistributedDataParallel(model, process_group=group)
    compiled = torch.compile(ddp, backend="eager")
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    losses = []
    for step in range(STEPS):
        x = torch.randn(8, 8, generator=torch.Generator().manual_seed(10 * step + rank))
        loss = compiled(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    state = torch.cat([t.reshape(-1).float() for t in ddp.module.state_dict().values()])
    return losses, state


def _compiled_ddp_parity(rank: int, world: int) -> dict:
    mccl_losses, mccl_state = _compiled_ddp(rank, None)
    gloo_losses, gloo_state = _compiled_ddp(rank, dist.new_group(backend="gloo"))
    return {"mccl": mccl_losses, "gloo": gloo_losses,
            "state_diff": (mccl_state - gloo_state).abs().max().item()}


def test_compiled_ddp_matches_gloo() -> None:
    """DDP under torch.compile: from the second step DDP's reducer calls the group (bucket
    rebuild, buffer broadcast) from inside the compiled forward (mccl/eager.py)."""
    results = run_ranks(_compiled_ddp_parity, 2, timeout=240)
    for r in results:
        assert len(r["mccl"]) == STEPS
        torch.testing.assert_close(torch.tensor(r["mccl"]), torch.tensor(r["gloo"]),
                                   rtol=1e-5, atol=1e-6)
        assert r["state_diff"] < 1e-5


def _work_in_fullgraph(rank: int, world: int) -> dict:
    t = torch.full((4,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    work.wait()  # done on every rank: dynamo used to trace straight through a finished wait

    @torch.compile(backend="eager", fullgraph=True)
    def doubled_after(w, x):
        w.wait()
        return x * 2

    try:
        doubled_after(work, t)
        outcome = "compiled"
    except Exception as e:  # noqa: BLE001 - the outcome is what the test compares
        outcome = f"{type(e).__name__}: {'disable' in str(e)}"
    after = torch.full((3,), float(rank))
    dist.all_reduce(after)  # the group is still in step
    return {"outcome": outcome, "t": t.tolist(), "after": after.tolist()}


def test_work_handed_to_a_fullgraph_compile_is_refused_on_every_rank() -> None:
    """Dynamo must not inline mccl's ``Work.wait``: whether that trace got through depended on
    whether the op had finished on that rank, so ranks compiled different graphs and issued
    different collectives. Now it is refused alike on every rank, as gloo's C++ Work is."""
    results = run_ranks(_work_in_fullgraph, 2, timeout=150)
    for r in results:
        assert r["outcome"] == "Unsupported: True", r["outcome"]
        assert r["t"] == [3.0] * 4 and r["after"] == [1.0] * 3


def test_methods_keep_the_inlining_flag_without_dynamos_per_code_mark(monkeypatch) -> None:
    """A torch without the private per-code mark still gets the flag that stops dynamo from
    inlining (``run_eagerly`` then says it could not mark the frames)."""
    from mccl import eager

    class Probe:
        def method(self) -> int:
            return 1

    monkeypatch.setattr(eager, "set_code_exec_strategy", None)
    assert eager.run_eagerly(Probe) is False
    assert Probe.method._torchdynamo_disable is True
    assert "mccl" in Probe.method._torchdynamo_disable_msg
