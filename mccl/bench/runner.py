"""Launch benchmark ranks (locally or inside emulated hosts) and supervise them with deadlines.

Why: a backend under development can hang or crash; the benchmark must still finish and say
where. Each rank is its own process session; rank 0 streams JSON events (worker.EVENT_PREFIX).
Every (op, size) gets a deadline scaled by the bytes it moves over the measured ceiling; on a
stall or crash the whole rank set is killed, the op is reported as failed, and the run is
relaunched for the remaining ops.
"""

from __future__ import annotations

import json
import logging
import os
import random
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mccl.bench.cluster import kill_tree
from mccl.bench.worker import EVENT_PREFIX

if TYPE_CHECKING:
    from mccl.bench.cluster import Cluster

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]  # directory that contains the mccl package
STARTUP_TIMEOUT_S = 90.0  # python + torch import + rendezvous for every rank on a small box
STALL_BASE_S = 60.0  # floor of every per-(op, size) deadline
SLOWDOWN_ALLOWANCE = 20.0  # deadline tolerates this many times the ideal transfer time
EXIT_TIMEOUT_S = 30.0  # after "done", for ranks to tear down
CRASH_GRACE_S = 0.2  # after a rank died, for rank 0's last lines to arrive
LOG_TAIL_LINES = 8
CLUSTER_PORT_RANGE = (20000, 30000)
LOOPBACK = "127.0.0.1"
LOOPBACK_IFNAME = "lo0" if sys.platform == "darwin" else "lo"


