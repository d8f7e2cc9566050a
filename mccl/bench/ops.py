"""The benchmarked collectives: buffer sizing, nccl-tests bus factors, one timed call, a check.

Why one place: the parent (report, model) and the rank processes (worker) must agree on what
"size" and "busbw" mean. Size follows nccl-tests: the bytes of the largest per-rank buffer
(all_gather: the gathered output; reduce_scatter: the full input; all_to_all: the whole send
buffer). busbw = algbw * bus factor, which makes ring-optimal algorithms read as link speed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "sendrecv")
ALIASES = {
    "allreduce": "all_reduce", "all_gather_into_tensor": "all_gather", "allgather": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "reducescatter": "reduce_scatter",
    "bcast": "broadcast", "alltoall": "all_to_all", "all_to_all_single": "all_to_all",
    "send_recv": "sendrecv", "p2p": "sendrecv",
}
# ops whose buffer is split in world_size equal chunks
CHUNKED = frozenset({"all_gather", "reduce_scatter", "all_to_all"})
CHECK_PATTERN_MOD = 61  # element pattern (i % 61): exact in fp16/fp32 sums for small worlds
BROADCAST_ROOT = 0


def canonical_op(name: str) -> str:
    """Accept nccl-tests / torch spellings; raise ValueError on unknown names."""
    key = name.strip().lower().replace("-", "_")
    key = ALIASES.get(key, ALIASES.get(key.replace("_", ""), key))
    if key not in OPS:
        raise ValueError(f"unknown op {name!r}; choose from {', '.join(OPS)}")
    return key


def bus_factor(op: str, world: int) -> float:
    """nccl-tests bus bandwidth factor for op at world size n."""
    n = world
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op in ("broadcast", "sendrecv"):
        return 1.0
    raise ValueError(f"unknown op {op!r}")


def element_count(op: str, size_bytes: int, world: int, elem_size: int) -> int:
    """Total elements of the largest buffer: size rounded down (chunked ops: to a multiple of
    world), never below one element per rank."""
    count = max(size_bytes // elem_size, 1)
    if op in CHUNKED:
        count = max(count // world, 1) * world
    return count


@dataclass
class Case:
    """A prepared op: `run()` is the timed call (``queue`` ops); `check()` re-fills inputs,
    runs once, verifies."""

    run: Callable[[], None]
    check: Callable[[], bool]
    count: int
    nbytes: int
    queue: int = 1


def make_case(op: str, count: int, dtype: object, rank: int, world: int,
              device: str = "cpu", queue: int = 1) -> Case:
    """Allocate buffers for op on this rank and return its timed call and checker.

    ``queue`` > 1: the timed call issues that many ops of this size on as many buffer sets,
    asynchronously and back to back, then waits for them all (DDP's gradient buckets: an op
    is queued while the one before runs, so a backend may overlap consecutive ops); the
    caller divides its time by ``queue``."""
    if queue < 1:
        raise ValueError(f"queue must be at least 1, got {queue}")
    cases = [_one_case(op, count, dtype, rank, world, device) for _ in range(queue)]
    if queue == 1:
        run, check, _ = cases[0]
    else:
        def run() -> None:
            works = [w for _, _, issue in cases for w in issue()]
            for w in works:
                w.wait()

        check = cases[0][1]
    return Case(run=run, check=check, count=count, nbytes=count * element_size(dtype),
                queue=queue)


def element_size(dtype: object) -> int:
    """Bytes per element of a torch dtype."""
    import torch

    return torch.empty((), dtype=dtype).element_size()  # type: ignore[arg-type]


def _one_case(op: str, count: int, dtype: object, rank: int, world: int, device: str
              ) -> tuple[Callable[[], None], Callable[[], bool], Callable[[], list]]:
    """One buffer set of op: (blocking call, check, asynchronous call returning its works)."""
    import torch
    import torch.distributed as dist

    dt: torch.dtype = dtype  # type: ignore[assignment]
    elem = element_size(dt)
    n = world
    chunk = count // n if op in CHUNKED else count

    def pattern(numel: int, offset: int) -> torch.Tensor:
        base = torch.arange(numel, dtype=torch.int64) % CHECK_PATTERN_MOD + offset
        return base.to(dt).to(device)

    def close(got: torch.Tensor, want: torch.Tensor) -> bool:
        if dt.is_floating_point and elem < 4:
            return bool(torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2))
        return bool(torch.equal(got, want))

    if op == "all_reduce":
        buf = torch.zeros(count, dtype=dt, device=device)

        def run() -> None:
            dist.all_reduce(buf)

        def issue() -> list:
            return [dist.all_reduce(buf, async_op=True)]

        def check() -> bool:
            buf.copy_(pattern(count, rank))
            dist.all_reduce(buf)
            want = pattern(count, 0).to(torch.int64) * n + n * (n - 1) // 2
            return close(buf, want.to(dt))

    elif op == "all_gather":
        inp = torch.zeros(chunk, dtype=dt, device=device)
        out = torch.zeros(count, dtype=dt, device=device)
        # torch 2.13 renamed the flat forms (the old names warn); 2.11 has only the old ones
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

        def run() -> None:
            gather(out, inp)

        def issue() -> list:
            return [gather(out, inp, async_op=True)]

        def check() -> bool:
            inp.copy_(pattern(chunk, rank))
            gather(out, inp)
            want = torch.cat([pattern(chunk, r) for r in range(n)])
            return close(out, want)

    elif op == "reduce_scatter":
        inp = torch.zeros(count, dtype=dt, device=device)
        out = torch.zeros(chunk, dtype=dt, device=device)

        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

        def run() -> None:
            scatter(out, inp)

        def issue() -> list:
            return [scatter(out, inp, async_op=True)]

        def check() -> bool:
            inp.copy_(pattern(count, rank))
            scatter(out, inp)
            full = pattern(count, 0).to(torch.int64) * n + n * (n - 1) // 2
            return close(out, full[rank * chunk:(rank + 1) * chunk].to(dt))

    elif op == "broadcast":
        buf = torch.zeros(count, dtype=dt, device=device)

        def run() -> None:
            dist.broadcast(buf, src=BROADCAST_ROOT)

        def issue() -> list:
            return [dist.broadcast(buf, src=BROADCAST_ROOT, async_op=True)]

        def check() -> bool:
            buf.copy_(pattern(count, 1) if rank == BROADCAST_ROOT else torch.zeros_like(buf))
            dist.broadcast(buf, src=BROADCAST_ROOT)
            return close(buf, pattern(count, 1))

    elif op == "all_to_all":
        inp = torch.zeros(count, dtype=dt, device=device)
        out = torch.zeros(count, dtype=dt, device=device)

        def run() -> None:
            dist.all_to_all_single(out, inp)

        def issue() -> list:
            return [dist.all_to_all_single(out, inp, async_op=True)]

        def check() -> bool:
            # chunk j of rank r carries offset r*n + j; rank r receives chunk r of every rank
            inp.copy_(torch.cat([pattern(chunk, rank * n + j) for j in range(n)]))
            dist.all_to_all_single(out, inp)
            want = torch.cat([pattern(chunk, j * n + rank) for j in range(n)])
            return close(out, want)

    elif op == "sendrecv":
        sbuf = torch.zeros(count, dtype=dt, device=device)
        rbuf = torch.zeros(count, dtype=dt, device=device)
        dst, src = (rank + 1) % n, (rank - 1) % n

        def issue() -> list:
            return [dist.isend(sbuf, dst), dist.irecv(rbuf, src)]

        def run() -> None:
            for req in issue():
                req.wait()

        def check() -> bool:
            sbuf.copy_(pattern(count, rank))
            run()
            return close(rbuf, pattern(count, src))

    else:
        raise ValueError(f"unknown op {op!r}")
    return run, check, issue
