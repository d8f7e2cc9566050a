"""How much of the gradient all-reduce hides behind backward compute, measured.

A synthetic bucketed training step: "backward" produces the gradient buckets one after the
other with real device work (CUDA: matrix products on the GPU; CPU: single-threaded matrix
products, which release the GIL), and each bucket is all-reduced with ``async_op=True`` as
soon as its last kernel is enqueued, like DDP. Three timings per variant, each the median of
``--steps`` steps and the slowest rank of each step:

* T_compute: the same step without any all-reduce,
* T_comm: the same all-reduces without the compute,
* T_step: both, overlapped.

hidden = (T_compute + T_comm - T_step) / T_comm: 1 = communication entirely hidden, 0 = none.
The last bucket's all-reduce has nothing left to hide behind, so 1 is out of reach.

Bucket sizes follow DDP (first bucket 1 MB, then 25 MB caps) over the gradients of a
113.5 M-parameter ViT (454 MB fp32), all times ``--scale``. With ``--compute-ms 0`` (default)
the compute per step is calibrated to ``--ratio`` times each variant's own T_comm; the matrix
products are spread over the buckets in proportion to their size.

The ratio sets what can be hidden at all, so every row also reports ``hidden_bound``: what a
backend without any per-op cost would reach with the same buckets, T_compute and T_comm (each
bucket's all-reduce starts when it is ready and the previous one is done). At ratio 1.0 the
second-to-last bucket's all-reduce is still running when backward ends (bound ~94 % for these
buckets). The default, ``PAPER_RATIO``, is the backward:communication ratio of the published
system at 4 hosts, estimated from its figures (95.9 % scaling efficiency and 94 % hidden on
24 Macs over 10 GbE, 454 MB of gradients): at 24 hosts one all-reduce moves 2*23/24*454 MB,
0.74 s at 10 GbE's TCP payload rate (1.177 GB/s); 6 % of that exposed costing 4.1 % of the
step makes the step 1.04 s; backward is about 2/3 of a transformer's forward+backward, 0.69 s;
at 4 hosts the all-reduce takes 2*3/4*454 MB / 1.177 GB/s = 0.58 s: backward/comm = 1.2.

Example (what benchmarks/h200/run_all.sh runs)::

    python benchmarks/overlap.py --device cuda --world 4 --scale 1.0 \\
        --json benchmarks/results/h200/overlap_cuda.json --png .../overlap_cuda.png
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mccl.bench.spawn import Hosts, run_ranks  # noqa: E402

VIT_PARAMS = 113_500_000
PG_TIMEOUT_S = 300.0  # torch.distributed timeout inside the ranks
#: Backward compute : gradient all-reduce time of the published system at 4 hosts (an
#: estimate from its figures; see the module docstring).
PAPER_RATIO = 1.2
BUCKET_CAP_MB = 25.0
FIRST_BUCKET_MB = 1.0
VARIANTS = {  # name -> (backend, extra env)
    "mccl": ("mccl", {"MCCL_UNIFIED_COLLECTIVE": "1"}),
    "mccl-staging": ("mccl", {"MCCL_UNIFIED_COLLECTIVE": "0"}),
    "gloo": ("gloo", {}),
}


def bucket_sizes(scale: float) -> list[int]:
    """Element counts of the gradient buckets, in the order backward produces them."""
    total = int(VIT_PARAMS * scale)
    first = max(1, int(FIRST_BUCKET_MB * scale * (1 << 20) / 4))
    cap = max(1, int(BUCKET_CAP_MB * scale * (1 << 20) / 4))
    sizes = [min(first, total)]
    left = total - sizes[0]
    while left > 0:
        sizes.append(min(cap, left))
        left -= sizes[-1]
    return sizes


def hidden_bound(sizes: list[int], t_compute: float, t_comm: float) -> float:
    """Hidden fraction a backend with no per-op cost reaches: bucket i is ready once the
    compute of buckets 0..i is done, and its all-reduce (its share of t_comm) starts when it
    is ready and the previous all-reduce has finished."""
    total = sum(sizes)
    ready = end = 0.0
    for n in sizes:
        ready += t_compute * n / total
        end = max(ready, end) + t_comm * n / total
    t_step = max(t_compute, end)
    return (t_compute + t_comm - t_step) / t_comm


def _rank(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if cfg["switch_interval"]:
        sys.setswitchinterval(cfg["switch_interval"])
    if cfg["device"] == "cuda":
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = False
    else:
        dev = torch.device(cfg["device"])

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        elif dev.type == "mps":
            torch.mps.synchronize()

    tgroup = dist.new_group(backend="gloo")  # timing and agreement, never what is measured
    sizes = bucket_sizes(cfg["scale"])
    gen = torch.Generator().manual_seed(rank)
    bases = [torch.randn(n, generator=gen).to(dev) for n in sizes]
    grads = [torch.empty(n, device=dev) for n in sizes]
    m = cfg["matmul"]
    a = torch.randn(m, m, generator=gen).to(dev) / m ** 0.5
    b = torch.randn(m, m, generator=gen).to(dev)
    y = torch.empty(m, m, device=dev)

    def spread(total: int) -> list[int]:
        """Matrix products per bucket, proportional to its size (largest remainder)."""
        exact = [total * n / sum(sizes) for n in sizes]
        ks = [int(e) for e in exact]
        for i in sorted(range(len(sizes)), key=lambda i: ks[i] - exact[i])[: total - sum(ks)]:
            ks[i] += 1
        return ks

    def step(total: int, comm: bool) -> float:
        ks = spread(total)
        sync()
        dist.barrier(group=tgroup)
        t0 = time.perf_counter()
        works = []
        for g, base, k in zip(grads, bases, ks, strict=True):
            for _ in range(k):
                torch.mm(a, b, out=y)
            g.copy_(base)
            if total:
                g.add_(y.view(-1)[:1], alpha=0.0)  # the bucket depends on the compute
            if comm:
                works.append(dist.all_reduce(g, async_op=True))
        for w in works:
            w.wait()
        sync()
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=tgroup)
        return t.item()

    def agree(x: float) -> float:
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=tgroup)
        return t.item()

    nb = len(sizes)
    for _ in range(cfg["warmup"]):
        step(nb, True)
    t_comm0 = statistics.median(step(0, True) for _ in range(3))
    # matrix products per step so the compute fills the target time, from a two-point fit
    # t = fixed + per_mm * k measured with all ranks computing at once (on a shared GPU they
    # contend as they will in the real step)
    target = cfg["compute_ms"] / 1e3 if cfg["compute_ms"] > 0 else cfg["ratio"] * t_comm0
    t1 = statistics.median(step(nb, False) for _ in range(3))
    t2 = statistics.median(step(4 * nb, False) for _ in range(3))
    per_mm = max((t2 - t1) / (3 * nb), 1e-7)
    k = int(agree(max(0.0, round((target - (t1 - per_mm * nb)) / per_mm))))
    ts: dict[str, list[float]] = {"compute": [], "comm": [], "step": []}
    for _ in range(cfg["steps"]):  # interleaved, so drift hits every mode alike
        ts["comm"].append(step(0, True))
        ts["compute"].append(step(k, False))
        ts["step"].append(step(k, True))
    # the result is still right: sum over ranks of (rank-seeded base) * 1, checked once
    step(k, True)
    check = torch.cat([g.reshape(-1)[:1000].cpu() for g in grads])
    ref = torch.cat([bb.reshape(-1)[:1000].cpu() for bb in bases])
    dist.all_reduce(ref, group=tgroup)
    ok = bool(torch.allclose(check, ref, rtol=1e-4, atol=1e-4))
    pg = dist.group.WORLD
    adapter = getattr(pg, "_adapters", {}).get(str(dev) if dev.type != "cpu" else "cpu")
    path = type(adapter).__name__ if adapter is not None else type(pg).__name__
    return {"times": ts, "k": k, "per_mm_s": per_mm, "t_comm_calib": t_comm0, "correct": ok,
            "path": path, "buckets": sizes}


def run_variant(name: str, args: argparse.Namespace, hosts: Hosts | None = None
                ) -> dict[str, Any]:
    backend, env = VARIANTS[name]
    cfg = {"device": args.device, "scale": args.scale, "steps": args.steps,
           "warmup": args.warmup, "compute_ms": args.compute_ms, "ratio": args.ratio,
           "matmul": args.matmul,
           "switch_interval": args.switch_interval}
    res = run_ranks(_rank, args.world, cfg, backend=backend, env=env, timeout=args.timeout,
                    pg_timeout_s=PG_TIMEOUT_S, hosts=hosts)[0]
    med = {k: statistics.median(v) for k, v in res["times"].items()}
    hidden = (med["compute"] + med["comm"] - med["step"]) / med["comm"]
    return {"variant": name, "backend": backend, "env": env, "path": res["path"],
            "t_compute_s": med["compute"], "t_comm_s": med["comm"], "t_step_s": med["step"],
            "hidden": hidden,
            "hidden_bound": hidden_bound(res["buckets"], med["compute"], med["comm"]),
            "compute_to_comm": med["compute"] / med["comm"], "matmuls_per_step": res["k"],
            "matmul_s": res["per_mm_s"], "correct": res["correct"],
            "samples": res["times"], "buckets": len(res["buckets"]),
            "grad_bytes": 4 * sum(res["buckets"])}


def write_png(path: str, rows: list[dict[str, Any]], title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    names = [r["variant"] for r in rows]
    x = range(len(rows))
    w = 0.25
    ax.bar([i - w for i in x], [r["t_compute_s"] for r in rows], w, label="T_compute")
    ax.bar(list(x), [r["t_comm_s"] for r in rows], w, label="T_comm")
    ax.bar([i + w for i in x], [r["t_step_s"] for r in rows], w, label="T_step (overlapped)")
    for i, r in enumerate(rows):
        top = max(r["t_compute_s"], r["t_comm_s"], r["t_step_s"])
        ax.text(i, top * 1.02, f"hidden {100 * r['hidden']:.0f}%", ha="center")
    ax.set_ylim(0, 1.25 * max(max(r["t_compute_s"], r["t_comm_s"], r["t_step_s"]) for r in rows))
    ax.set_xticks(list(x), names)
    ax.set_ylabel("seconds per step (median, slowest rank)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "mps"])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--scale", type=float, default=0.05,
                   help="fraction of the 113.5 M-parameter ViT gradients (1.0 = 454 MB)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--compute-ms", type=float, default=0.0,
                   help="compute per step; 0 = --ratio times each variant's T_comm")
    p.add_argument("--ratio", type=float, default=PAPER_RATIO,
                   help=f"compute : comm when calibrating (default {PAPER_RATIO}, the published "
                        "system's backward:comm at 4 hosts; 1.0 = the hardest case)")
    p.add_argument("--matmul", type=int, default=0, help="matrix size (0: 2048 cuda, 192 cpu)")
    p.add_argument("--switch-interval", type=float, default=0.0,
                   help="sys.setswitchinterval in the ranks (0 = Python's default, 5 ms)")
    p.add_argument("--cluster", action="store_true",
                   help="one rank per emulated host (python -m mccl.cluster's netns + tbf links)")
    p.add_argument("--rate", default="1gbit", help="link rate of --cluster (e.g. 1gbit)")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--json", default=None)
    p.add_argument("--png", default=None)
    p.add_argument("--replot", default=None, metavar="JSON",
                   help="only redraw --png from a results JSON of this script")
    args = p.parse_args(argv)
    if args.replot:
        doc = json.loads(Path(args.replot).read_text())
        rows = doc["rows"]
        title = (f"overlap: {doc['world']} ranks, {doc['device']} ({doc['device_name']}), "
                 f"{rows[0]['grad_bytes'] / 1e6:.0f} MB grads in {rows[0]['buckets']} buckets")
        return 0 if write_png(args.png or args.replot.replace(".json", ".png"), rows, title) else 1
    if not args.matmul:
        args.matmul = 2048 if args.device == "cuda" else 192
    import torch

    network: dict[str, Any] = {"mode": "loopback"}
    with contextlib.ExitStack() as stack:
        hosts = None
        if args.cluster:
            from mccl.bench.cluster import Cluster

            c = stack.enter_context(Cluster(args.world, args.rate))
            hosts = Hosts(tuple(c.hosts), c.addr(0), c.iface)
            network = {"mode": "cluster", **c.describe()}
        rows = []
        for name in [v.strip() for v in args.variants.split(",") if v.strip()]:
            r = run_variant(name, args, hosts)
            rows.append(r)
            print(f"{name:<13} T_compute {r['t_compute_s']:.3f}s  T_comm {r['t_comm_s']:.3f}s  "
                  f"T_step {r['t_step_s']:.3f}s  hidden {100 * r['hidden']:5.1f}% "
                  f"(bound {100 * r['hidden_bound']:5.1f}%)  "
                  f"[{r['path']}, {r['buckets']} buckets, {r['grad_bytes'] / 1e6:.1f} MB, "
                  f"{r['matmuls_per_step']} matmuls, correct={r['correct']}]", flush=True)
    where = (torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor()
             or platform.machine())
    doc = {"benchmark": "overlap", "command": shlex.join([sys.executable] + sys.argv),
           "argv": sys.argv[1:], "device": args.device, "device_name": where,
           "world": args.world, "scale": args.scale, "ratio": args.ratio, "network": network,
           "torch": torch.__version__,
           "cpus": os.cpu_count(), "platform": platform.platform(), "rows": rows,
           "loadavg_at_end": os.getloadavg() if hasattr(os, "getloadavg") else None,
           "note": ("on cpu and cuda the MCCL_UNIFIED_COLLECTIVE flag selects nothing: "
                    "cpu is zero-copy and cuda always stages; the flag matters on mps only")}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1))
    if args.png:
        title = (f"overlap: {args.world} ranks, {args.device} ({where}), "
                 f"{rows[0]['grad_bytes'] / 1e6:.0f} MB grads in {rows[0]['buckets']} buckets")
        write_png(args.png, rows, title)
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
