"""A real DDP training step on CUDA tensors: mccl vs gloo throughput and final parameters.

Why: the overlap benchmark is synthetic; this is ``DistributedDataParallel`` itself (its
reducer, buckets and Future-based completion) on a ViT-sized transformer, with every rank on
the GPU (ranks share GPU 0 when there is one GPU). Both backends train from the same init on
the same data in the same run; the parameters they end with are compared (they differ only by
the order of floating-point sums in the all-reduce).

Example (what benchmarks/h200/run_all.sh runs)::

    python benchmarks/ddp_cuda.py --world 4 --layers 12 --steps 10 \\
        --json benchmarks/results/h200/ddp_cuda.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mccl.bench.spawn import run_ranks  # noqa: E402

PG_TIMEOUT_S = 300.0  # torch.distributed timeout inside the ranks


def _rank(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    if cfg["device"] == "cuda":
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    else:
        dev = torch.device("cpu")

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    torch.manual_seed(0)
    width, layers, seq, batch = cfg["width"], cfg["layers"], cfg["seq"], cfg["batch"]
    layer = torch.nn.TransformerEncoderLayer(width, width // 64, 4 * width, dropout=0.0,
                                             batch_first=True, norm_first=True)
    encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
    model = torch.nn.Sequential(encoder,
                                torch.nn.Linear(width, 1000)).to(dev)
    params = sum(p.numel() for p in model.parameters())
    ddp = DDP(model, device_ids=[dev] if dev.type == "cuda" else None,
              bucket_cap_mb=cfg["bucket_mb"])
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1234 + rank)
    data = [(torch.randn(batch, seq, width, generator=gen).to(dev),
             torch.randint(0, 1000, (batch,), generator=gen).to(dev))
            for _ in range(cfg["warmup"] + cfg["steps"])]
    tgroup = dist.new_group(backend="gloo")
    times = []
    for i, (x, y) in enumerate(data):
        sync()
        dist.barrier(group=tgroup)
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(ddp(x)[:, 0], y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sync()
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=tgroup)
        if i >= cfg["warmup"]:
            times.append(t.item())
    # compute-only reference: the same step without DDP's communication
    with ddp.no_sync():
        local = []
        for x, y in data[: cfg["warmup"] + 3]:
            sync()
            dist.barrier(group=tgroup)
            t0 = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(ddp(x)[:, 0], y)
            loss.backward()
            sync()
            t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=tgroup)
            local.append(t.item())
    out = {"times": times, "params": params, "t_no_comm_s": statistics.median(local[-3:])}
    if rank == 0:
        torch.save([p.detach().cpu() for p in model.parameters()], cfg["save"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu only to try the script without a GPU")
    p.add_argument("--backends", default="mccl,gloo")
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--seq", type=int, default=197)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("ddp_cuda: no CUDA GPU here", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="mccl-ddp-") as tmp:  # the ranks' saved params
        return _compare(args, tmp)


def _compare(args: argparse.Namespace, tmp: str) -> int:
    """Run each backend, compare throughput and the final parameters (saved under tmp)."""
    import torch

    rows, saved = [], {}
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        cfg = {k: getattr(args, k) for k in ("width", "layers", "seq", "batch", "steps",
                                            "warmup", "device")}
        cfg["bucket_mb"] = args.bucket_mb
        cfg["save"] = saved[backend] = os.path.join(tmp, f"{backend}.pt")
        t0 = time.monotonic()
        res = run_ranks(_rank, args.world, cfg, backend=backend, timeout=args.timeout,
                        pg_timeout_s=PG_TIMEOUT_S)[0]
        med = statistics.median(res["times"])
        rows.append({"backend": backend, "step_s": med, "steps_per_s": 1 / med,
                     "samples_per_s": args.world * args.batch / med,
                     "t_no_comm_s": res["t_no_comm_s"], "step_samples": res["times"],
                     "params": res["params"], "wall_s": time.monotonic() - t0})
        print(f"{backend:<5} step {med * 1e3:8.1f} ms  ({1 / med:6.2f} steps/s, "
              f"{args.world * args.batch / med:7.1f} samples/s; same step without comm "
              f"{res['t_no_comm_s'] * 1e3:.1f} ms; {res['params'] / 1e6:.1f} M params)",
              flush=True)
    doc: dict[str, Any] = {
        "benchmark": "ddp_cuda", "command": shlex.join([sys.executable] + sys.argv),
        "argv": sys.argv[1:], "world": args.world, "device": args.device,
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        "gpus": torch.cuda.device_count(), "torch": torch.__version__,
        "platform": platform.platform(), "config": vars(args), "rows": rows}
    by = {r["backend"]: r for r in rows}
    if "mccl" in by and "gloo" in by:
        doc["throughput_ratio_mccl_over_gloo"] = by["gloo"]["step_s"] / by["mccl"]["step_s"]
        a, b = torch.load(saved["mccl"]), torch.load(saved["gloo"])
        diff = max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))
        scale = max(y.abs().max().item() for y in b)
        doc["params_max_abs_diff"] = diff
        doc["params_max_abs"] = scale
        doc["params_match"] = diff <= 1e-4 * max(1.0, scale)
        print(f"mccl/gloo throughput ratio {doc['throughput_ratio_mccl_over_gloo']:.3f}; "
              f"final parameters max |mccl - gloo| = {diff:.3g} (max |p| {scale:.3g}): "
              f"{'match' if doc['params_match'] else 'DIFFER'}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0 if doc.get("params_match", True) else 1


if __name__ == "__main__":
    raise SystemExit(main())
