"""``python -m mccl.bench``: nccl-tests style benchmark of mccl vs gloo, locally or on a cluster.

With no flags: 4 local ranks on loopback, all_reduce, 1K..64M, every available backend
(mccl and gloo), no root needed. ``--cluster`` runs each rank in its own emulated host
(network namespace, tbf-shaped links; Linux + root). Every bandwidth is also shown as a
percentage of the measured single-stream TCP ceiling of one link.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from mccl.bench.ops import OPS, canonical_op
from mccl.bench.report import (
    annotate,
    format_size,
    format_table,
    new_document,
    parse_size,
    size_range,
    write_json,
    write_png,
)

DEFAULT_OPS = "all_reduce"
DEFAULT_MIN, DEFAULT_MAX, DEFAULT_FACTOR = "1K", "64M", 2.0
DEFAULT_WORLD_SIZES = "4"
DEFAULT_BACKENDS = ("mccl", "gloo")
DEFAULT_CEILING_S = 3.0
MAX_SIZE = 1 << 30


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mccl.bench",
        description="Collective benchmark (nccl-tests style) for torch.distributed backends.")
    p.add_argument("--ops", default=DEFAULT_OPS,
                   help=f"comma list or 'all' ({', '.join(OPS)}); default {DEFAULT_OPS}")
    p.add_argument("--sizes", default=None, help="comma list, e.g. 8,1K,1M,16M (overrides min/max)")
    p.add_argument("--min", default=DEFAULT_MIN, help=f"smallest size (default {DEFAULT_MIN})")
    p.add_argument("--max", default=DEFAULT_MAX, help=f"largest size (default {DEFAULT_MAX})")
    p.add_argument("--factor", type=float, default=DEFAULT_FACTOR, help="size step multiplier")
    p.add_argument("--world-sizes", default=DEFAULT_WORLD_SIZES, help="comma list, e.g. 2,4,8")
    p.add_argument("--backends", default=None,
                   help="comma list (default: mccl,gloo, whichever are available)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu", help="tensor device in the ranks (cpu, cuda, mps)")
    p.add_argument("--iters", type=int, default=20, help="timed iterations per size (max)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--time-budget", type=float, default=2.0,
                   help="seconds of timed iterations per size; fewer iters if slow (0 = off)")
    p.add_argument("--check", action="store_true", help="verify each op's result once per size")
    p.add_argument("--per-op-barrier", action="store_true",
                   help="time every op alone after a barrier (default: back-to-back runs of "
                        "short ops, as nccl-tests does, so barrier exit skew is not counted)")
    p.add_argument("--min-sample", type=float, default=0.05, metavar="SECONDS",
                   help="back-to-back ops per timed sample until it lasts this long (default "
                        "0.05; longer samples count each op's start and the barrier's exit "
                        "skew less, as nccl-tests' runs of 20 ops do)")
    p.add_argument("--queue", type=int, default=1, metavar="N",
                   help="issue N ops asynchronously back to back per timed call, on N buffer "
                        "sets, and wait for them all (DDP's bucket pattern: each op is queued "
                        "while the one before runs); times are per op (default 1: blocking "
                        "ops one after the other)")
    p.add_argument("--cluster", action="store_true",
                   help="run ranks in emulated hosts (Linux netns, root)")
    p.add_argument("--hosts", type=int, default=0, help="cluster hosts (default: max world size)")
    p.add_argument("--rate", default="1gbit", help="cluster link rate (e.g. 10gbit, none)")
    p.add_argument("--prefix", default="mccl", help="cluster namespace prefix")
    p.add_argument("--burst", type=parse_size, default=None, metavar="BYTES",
                   help="cluster tbf bucket, e.g. 128K (default: 1 ms at the rate, >= 128K; "
                        "a smaller bucket lets an idle link catch up less, as a switch port)")
    p.add_argument("--ceiling-seconds", type=float, default=DEFAULT_CEILING_S,
                   help="duration of the TCP ceiling measurement (0 = skip)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="stall allowance per size in seconds (on top of the expected time)")
    p.add_argument("--json", default=None, metavar="PATH", help="write results JSON here")
    p.add_argument("--png", default=None, metavar="PATH", help="write busbw plot here")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _sizes(args: argparse.Namespace) -> list[int]:
    if args.sizes:
        sizes = [parse_size(s) for s in _csv(args.sizes)]
    else:
        sizes = size_range(parse_size(args.min), parse_size(args.max), args.factor)
    if not sizes or min(sizes) <= 0 or max(sizes) > MAX_SIZE:
        raise ValueError(f"sizes must be in 1..{format_size(MAX_SIZE)}")
    return sizes


def _ops(text: str) -> list[str]:
    if text.strip().lower() == "all":
        return list(OPS)
    return list(dict.fromkeys(canonical_op(o) for o in _csv(text)))


class _Progress:
    """Progress lines on stderr as rows arrive (the table goes to stdout at the end)."""

    def __init__(self, ceiling_bps: float | None, quiet: bool) -> None:
        self.t0 = time.monotonic()
        self.ceiling = ceiling_bps
        self.quiet = quiet

    def __call__(self, ev: dict[str, Any]) -> None:
        kind = ev["event"]
        tag = f"[{time.monotonic() - self.t0:7.1f}s] {ev['backend']:<5} n={ev['world_size']}"
        if kind == "row" and not self.quiet:
            pct = (f" ({100 * ev['busbw_gbs'] * 1e9 / self.ceiling:5.1f}% of ceiling)"
                   if self.ceiling else "")
            bad = "  CHECK FAILED" if ev.get("check") is False else ""
            reps = f"*{ev['reps']}" if ev.get("reps", 1) > 1 else ""
            print(f"{tag} {ev['op']:<14} {format_size(ev['size']):>6}  "
                  f"{ev['time_us']:>11.1f} us  busbw {ev['busbw_gbs']:8.3f} GB/s{pct}"
                  f"  x{ev['iters']}{reps}{bad}", file=sys.stderr, flush=True)
        elif kind == "error":
            size = format_size(ev["size"]) if ev.get("size") else "-"
            print(f"{tag} {ev['op']:<14} {size:>6}  ERROR: {ev['error']}", file=sys.stderr,
                  flush=True)
            if ev.get("logs"):
                print(f"    rank logs: {ev['logs'][-600:]}", file=sys.stderr, flush=True)
        elif kind == "init" and not self.quiet:
            print(f"{tag} started", file=sys.stderr, flush=True)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry; exit 0 = all measured, 1 = some op failed, 2 = usage, 3 = no cluster."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        ops, sizes = _ops(args.ops), _sizes(args)
        worlds = [int(w) for w in _csv(args.world_sizes)]
        if not worlds or min(worlds) < 2:
            raise ValueError("world sizes must be >= 2")
        if args.queue < 1:
            raise ValueError(f"--queue must be at least 1, got {args.queue}")
        import torch

        if not isinstance(getattr(torch, args.dtype, None), torch.dtype):
            raise ValueError(f"unknown dtype {args.dtype!r} (e.g. float32, bfloat16, int32)")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from mccl.bench.runner import BenchConfig, available_backends

    avail = available_backends()
    if args.backends:
        backends = _csv(args.backends)
        missing = [b for b in backends if b not in avail]
        if missing:
            print(f"error: backend(s) {', '.join(missing)} not available here "
                  f"(available: {', '.join(avail) or 'none'})", file=sys.stderr)
            return 2
    else:
        backends = [b for b in DEFAULT_BACKENDS if b in avail]
        if "mccl" not in backends:
            print("warning: mccl backend not registered (import mccl failed or not built yet); "
                  "running gloo only", file=sys.stderr)
    cfg = BenchConfig(ops=ops, sizes=sizes, dtype=args.dtype, iters=args.iters,
                      warmup=args.warmup, time_budget=args.time_budget, check=args.check,
                      per_op_barrier=args.per_op_barrier, min_sample_s=args.min_sample,
                      queue=args.queue, device=args.device,
                      stall_timeout=args.timeout)
    doc = new_document(argv, {**asdict(cfg), "backends": backends, "world_sizes": worlds})
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return _run(args, cfg, backends, worlds, doc)
    except KeyboardInterrupt:
        print("interrupted; ranks killed, cluster removed", file=sys.stderr)
        if args.json:
            doc["interrupted"] = True
            write_json(args.json, doc)
        return 130


def _run(args: argparse.Namespace, cfg: Any, backends: list[str], worlds: list[int],
         doc: dict[str, Any]) -> int:
    from mccl.bench.ceiling import measure_ceiling
    from mccl.bench.cluster import Cluster, ClusterError, ClusterUnavailable
    from mccl.bench.runner import run_job

    t0 = time.monotonic()
    cluster = None
    if args.cluster:
        try:
            cluster = Cluster(args.hosts or max(worlds), args.rate, prefix=args.prefix,
                              burst=args.burst)
        except ValueError as exc:
            print(f"bad cluster setting: {exc}", file=sys.stderr)
            return 2
        try:
            cluster.up()
        except ClusterUnavailable as exc:
            print(f"cluster unavailable: {exc}", file=sys.stderr)
            return 3
        except ClusterError as exc:
            print(f"cluster bring-up failed: {exc}", file=sys.stderr)
            return 3
    try:
        doc["network"] = ({"mode": "cluster", **cluster.describe()} if cluster
                          else {"mode": "loopback"})
        ceiling = None
        if args.ceiling_seconds > 0:
            doc["ceiling"] = measure_ceiling(cluster, args.ceiling_seconds)
            ceiling = doc["ceiling"]["bytes_per_s"]
            where = f"cluster {args.rate}" if cluster else "loopback"
            print(f"ceiling ({where}, one TCP stream {doc['ceiling']['path']}): "
                  f"{ceiling / 1e9:.3f} GB/s", file=sys.stderr, flush=True)
        progress = _Progress(ceiling, args.quiet)
        for world in worlds:
            for backend in backends:
                if not args.quiet:
                    where = f"cluster ({args.rate})" if cluster else "loopback"
                    print(f"running {backend} world_size={world} on {where}", file=sys.stderr)
                job = run_job(backend, world, cfg, cluster, ceiling, progress)
                annotate(job.rows, ceiling)
                doc["rows"] += job.rows
                doc["errors"] += job.errors
                doc["jobs"].append({"backend": backend, "world_size": world,
                                    "wall_s": job.wall_s, "rows": len(job.rows),
                                    "errors": len(job.errors)})
                if args.json:  # keep partial results if a later job dies
                    write_json(args.json, doc)
    finally:
        if cluster is not None:
            cluster.down()
    doc["duration_s"] = time.monotonic() - t0
    print(format_table(doc["rows"], ceiling, backends))
    if doc["errors"]:
        print(f"\n{len(doc['errors'])} error(s):", file=sys.stderr)
        for e in doc["errors"]:
            print(f"  {e['backend']} n={e['world_size']} {e['op']} "
                  f"{format_size(e['size']) if e.get('size') else ''}: {e['error']}",
                  file=sys.stderr)
    if args.json:
        write_json(args.json, doc)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.png:
        net = (f"cluster {args.rate} x{cluster.n_hosts}" if cluster else "loopback")
        if write_png(args.png, doc["rows"], ceiling, f"mccl.bench on {net}"):
            print(f"wrote {args.png}", file=sys.stderr)
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
