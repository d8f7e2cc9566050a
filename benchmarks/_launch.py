"""Spawn N local ranks for a benchmark, with a hard deadline (shared by the benchmarks here)."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child(fn: Callable[..., Any], rank: int, world: int, port: int, backend: str,
           env: dict[str, str], args: tuple, q: Any) -> None:
    os.environ.update(env)
    try:
        import torch.distributed as dist

        import mccl  # noqa: F401 - registers the backend

        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=300))
        result = fn(rank, world, *args)
        dist.destroy_process_group()
        q.put((rank, True, result))
    except BaseException:  # noqa: BLE001 - the parent reports it
        q.put((rank, False, traceback.format_exc()))


def launch(fn: Callable[..., Any], world: int, backend: str, *args: Any,
           env: dict[str, str] | None = None, timeout: float = 600.0) -> list[Any]:
    """Run ``fn(rank, world, *args)`` in ``world`` spawned processes; results by rank."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(fn, r, world, port, backend, env or {}, args, q),
                         daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, tuple[bool, Any]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world and time.monotonic() < deadline:
            try:
                rank, ok, value = q.get(timeout=1.0)
            except queue.Empty:
                if all(not p.is_alive() for p in procs) and q.empty():
                    break
                continue
            results[rank] = (ok, value)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    bad = {r: v for r, (ok, v) in results.items() if not ok}
    missing = sorted(set(range(world)) - set(results))
    if bad or missing:
        detail = "\n".join(f"--- rank {r} ---\n{v}" for r, v in sorted(bad.items()))
        raise RuntimeError(f"{backend}: ranks {missing} did not finish\n{detail}" if missing
                           else f"{backend} failed:\n{detail}")
    return [results[r][1] for r in range(world)]