@dataclass
class BenchConfig:
    """What every rank runs (serialised to the worker as JSON)."""

    ops: list[str]
    sizes: list[int]
    dtype: str = "float32"
    iters: int = 20
    warmup: int = 3
    time_budget: float = 2.0  # seconds of timed iterations per (op, size); 0 = always iters
    check: bool = False
    per_op_barrier: bool = False  # one op per timed sample (else back-to-back runs, see worker)
    min_sample_s: float = 0.05  # back-to-back ops per sample until it lasts this long (worker)
    queue: int = 1  # ops issued asynchronously back to back per timed call (ops.make_case)
    device: str = "cpu"
    op_timeout: float = 120.0  # torch.distributed timeout inside ranks
    stall_timeout: float = STALL_BASE_S
    threads: int = 0  # torch threads per rank; 0 = cores / ranks

    def for_worker(self, backend: str, world: int) -> dict[str, Any]:
        cfg = asdict(self)
        cfg.update(backend=backend,
                   threads=self.threads or max(1, (os.cpu_count() or 1) // world))
        return cfg


@dataclass
class JobResult:
    """Rows and errors of one (backend, world size) run."""

    backend: str
    world_size: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. sizes measured as one buffer
    wall_s: float = 0.0


def available_backends() -> list[str]:
    """Backends torch.distributed can create here (mccl once its package registers it)."""
    import torch.distributed as dist

    out = []
    try:
        import mccl  # noqa: F401  (registers "mccl" once mccl/__init__.py does so)
    except Exception as exc:  # a half-written backend must not break the benchmark
        log.warning("import mccl failed: %s", exc)
    if "mccl" in dist.Backend.backend_list:
        out.append("mccl")
    if dist.is_gloo_available():
        out.append("gloo")
    return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _ideal_seconds(op: str, size: int, ceiling_bps: float | None) -> float:
    """Rough lower bound of one iteration: ~2x size over the ceiling (all_reduce worst case)."""
    return 2.0 * size / max(ceiling_bps or 1e8, 1e6)


def _tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return " | ".join(ln.strip() for ln in lines[-n:] if ln.strip())


class _Ranks:
    """A started set of rank processes with their log files."""

    def __init__(self, backend: str, world: int, cfg: BenchConfig, ops: Sequence[str],
                 by_op: dict[str, list[int]], cluster: Cluster | None, logdir: Path) -> None:
        self.procs: list[subprocess.Popen[Any]] = []
        self.logs: list[Path] = []
        wcfg = cfg.for_worker(backend, world)
        wcfg["ops"] = list(ops)
        wcfg["sizes_by_op"] = {op: by_op[op] for op in ops}
        if cluster is not None:
            master, port = cluster.addr(0), random.randint(*CLUSTER_PORT_RANGE)
        else:
            master, port = LOOPBACK, free_port()
        pypath = os.environ.get("PYTHONPATH", "")
        base_env = dict(os.environ, MASTER_ADDR=master, MASTER_PORT=str(port),
                        WORLD_SIZE=str(world), OMP_NUM_THREADS=str(wcfg["threads"]),
                        PYTHONPATH=str(REPO_ROOT) + (os.pathsep + pypath if pypath else ""),
                        GLOO_SOCKET_IFNAME=cluster.iface if cluster else LOOPBACK_IFNAME)
        if cluster is not None:
            base_env["MCCL_SOCKET_IFNAME"] = cluster.iface
        argv = [sys.executable, "-m", "mccl.bench.worker", "--config", json.dumps(wcfg)]
        try:
            hosts = cluster.n_hosts if cluster is not None else 1
            for rank in range(world):  # rank r runs on host r % hosts
                per_host = len(range(rank % hosts, world, hosts))
                env = dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank // hosts),
                           LOCAL_WORLD_SIZE=str(per_host))
                logf = logdir / f"{backend}-n{world}-rank{rank}-{len(list(logdir.iterdir()))}.log"
                self.logs.append(logf)
                with open(logf, "wb") as errf:
                    stdout = subprocess.PIPE if rank == 0 else errf
                    kw: dict[str, Any] = dict(stdout=stdout, stderr=errf, cwd=str(REPO_ROOT))
                    if cluster is not None:
                        proc = cluster.popen(rank % cluster.n_hosts, argv, env=env, **kw)
                    else:
                        proc = subprocess.Popen(argv, env=env, start_new_session=True, **kw)
                self.procs.append(proc)
        except BaseException:
            self.kill()
            raise

    def kill(self) -> None:
        for proc in self.procs:
            kill_tree(proc)
        for proc in self.procs:
            if proc.stdout:
                proc.stdout.close()

    def crashed(self) -> str | None:
        """'rank 1 exited with code 3' for every rank that exited non-zero, or None."""
        bad = [(r, p.poll()) for r, p in enumerate(self.procs) if p.poll() not in (None, 0)]
        if not bad:
            return None
        return ", ".join(f"rank {r} exited with code {rc}" for r, rc in bad)

    def logs_tail(self) -> str:
        parts = [f"rank{r}: {t}" for r, p in enumerate(self.logs) if (t := _tail(p))]
        return " || ".join(parts)


def distinct_sizes(cfg: BenchConfig, world: int) -> tuple[dict[str, list[int]], list[str]]:
    """The requested sizes each op measures at this world size: one per distinct buffer, as
    sizes round down to whole elements (chunked ops: to world-many), so 1B, 7B and 8B are
    one 12-byte all_gather at 3 ranks; and a note for every op where sizes merged. Measuring
    each would give rows of one size with different times, of which a table shows one."""
    import torch

    from mccl.bench.ops import element_count, element_size
    from mccl.bench.report import format_size

    elem = element_size(getattr(torch, cfg.dtype))
    by_op: dict[str, list[int]] = {}
    notes = []
    for op in cfg.ops:
        buffers: dict[int, list[int]] = {}
        for size in cfg.sizes:
            buffers.setdefault(element_count(op, size, world, elem) * elem, []).append(size)
        by_op[op] = [same[0] for same in buffers.values()]
        merged = [f"{', '.join(format_size(s) for s in same)} -> {format_size(nbytes)}"
                  for nbytes, same in buffers.items() if len(same) > 1]
        if merged:
            notes.append(f"{op} n={world} {cfg.dtype}: sizes that are one buffer are measured "
                         f"once ({'; '.join(merged)})")
    return by_op, notes


def run_job(backend: str, world: int, cfg: BenchConfig, cluster: Cluster | None = None,
            ceiling_bps: float | None = None,
            on_event: Callable[[dict[str, Any]], None] | None = None,
            result: JobResult | None = None) -> JobResult:
    """Run every op x size of cfg for one backend at one world size, under deadlines.

    ``result``: filled in as rows arrive, so a caller interrupted half way keeps them. Sizes
    an error left unmeasured are recorded as errors marked ``skipped``."""
    t0 = time.monotonic()
    result = result if result is not None else JobResult(backend, world)
    by_op, result.notes = distinct_sizes(cfg, world)
    if on_event:
        for note in result.notes:
            on_event({"event": "note", "note": note, "backend": backend, "world_size": world})
    remaining = list(cfg.ops)
    try:
        with tempfile.TemporaryDirectory(prefix="mccl-bench-") as tmp:
            for _ in range(len(cfg.ops)):  # at most one relaunch per failed op
                remaining = _run_once(backend, world, cfg, by_op, remaining, cluster,
                                      ceiling_bps, result, Path(tmp), on_event)
                if not remaining:
                    break
        _record_skipped(result, by_op)
    finally:
        result.wall_s = time.monotonic() - t0
    return result


def _record_skipped(result: JobResult, by_op: dict[str, list[int]]) -> None:
    """An error ends an op (and a failed launch the ops after it): record each size it left
    unmeasured, naming the error, instead of letting those sizes vanish from the report."""
    from mccl.bench.report import format_size

    failures = list(result.errors)
    if not failures:
        return
    for op, sizes in by_op.items():
        measured = {r.get("requested_size", r["size"]) for r in result.rows if r["op"] == op}
        own = [e for e in failures if e["op"] == op]
        cause = (own or failures)[0]
        where = f" at {format_size(cause['size'])}" if cause.get("size") else ""
        why = (f"skipped after the error{where}" if cause["op"] == op
               else f"skipped after the error in {cause['op']}{where}")
        failed = {e.get("size") for e in own}
        for size in sizes:
            if size not in measured and size not in failed:
                result.errors.append({"backend": result.backend, "world_size": result.world_size,
                                      "op": op, "size": size, "error": why, "skipped": True})


def _run_once(backend: str, world: int, cfg: BenchConfig, by_op: dict[str, list[int]],
              ops: list[str], cluster: Cluster | None, ceiling_bps: float | None,
              result: JobResult, logdir: Path,
              on_event: Callable[[dict[str, Any]], None] | None) -> list[str]:
    """One launch of the ranks for `ops` (each at its sizes in `by_op`); returns the ops
    still to run after a failure."""
    ranks = _Ranks(backend, world, cfg, ops, by_op, cluster, logdir)
    current: tuple[str, int] | None = None
    last_op: str | None = None
    limit = STARTUP_TIMEOUT_S
    deadline = time.monotonic() + limit
    done = False
    buf = b""
    sel = selectors.DefaultSelector()
    stdout = ranks.procs[0].stdout
    assert stdout is not None
    os.set_blocking(stdout.fileno(), False)
    sel.register(stdout, selectors.EVENT_READ)

    def fail(reason: str) -> list[str]:
        ranks.kill()
        if current is not None:
            where, op, size = f"{current[0]} size {current[1]}", current[0], current[1]
        else:
            where = "startup" if last_op is None else f"after {last_op}"
            op, size = (ops[0] if last_op is None else last_op), None
        err = {"backend": backend, "world_size": world, "op": op, "size": size,
               "error": f"{reason} ({where})", "logs": ranks.logs_tail()}
        result.errors.append(err)
        if on_event:
            on_event({"event": "error", **err})
        if current is None:  # startup or between ops: relaunching would not help
            return []
        return ops[ops.index(current[0]) + 1:]

    def pump(wait_s: float) -> None:
        """Read what rank 0 wrote (waiting up to ``wait_s``) and act on its whole lines."""
        nonlocal buf, current, last_op, limit, deadline, done
        for key, _ in sel.select(timeout=wait_s):
            chunk = os.read(key.fd, 1 << 16)
            if not chunk:
                sel.unregister(key.fileobj)
                continue
            buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            text = line.decode(errors="replace")
            if not text.startswith(EVENT_PREFIX):
                continue
            ev = json.loads(text[len(EVENT_PREFIX):])
            kind = ev.pop("event")
            if kind == "start":
                current = (ev["op"], int(ev["size"]))
                last_op = current[0]
                limit = _budget(cfg, current, ceiling_bps)
                deadline = time.monotonic() + limit
            elif kind == "row":
                result.rows.append({"backend": backend, **ev})
                current = None
            elif kind == "error":
                result.errors.append({"backend": backend, "world_size": world, **ev})
                current = None
            elif kind == "done":
                done = True
            if on_event:
                on_event({"event": kind, **ev, "backend": backend, "world_size": world})

    try:
        while not done:
            now = time.monotonic()
            if now > deadline:
                return fail(f"timed out after {limit:.0f}s; ranks killed")
            pump(min(1.0, max(deadline - now, 0.01)))
            crash = ranks.crashed()
            if crash and not done:
                # Rank 0's last lines (the op a rank died in) may still be on their way: on
                # a slow machine a rank that died as an op began was blamed on "startup"
                # and the op's size listed again as skipped (fifty-third session).
                time.sleep(CRASH_GRACE_S)
                pump(0.0)
                if done:
                    break
                return fail(ranks.crashed() or crash)
        end = time.monotonic() + EXIT_TIMEOUT_S  # done: ranks should exit by themselves
        for proc in ranks.procs:
            try:
                proc.wait(timeout=max(end - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                log.warning("%s n=%d: rank pid %d did not exit; killed", backend, world,
                            proc.pid)
        return []
    finally:
        sel.close()
        ranks.kill()


def _budget(cfg: BenchConfig, current: tuple[str, int], ceiling_bps: float | None) -> float:
    """Deadline for one (op, size): floor + generous multiple of the ideal transfer time."""
    ideal = _ideal_seconds(current[0], current[1], ceiling_bps) * cfg.queue  # per sample
    timed = min(cfg.iters, 3) if cfg.time_budget > 0 else cfg.iters  # budget bounds the rest
    iters = cfg.warmup + timed + 2  # + check + slack
    samples = iters + 1  # + the back-to-back calibration; each lasts about min_sample_s
    return (cfg.stall_timeout + SLOWDOWN_ALLOWANCE * iters * ideal + 2.0 * cfg.time_budget
            + SLOWDOWN_ALLOWANCE * samples * cfg.min_sample_s)
