"""``python -m mccl.bench``: nccl-tests style benchmark of mccl vs gloo, locally or on a cluster.

With no flags: 4 local ranks on loopback, all_reduce, 1K..64M, every available backend
(mccl and gloo), no root needed; the table goes to stdout, the results to mccl-bench.json
and mccl-bench.png in the current folder (``--json``/``--png`` elsewhere, or ``none``).
``--cluster`` runs each rank in its own emulated host (network namespace, tbf-shaped links;
Linux + root). Every bandwidth is also shown as a percentage of the measured single-stream
TCP ceiling of one link.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mccl.bench.cli import (
    INTERRUPTED,
    CliError,
    add_rx_steering,
    at_least,
    check_backends,
    check_device,
    csv_items,
    int_items,
    interrupt_on_sigterm,
    local_ranks_limit,
    report,
    start_cluster,
    steering,
)
from mccl.bench.cluster import DEFAULT_PREFIX, DEFAULT_RATE
from mccl.bench.ops import OPS, canonical_op
from mccl.bench.report import (
    annotate,
    check_plot_path,
    format_size,
    format_table,
    new_document,
    parse_size,
    plural,
    prepare_output,
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
MAX_SIZES = 200  # sizes per op: each takes seconds; a factor barely above 1 makes millions
#: Result files of a run, in the current folder unless given ('none' skips one).
DEFAULT_JSON, DEFAULT_PNG = "mccl-bench.json", "mccl-bench.png"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mccl.bench",
        description="Collective benchmark (nccl-tests style) for torch.distributed backends.")
    p.add_argument("--ops", default=DEFAULT_OPS,
                   help=f"comma list or 'all' ({', '.join(OPS)}); default {DEFAULT_OPS}")
    p.add_argument("--sizes", default=None, help="comma list, e.g. 8,1K,1M,16M (overrides min/max)")
    p.add_argument("--min", default=DEFAULT_MIN, help=f"smallest size (default {DEFAULT_MIN})")
    p.add_argument("--max", default=DEFAULT_MAX, help=f"largest size (default {DEFAULT_MAX})")
    p.add_argument("--factor", type=at_least(1.0, float, strict=True), default=DEFAULT_FACTOR,
                   help="size step multiplier (> 1)")
    p.add_argument("--world-sizes", default=DEFAULT_WORLD_SIZES, help="comma list, e.g. 2,4,8")
    p.add_argument("--backends", default=None,
                   help="comma list (default: mccl,gloo, whichever are available)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu", help="tensor device in the ranks (cpu, cuda, mps)")
    p.add_argument("--iters", type=at_least(1), default=20,
                   help="timed iterations per size (max)")
    p.add_argument("--warmup", type=at_least(0), default=3)
    p.add_argument("--time-budget", type=at_least(0.0, float), default=2.0,
                   help="seconds of timed iterations per size; fewer iters if slow (0 = off)")
    p.add_argument("--check", action="store_true", help="verify each op's result once per size")
    p.add_argument("--per-op-barrier", action="store_true",
                   help="time every op alone after a barrier (default: back-to-back runs of "
                        "short ops, as nccl-tests does, so barrier exit skew is not counted)")
    p.add_argument("--min-sample", type=at_least(0.0, float), default=0.05, metavar="SECONDS",
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
    p.add_argument("--hosts", type=at_least(0), default=0,
                   help="cluster hosts (default: max world size)")
    p.add_argument("--rate", default=None,
                   help=f"cluster link rate (e.g. 10gbit, none; default {DEFAULT_RATE})")
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help="cluster namespace prefix")
    p.add_argument("--burst", type=parse_size, default=None, metavar="BYTES",
                   help="cluster tbf bucket, e.g. 128K (default: 1 ms at the rate, >= 128K; "
                        "a smaller bucket lets an idle link catch up less, as a switch port)")
    p.add_argument("--cc", default=None, metavar="NAME",
                   help="TCP congestion control of the cluster's hosts, e.g. cubic (default: "
                        "this machine's; every backend and the ceiling use it)")
    add_rx_steering(p)
    p.add_argument("--ceiling-seconds", type=at_least(0.0, float), default=DEFAULT_CEILING_S,
                   help="duration of the TCP ceiling measurement (0 = skip)")
    p.add_argument("--timeout", type=at_least(0.0, float, strict=True), default=60.0,
                   help="stall allowance per size in seconds (on top of the expected time)")
    p.add_argument("--json", default=DEFAULT_JSON, metavar="PATH",
                   help=f"write results JSON here (default {DEFAULT_JSON}; 'none': do not)")
    p.add_argument("--png", default=DEFAULT_PNG, metavar="PATH",
                   help=f"write the busbw plot here (default {DEFAULT_PNG}; 'none': do not)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _sizes(args: argparse.Namespace) -> list[int]:
    if args.sizes is not None:
        sizes = list(dict.fromkeys(parse_size(s) for s in csv_items(args.sizes, "--sizes")))
    else:
        sizes = size_range(parse_size(args.min), parse_size(args.max), args.factor, MAX_SIZES)
    bad = [s for s in sizes if not 0 < s <= MAX_SIZE]
    if bad:
        raise ValueError(f"size {bad[0]} B is out of range: sizes must be in "
                         f"1..{format_size(MAX_SIZE)}")
    if len(sizes) > MAX_SIZES:
        raise ValueError(f"{len(sizes)} sizes, over the limit of {MAX_SIZES}")
    return sizes


def _ops(text: str) -> list[str]:
    if text.strip().lower() == "all":
        return list(OPS)
    return list(dict.fromkeys(canonical_op(o) for o in csv_items(text, "--ops")))


class _Progress:
    """Progress lines on stderr as rows arrive (the table goes to stdout at the end)."""

    def __init__(self, ceiling_bps: float | None, quiet: bool) -> None:
        self.t0 = time.monotonic()
        self.ceiling = ceiling_bps
        self.quiet = quiet
        self.notes: list[str] = []  # each said once, though every backend's job finds it

    def __call__(self, ev: dict[str, Any]) -> None:
        kind = ev["event"]
        tag = f"[{time.monotonic() - self.t0:7.1f}s] {ev['backend']:<5} n={ev['world_size']}"
        if kind == "row" and not self.quiet:
            pct = (f" ({100 * ev['busbw_gbs'] * 1e9 / self.ceiling:5.1f}% of ceiling)"
                   if self.ceiling else "")
            bad = "  CHECK FAILED" if ev.get("check") is False else ""
            reps = f"*{ev['reps']}" if ev.get("reps", 1) > 1 else ""
            cpu = f"  cpu {ev['cpu_cores']:.2f} cores/rank" if "cpu_cores" in ev else ""
            print(f"{tag} {ev['op']:<14} {format_size(ev['size']):>6}  "
                  f"{ev['time_us']:>11.1f} us  busbw {ev['busbw_gbs']:8.3f} GB/s{pct}"
                  f"  x{ev['iters']}{reps}{cpu}{bad}", file=sys.stderr, flush=True)
        elif kind == "error":
            size = format_size(ev["size"]) if ev.get("size") else "-"
            print(f"{tag} {ev['op']:<14} {size:>6}  ERROR: {ev['error']}", file=sys.stderr,
                  flush=True)
            if ev.get("logs"):
                print(f"    rank logs: {ev['logs'][-600:]}", file=sys.stderr, flush=True)
        elif kind == "init" and not self.quiet:
            print(f"{tag} started", file=sys.stderr, flush=True)
        elif kind == "note" and ev["note"] not in self.notes:
            self.notes.append(ev["note"])
            print(f"note: {ev['note']}", file=sys.stderr, flush=True)



def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry; exit 0 = all measured, 1 = some op failed, 2 = usage, 3 = no cluster,
    130 = interrupted (Ctrl-C or SIGTERM; what was measured is still reported)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        interrupt_on_sigterm()
        args = build_parser().parse_args(argv)
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                            format="%(levelname)s %(name)s: %(message)s")
        try:
            ops, sizes, worlds, backends = _plan(args)
        except CliError as exc:
            return report(exc)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    except KeyboardInterrupt:  # before anything started: nothing to clean up or report
        print("interrupted", file=sys.stderr)
        return INTERRUPTED
    from mccl.bench.runner import BenchConfig

    cfg = BenchConfig(ops=ops, sizes=sizes, dtype=args.dtype, iters=args.iters,
                      warmup=args.warmup, time_budget=args.time_budget, check=args.check,
                      per_op_barrier=args.per_op_barrier, min_sample_s=args.min_sample,
                      queue=args.queue, device=args.device,
                      stall_timeout=args.timeout)
    doc = new_document(argv, {**asdict(cfg), "backends": backends, "world_sizes": worlds})
    return _run(args, cfg, backends, worlds, doc)


#: Options that only shape the emulated cluster (an error without ``--cluster``).
CLUSTER_FLAGS = ("--hosts", "--rate", "--burst", "--cc", "--prefix", "--rx-steering")


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _plan(args: argparse.Namespace) -> tuple[list[str], list[int], list[int], list[str]]:
    """Every check that can fail before a rank starts: (ops, sizes, world sizes, backends).
    Raises CliError or ValueError with one line."""
    ops, sizes = _ops(args.ops), _sizes(args)
    worlds = int_items(args.world_sizes, "--world-sizes", minimum=2,
                       maximum=local_ranks_limit())
    if args.queue < 1:
        raise ValueError(f"--queue must be at least 1, got {args.queue}")
    if args.cluster and args.hosts == 1:
        raise ValueError("--hosts must be at least 2 with --cluster (the ceiling is measured "
                         "over the link between two hosts), got 1")
    for flag in ("--json", "--png"):
        if str(getattr(args, _dest(flag))).lower() in ("", "none"):
            setattr(args, _dest(flag), None)
    if not args.cluster:  # else a loopback run would pass for one on shaped links
        unset = build_parser().parse_args([])  # the parser's own defaults
        shaping = [flag for flag in CLUSTER_FLAGS
                   if getattr(args, _dest(flag)) != getattr(unset, _dest(flag))]
        if shaping:
            raise ValueError(f"{', '.join(shaping)} set(s) up the emulated cluster, which runs "
                             "only with --cluster (without it the ranks use loopback)")
    args.rate = args.rate or DEFAULT_RATE
    if args.png is not None:
        check_plot_path(args.png, "--png")
        if args.json is not None and Path(args.json).resolve() == Path(args.png).resolve():
            raise ValueError(f"--json and --png name the same file ({args.png})")
    for flag, path in (("--json", args.json), ("--png", args.png)):
        if path is not None:
            prepare_output(path, flag)
    import torch

    if not isinstance(getattr(torch, args.dtype, None), torch.dtype):
        raise ValueError(f"unknown dtype {args.dtype!r} (e.g. float32, bfloat16, int32)")
    check_device(args.device)
    if args.backends is not None:
        backends = csv_items(args.backends, "--backends")
        check_backends(backends, "--backends")
    else:
        from mccl.bench.runner import available_backends

        avail = available_backends()
        backends = [b for b in DEFAULT_BACKENDS if b in avail]
        if "mccl" not in backends:
            print("warning: mccl backend not registered (import mccl failed or not built yet); "
                  "running gloo only", file=sys.stderr)
    return ops, sizes, worlds, backends


def _run(args: argparse.Namespace, cfg: Any, backends: list[str], worlds: list[int],
         doc: dict[str, Any]) -> int:
    """Measure every (world size, backend) job, then report; an interrupt stops the
    measuring but still reports (and writes) what was measured."""
    from mccl.bench.ceiling import measure_ceiling
    from mccl.bench.runner import JobResult, run_job

    t0 = time.monotonic()
    cluster = None
    ceiling = None
    try:
        if args.cluster:
            cluster = start_cluster(args.hosts or max(worlds), args.rate, args.prefix,
                                    args.burst, args.cc, steering(args.rx_steering))
        doc["network"] = ({"mode": "cluster", **cluster.describe()} if cluster
                          else {"mode": "loopback"})
        if cluster is not None and cluster.n_hosts < max(worlds):
            note = (f"world size {max(worlds)} on {cluster.n_hosts} hosts: rank r runs on "
                    f"host r % {cluster.n_hosts}, so ranks share hosts and their links")
            doc["notes"].append(note)
            print(f"note: {note}", file=sys.stderr, flush=True)
        if args.ceiling_seconds > 0:
            try:
                doc["ceiling"] = measure_ceiling(cluster, args.ceiling_seconds)
            except (RuntimeError, OSError) as exc:
                raise CliError(f"error: the TCP ceiling could not be measured: {exc}", 1
                               ) from None
            ceiling = doc["ceiling"]["bytes_per_s"]
            where = f"cluster {args.rate}" if cluster else "loopback"
            print(f"ceiling ({where}, one TCP stream {doc['ceiling']['path']}): "
                  f"{ceiling / 1e9:.3f} GB/s", file=sys.stderr, flush=True)
        progress = _Progress(ceiling, args.quiet)
        for world in worlds:
            for backend in backends:
                if not args.quiet:
                    net = doc["network"]
                    cc = net.get("cc") or "tcp"
                    if backend == "mccl" and net.get("mccl_cc", cc) != cc:
                        cc = f"{cc}, data sockets {net['mccl_cc']}"
                    where = f"cluster ({args.rate}, {cc})" if cluster else "loopback"
                    print(f"running {backend} world_size={world} on {where}", file=sys.stderr)
                job = JobResult(backend, world)
                try:
                    run_job(backend, world, cfg, cluster, ceiling, progress, result=job)
                finally:  # an interrupted job's rows so far count too
                    _add_job(doc, job, ceiling)
                if args.json:  # keep partial results if a later job dies
                    write_json(args.json, doc)
    except CliError as exc:  # the cluster did not come up: nothing was measured
        return report(exc)
    except KeyboardInterrupt:
        doc["interrupted"] = True
    finally:
        if cluster is not None:
            cluster.down()
    if doc.get("interrupted"):
        print("interrupted; ranks killed" + (", cluster removed" if cluster else "")
              + (f"; reporting the {len(doc['rows'])} row(s) measured" if doc["rows"] else ""),
              file=sys.stderr)
    doc["duration_s"] = time.monotonic() - t0
    status = _report(args, doc, ceiling, backends, cluster)
    return INTERRUPTED if doc.get("interrupted") else status


def _add_job(doc: dict[str, Any], job: Any, ceiling: float | None) -> None:
    annotate(job.rows, ceiling)
    doc["rows"] += job.rows
    doc["errors"] += job.errors
    doc["notes"] += [n for n in job.notes if n not in doc["notes"]]
    doc["jobs"].append({"backend": job.backend, "world_size": job.world_size,
                        "wall_s": job.wall_s, "rows": len(job.rows),
                        "errors": len(job.errors)})


def _report(args: argparse.Namespace, doc: dict[str, Any], ceiling: float | None,
            backends: list[str], cluster: Any) -> int:
    """Table on stdout, errors on stderr, JSON and PNG; 1 if anything failed."""
    if doc["rows"]:
        print(format_table(doc["rows"], ceiling, backends))
    failed = [e for e in doc["errors"] if not e.get("skipped")]
    if doc["errors"]:
        n_skipped = len(doc["errors"]) - len(failed)
        print(f"\n{len(failed)} error(s)"
              + (f", {plural(n_skipped, 'size')} skipped after them" if n_skipped else "") + ":",
              file=sys.stderr)
        for e in failed:
            print(f"  {e['backend']} n={e['world_size']} {e['op']} "
                  f"{format_size(e['size']) if e.get('size') else ''}: {e['error']}",
                  file=sys.stderr)
        skipped: dict[tuple[str, int, str, str], list[int]] = {}
        for e in doc["errors"]:
            if e.get("skipped"):
                key = (e["backend"], e["world_size"], e["op"], e["error"])
                skipped.setdefault(key, []).append(e["size"])
        for (backend, world, op, why), sizes in skipped.items():
            print(f"  {backend} n={world} {op} {', '.join(format_size(s) for s in sizes)}: "
                  f"{why}", file=sys.stderr)
    status = 1 if doc["errors"] else 0
    try:
        if args.json:
            write_json(args.json, doc)
            print(f"wrote {args.json}", file=sys.stderr)
        if args.png and doc["rows"]:
            net = f"cluster {args.rate} x{cluster.n_hosts}" if cluster else "loopback"
            written = write_png(args.png, doc["rows"], ceiling, f"mccl.bench on {net}")
            if written is not None:
                print(f"wrote {written}", file=sys.stderr)
    except OSError as exc:  # checked up front; this is the path changing under the run
        print(f"error: cannot write results: {exc}", file=sys.stderr)
        status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())
