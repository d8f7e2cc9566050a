"""Run a function on N local processes joined in a process group, with a hard timeout.

Every multi-rank test and the single-machine benchmarks (benchmarks/overlap.py, ddp_cuda.py)
go through ``run_ranks``, so a hang fails fast (the processes are killed and the error names
the ranks that did not finish) instead of eating CI time or a device call.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import random
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

DEFAULT_TIMEOUT_S = 90.0
#: Rendezvous ports tried inside emulated hosts (free_port() can only ask loopback here).
HOST_PORTS = (20000, 30000)
#: Loopback rendezvous ports come from below the kernels' ephemeral ranges (Linux 32768-60999,
#: macOS 49152-65535): a port the kernel handed out as free could be handed out again, to
#: another test's listener or outgoing connection, before the store binds it (seen with
#: tests run in parallel: EADDRINUSE).
LOOPBACK_PORTS = (20000, 32000)
#: Random ports tried before falling back to one the kernel picks.
PORT_TRIES = 50
#: What a fork server imports once for all the ranks it starts (see ``start_ranks_by_fork``).
PRELOAD = ("numpy", "torch", "torch.distributed", "mccl")

#: How ranks start: "spawn" imports torch afresh in every rank, seconds each on a small
#: machine; ``start_ranks_by_fork`` switches to a fork server.
_context = mp.get_context("spawn")


class RanksFailed(AssertionError):
    """Ranks raised or did not finish in time. An AssertionError, so that in a test it reads
    as the test's failure."""


@dataclass(frozen=True)
class Hosts:
    """Emulated hosts for the ranks (rank r joins namespace ``netns[r % len]``), as
    ``mccl.bench.cluster.Cluster`` makes them: rank 0's address and the interface to use."""

    netns: tuple[str, ...]
    master: str
    iface: str


def free_port() -> int:
    """A loopback port nothing listens on now, from ``LOOPBACK_PORTS`` where one is free."""
    for _ in range(PORT_TRIES):
        port = random.randint(*LOOPBACK_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_ranks_by_fork(preload: tuple[str, ...] = PRELOAD) -> None:
    """Start later ranks by forking a server that imported ``preload`` once (a tenth of a
    second per run instead of seconds: the test suite does this). A rank still gets the
    caller's environment as it is when ``run_ranks`` is called, not the server's."""
    global _context
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))
    _context = ctx


def _child(fn, rank: int, world: int, port: int, backend: str, env: dict, pg_timeout_s: float,
           init: bool, args: tuple, q, hosts: Hosts | None = None) -> None:
    os.environ.clear()
    os.environ.update(env)
    master = "127.0.0.1"
    try:
        if hosts is not None:
            from mccl.bench.cluster import enter_netns

            enter_netns(hosts.netns[rank % len(hosts.netns)])
            master = hosts.master
            os.environ.update(MCCL_SOCKET_IFNAME=hosts.iface, GLOO_SOCKET_IFNAME=hosts.iface)
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        import mccl  # noqa: F401 - registers the backend

        if init:
            dist.init_process_group(backend, init_method=f"tcp://{master}:{port}", rank=rank,
                                    world_size=world, timeout=timedelta(seconds=pg_timeout_s))
        result = fn(rank, world, *args)
        if init and dist.is_initialized():
            dist.destroy_process_group()
        q.put((rank, True, result))
    except BaseException:  # noqa: BLE001 - report every failure to the parent
        q.put((rank, False, traceback.format_exc()))


def run_ranks(fn: Callable[..., Any], world: int, *args: Any, backend: str = "mccl",
              timeout: float = DEFAULT_TIMEOUT_S, env: dict | None = None,
              pg_timeout_s: float = 60.0, init: bool = True,
              allow_fail: bool = False, expect_missing: tuple[int, ...] = (),
              hosts: Hosts | None = None) -> list[Any]:
    """Run ``fn(rank, world, *args)`` in ``world`` spawned processes; return results by rank.

    Raises RanksFailed naming the backend, with the failing ranks' tracebacks, or if any
    rank does not finish within ``timeout`` seconds (all processes are killed first). With
    ``allow_fail`` a rank's traceback text is returned in its slot instead of raising. Ranks
    in ``expect_missing`` (a test kills or stops them) are not waited for once the others
    reported; their slot is None and they are killed at the end. With ``hosts`` every rank
    runs in an emulated host (its network namespace) instead of on loopback.
    """
    ctx = _context
    q = ctx.Queue()
    port = free_port() if hosts is None else random.randint(*HOST_PORTS)
    procs = [ctx.Process(target=_child, daemon=True,
                         args=(fn, r, world, port, backend, {**os.environ, **(env or {})},
                               pg_timeout_s, init, args, q,
                               hosts))
             for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, tuple[bool, Any]] = {}
    deadline = time.monotonic() + timeout
    wanted = set(range(world)) - set(expect_missing)
    try:
        while not wanted <= set(results):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                rank, ok, value = q.get(timeout=min(left, 1.0))
            except queue.Empty:
                if all(not p.is_alive() for p in procs) and q.empty():
                    break
                continue
            results[rank] = (ok, value)
    finally:
        # (a rank that died without a result, e.g. by os._exit or a signal, is told apart
        # from one that timed out)
        exited = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode is not None}
        for r in expect_missing:
            procs[r].kill()
        for p in procs:
            p.join(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    missing = sorted(wanted - set(results))
    if missing:
        detail = "\n".join(f"rank {r}: {v}" for r, (ok, v) in results.items() if not ok)
        died = {r: exited[r] for r in missing if r in exited}
        late = [r for r in missing if r not in died]
        why = "; ".join(
            ([f"ranks {late} did not finish within {timeout:.0f}s"] if late else [])
            + [f"rank {r} exited with code {code} without a result" for r, code in died.items()])
        raise RanksFailed(f"{backend}: {why}\n{detail}")
    failed = {r: v for r, (ok, v) in results.items() if not ok}
    if failed and not allow_fail:
        raise RanksFailed(f"{backend} failed:\n" + "\n".join(
            f"--- rank {r} ---\n{v}" for r, v in sorted(failed.items())))
    return [results[r][1] if r in results else None for r in range(world)]
