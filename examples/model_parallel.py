"""Pipeline and expert parallelism on mccl, each checked against a single-process reference.

* Pipeline (send/recv): a stack of ``world`` stages, stage r on rank r. GPipe schedule: every
  micro-batch goes forward through the ranks (activations sent with ``dist.send``, tag = the
  micro-batch), then the gradients come back the same way in reverse.
* Experts (all_to_all_single): one expert MLP per rank; each rank routes its tokens to the
  experts' ranks with uneven split sizes, through the differentiable
  ``torch.distributed.nn.functional.all_to_all_single``, and gets the results back the same way.

Every rank also builds the whole model and every rank's data from the same seeds, runs it
locally, and compares outputs and gradients with the distributed run.

    python examples/model_parallel.py              # spawns 3 ranks on this machine
    python examples/model_parallel.py --world 4
    torchrun --nproc-per-node 3 examples/model_parallel.py
"""

from __future__ import annotations

import argparse
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
import torch.nn as nn

import mccl  # noqa: F401 - registers the "mccl" backend

DIM, MICRO, MICRO_BATCH, TOKENS = 8, 4, 3, 10


def _stages(world: int) -> nn.ModuleList:
    torch.manual_seed(1)
    return nn.ModuleList(nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh()) for _ in range(world))


def pipeline(rank: int, world: int) -> dict:
    """GPipe over send/recv; returns the loss and the largest gradient error vs the reference."""
    stages = _stages(world)
    stage = stages[rank]
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(MICRO_BATCH, DIM, generator=g) for _ in range(MICRO)]
    ys = [torch.randn(MICRO_BATCH, DIM, generator=g) for _ in range(MICRO)]
    prv, nxt = rank - 1, rank + 1
    inputs, outputs, loss_sum = [], [], 0.0
    for m in range(MICRO):  # forward, micro-batch by micro-batch
        if rank == 0:
            x = xs[m]
        else:
            x = torch.empty(MICRO_BATCH, DIM)
            dist.recv(x, src=prv, tag=m)
            x.requires_grad_(True)
        out = stage(x)
        inputs.append(x)
        if nxt < world:
            dist.send(out.detach(), dst=nxt, tag=m)
            outputs.append(out)
        else:
            loss = nn.functional.mse_loss(out, ys[m]) / MICRO
            loss_sum += loss.item()
            outputs.append(loss)
    for m in reversed(range(MICRO)):  # backward, gradients flow to the previous rank
        if nxt < world:
            grad = torch.empty(MICRO_BATCH, DIM)
            dist.recv(grad, src=nxt, tag=MICRO + m)
            outputs[m].backward(grad)
        else:
            outputs[m].backward()
        if rank > 0:
            dist.send(inputs[m].grad, dst=prv, tag=MICRO + m)
    loss_t = torch.tensor([loss_sum])
    dist.broadcast(loss_t, src=world - 1)

    ref = _stages(world)  # the whole model, locally
    ref_loss = 0.0
    for m in range(MICRO):
        h = xs[m]
        for s in ref:
            h = s(h)
        loss = nn.functional.mse_loss(h, ys[m]) / MICRO
        loss.backward()
        ref_loss += loss.item()
    err = max((p.grad - q.grad).abs().max().item()
              for p, q in zip(stage.parameters(), ref[rank].parameters(), strict=True))
    return {"loss": loss_t.item(), "ref_loss": ref_loss, "grad_err": err}


def _experts(world: int) -> tuple[nn.ModuleList, torch.Tensor]:
    torch.manual_seed(3)
    experts = nn.ModuleList(nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.ReLU(),
                                          nn.Linear(2 * DIM, DIM)) for _ in range(world))
    router = torch.randn(DIM, world)
    return experts, router


def _tokens(rank: int) -> torch.Tensor:
    return torch.randn(TOKENS + rank, DIM, generator=torch.Generator().manual_seed(10 + rank))


def experts(rank: int, world: int) -> dict:
    """Expert parallelism over all_to_all_single with uneven splits; returns the largest output
    and gradient errors vs the reference."""
    mods, router = _experts(world)
    mine = mods[rank]
    x = _tokens(rank)
    dest = (x @ router).argmax(dim=1)  # the expert (= rank) of every token
    order = torch.argsort(dest, stable=True)
    send_counts = torch.bincount(dest, minlength=world)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)  # how many tokens each rank sends me
    sends, recvs = send_counts.tolist(), recv_counts.tolist()
    routed = dist_fn.all_to_all_single(torch.empty(sum(recvs), DIM), x[order], recvs, sends)
    back = dist_fn.all_to_all_single(torch.empty(len(x), DIM), mine(routed), sends, recvs)
    out = torch.empty_like(back).index_copy(0, order, back)  # undo the sort
    out.pow(2).sum().backward()

    ref_mods, _ = _experts(world)  # every rank's tokens through every expert, locally
    ref_out = None
    for r in range(world):
        xr = _tokens(r)
        dr = (xr @ router).argmax(dim=1)
        o = torch.stack([ref_mods[int(e)](t) for t, e in zip(xr, dr, strict=True)])
        o.pow(2).sum().backward()
        if r == rank:
            ref_out = o.detach()
    out_err = (out.detach() - ref_out).abs().max().item()
    grad_err = max((p.grad - q.grad).abs().max().item()
                   for p, q in zip(mine.parameters(), ref_mods[rank].parameters(), strict=True))
    return {"routed": recvs, "out_err": out_err, "grad_err": grad_err}


def demo(rank: int, world: int) -> dict:
    """Both demos on an initialized default group."""
    return {"pipeline": pipeline(rank, world), "experts": experts(rank, world)}


def _report(rank: int, res: dict) -> None:
    p, e = res["pipeline"], res["experts"]
    print(f"rank {rank}: pipeline loss {p['loss']:.5f} (reference {p['ref_loss']:.5f}, "
          f"grad err {p['grad_err']:.1e}); experts got {e['routed']} tokens "
          f"(output err {e['out_err']:.1e}, grad err {e['grad_err']:.1e})")
    assert abs(p["loss"] - p["ref_loss"]) < 1e-5 and p["grad_err"] < 1e-5, p
    assert e["out_err"] < 1e-5 and e["grad_err"] < 1e-4, e


def _worker(rank: int, world: int, port: int | None) -> None:
    if port is None:  # torchrun: rank, world and rendezvous come from the environment
        dist.init_process_group("mccl")
    else:
        dist.init_process_group("mccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=60))
    try:
        _report(dist.get_rank(), demo(dist.get_rank(), dist.get_world_size()))
    finally:
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=3)
    args = ap.parse_args()
    if "RANK" in os.environ:
        _worker(0, 0, None)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_worker, args=(args.world, port), nprocs=args.world)


if __name__ == "__main__":
    main()
