"""FSDP2 (``fully_shard``) trains a small transformer on mccl with the same losses as gloo.

One spawned run of 2 ranks: the default group is mccl, a second group over the same ranks is
gloo; the same model (same seed) is trained on each with the same data, and the per-step
losses and final parameters must agree. FSDP2 exercises all_gather_into_tensor,
reduce_scatter_tensor (AVG), coalesced variants via DTensor, and the group-name plumbing that
DeviceMesh needs.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from mccl.bench.spawn import run_ranks

VOCAB, DIM, LAYERS, STEPS = 64, 16, 2, 4


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block(DIM) for _ in range(LAYERS))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _train(rank: int, mesh) -> tuple[list[float], torch.Tensor]:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = TinyLM()
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    idx = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(100 + rank))
    pg = mesh.get_group()
    losses = []
    for _ in range(STEPS):  # one fixed batch per rank: the loss must go down
        loss = nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.roll(1, 1).flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        avg = loss.detach().clone()
        dist.all_reduce(avg, op=dist.ReduceOp.AVG, group=pg)
        losses.append(avg.item())
    flat = torch.cat([p.full_tensor().reshape(-1) for p in model.parameters()])
    return losses, flat


def _parity(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    mccl_mesh = init_device_mesh("cpu", (world,))
    assert dist.get_backend(mccl_mesh.get_group()) == "mccl"
    gloo_mesh = DeviceMesh.from_group(dist.new_group(backend="gloo"), "cpu")
    mccl_losses, mccl_params = _train(rank, mccl_mesh)
    gloo_losses, gloo_params = _train(rank, gloo_mesh)
    return {"mccl": mccl_losses, "gloo": gloo_losses,
            "param_diff": (mccl_params - gloo_params).abs().max().item()}


def test_fsdp2_matches_gloo() -> None:
    results = run_ranks(_parity, 2, timeout=150)
    for r in results:
        assert len(r["mccl"]) == STEPS
        assert r["mccl"] == results[0]["mccl"], "ranks disagree on the averaged loss"
        torch.testing.assert_close(torch.tensor(r["mccl"]), torch.tensor(r["gloo"]),
                                   rtol=1e-5, atol=1e-6)
        assert r["param_diff"] < 1e-5
    assert results[0]["mccl"][-1] < results[0]["mccl"][0], "the model did not train"


def _fsdp1_parity(rank: int, world: int) -> dict:
    """FSDP1 frees each flat parameter's gathered storage by resizing it to 0 after use, so
    an op must leave the storage of the tensors it touched resizable (``Tensor.numpy()``
    made it not resizable for good: the first forward failed)."""
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    gloo = dist.new_group(backend="gloo")
    out = {}
    for name, group in (("mccl", None), ("gloo", gloo)):
        for strategy in (ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP):
            torch.manual_seed(0)
            model = FullyShardedDataParallel(TinyLM(), process_group=group,
                                             sharding_strategy=strategy,
                                             device_id=torch.device("cpu"))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            idx = torch.randint(0, VOCAB, (2, 8),
                                generator=torch.Generator().manual_seed(100 + rank))
            losses = []
            for _ in range(STEPS):
                loss = nn.functional.cross_entropy(model(idx).flatten(0, 1),
                                                   idx.roll(1, 1).flatten())
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.item())
            out[f"{name} {strategy.name}"] = losses
    return out


def test_fsdp1_matches_gloo() -> None:
    results = run_ranks(_fsdp1_parity, 2, timeout=150)
    for r in results:
        for key, losses in r.items():
            if key.startswith("mccl"):
                torch.testing.assert_close(torch.tensor(losses),
                                           torch.tensor(r["gloo" + key[4:]]),
                                           rtol=1e-5, atol=1e-6, msg=key)
