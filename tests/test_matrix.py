"""Op x dtype x world size x size, against exact references computed locally.

Every rank builds every rank's input from a seed (rank, dtype, size), so each rank can compute
the reference itself. Values are chosen so the reference is exact and order-independent:
integer-valued floats for sums, powers-of-two-ish factors for products, wrapping integer
arithmetic (modular, so any order gives the same bits). Half types use values exact in the half
type whose float32 sum is exact, so "accumulate in float32, round once" has one right answer
(and a reduction that rounded at every step would differ). One run per world size;
sizes 0, 1 and 1001 elements take the small-message path, 300_000
the ring.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

from mccl.bench.spawn import run_ranks

R = dist.ReduceOp
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16,
          torch.int32, torch.int64, torch.uint8, torch.bool]
OPS = {"SUM": R.SUM, "AVG": R.AVG, "MIN": R.MIN, "MAX": R.MAX, "PRODUCT": R.PRODUCT,
       "BAND": R.BAND, "BOR": R.BOR, "BXOR": R.BXOR}
SIZES = [0, 1, 1001, 300_000]
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
HALVES = (torch.float16, torch.bfloat16)


def supported(op: str, dtype: torch.dtype) -> bool:
    """mccl's contract: floats take arithmetic ops, integers everything but AVG, bool all but
    AVG (as logical ops)."""
    if dtype in FLOATS:
        return op in ("SUM", "AVG", "MIN", "MAX", "PRODUCT")
    return op != "AVG"


def make_input(rank: int, op: str, dtype: torch.dtype, n: int) -> torch.Tensor:
    """Deterministic input of ``rank`` (see the module doc for the value choice). Ops other
    than PRODUCT share inputs (cached: callers must not write into the result)."""
    return _make(rank, op == "PRODUCT", dtype, n)


@functools.lru_cache(maxsize=96)  # one dtype's inputs: the loops go dtype by dtype
def _make(rank: int, product: bool, dtype: torch.dtype, n: int) -> torch.Tensor:
    g = torch.Generator()
    g.manual_seed(hash((rank, n, DTYPES.index(dtype), product)) & 0x7FFF_FFFF)
    op = "PRODUCT" if product else "SUM"
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype in FLOATS:
        if op == "PRODUCT":
            pool = torch.tensor([-2.0, -1.5, -1.0, -0.5, 0.5, 1.0, 1.5, 2.0])
            return pool[torch.randint(0, len(pool), (n,), generator=g)].to(dtype)
        # Halves: k/2^j with k using all significant bits (exact in the half type); partial
        # sums need more bits, so rounding at every step differs from rounding once, while
        # float32 holds every partial sum exactly.
        if dtype == torch.float16:
            return (torch.randint(-2047, 2048, (n,), generator=g).float() / 256).to(dtype)
        if dtype == torch.bfloat16:
            return (torch.randint(-255, 256, (n,), generator=g).float() / 32).to(dtype)
        return torch.randint(-1000, 1001, (n,), generator=g).to(dtype)
    info = torch.iinfo(dtype)
    if op == "PRODUCT":
        return torch.randint(-3 if info.min < 0 else 0, 4, (n,), generator=g).to(dtype)
    lo, hi = max(info.min, -(2**62)), min(info.max, 2**62)
    return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(dtype)


def reference(xs: list[torch.Tensor], op: str) -> torch.Tensor:
    """The reduction of ``xs`` as mccl defines it (halves: in float32, rounded once)."""
    dtype = xs[0].dtype
    if dtype == torch.bool:
        fn = {"SUM": torch.logical_or, "MAX": torch.logical_or, "BOR": torch.logical_or,
              "PRODUCT": torch.logical_and, "MIN": torch.logical_and,
              "BAND": torch.logical_and, "BXOR": torch.logical_xor}[op]
    else:
        fn = {"SUM": torch.add, "AVG": torch.add, "PRODUCT": torch.mul, "MIN": torch.minimum,
              "MAX": torch.maximum, "BAND": torch.bitwise_and, "BOR": torch.bitwise_or,
              "BXOR": torch.bitwise_xor}[op]
    acc_dtype = torch.float32 if dtype in HALVES else dtype
    acc = xs[0].to(acc_dtype)
    for x in xs[1:]:
        acc = fn(acc, x.to(acc_dtype))
    if op == "AVG":
        acc = acc / len(xs)
    return acc.to(dtype)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _matrix(rank: int, world: int, device: str = "cpu") -> list[str]:
    """All checks of one world size on tensors of ``device`` (a GPU per rank, or ranks sharing
    one); returns the failures (empty when all pass)."""
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    bad: list[str] = []

    def on(x: torch.Tensor) -> torch.Tensor:
        return x.to(device, copy=True)

    def empty(*shape: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(*shape, dtype=dtype, device=device)

    def check(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
        got = got.cpu()
        if not _same(got, want):
            diff = (got.double() - want.double()).abs() if got.numel() == want.numel() else None
            n_bad = int((diff != 0).sum()) if diff is not None else -1
            bad.append(f"rank {rank}: {what}: {n_bad} elements differ")

    for dtype in DTYPES:
        for op, rop in OPS.items():
            if not supported(op, dtype):
                continue
            for n in SIZES:
                xs = [make_input(r, op, dtype, n) for r in range(world)]
                ref = reference(xs, op)
                tag = f"{op} {dtype} n={n} world={world}"
                # all_reduce
                t = on(xs[rank])
                dist.all_reduce(t, op=rop)
                check(f"all_reduce {tag}", t, ref)
                # reduce: the root gets the result, the others keep their input
                root = n % world
                t = on(xs[rank])
                dist.reduce(t, dst=root, op=rop)
                check(f"reduce(dst={root}) {tag}", t, ref if rank == root else xs[rank])
                # reduce_scatter_tensor: chunk `rank` of the reduction of the concatenations
                m = n // world if n >= 1000 else n
                ys = [make_input(r, op, dtype, m * world) for r in range(world)]
                yref = reference(ys, op)
                out = empty(m, dtype=dtype)
                dist.reduce_scatter_tensor(out, on(ys[rank]), op=rop)
                check(f"reduce_scatter_tensor {tag} m={m}", out, yref[rank * m:(rank + 1) * m])
                if n == 1001:  # the list form, uneven chunk lengths are not allowed: same m
                    out = empty(m, dtype=dtype)
                    dist.reduce_scatter(out, list(on(ys[rank]).chunk(world)), op=rop)
                    check(f"reduce_scatter {tag}", out, yref[rank * m:(rank + 1) * m])

        # data movement: bit-exact, every dtype and size
        for n in SIZES:
            xs = [make_input(r, "SUM", dtype, n) for r in range(world)]
            tag = f"{dtype} n={n} world={world}"
            root = (n + 1) % world
            t = on(xs[rank])
            dist.broadcast(t, src=root)
            check(f"broadcast(src={root}) {tag}", t, xs[root])
            out = empty(n * world, dtype=dtype)
            dist.all_gather_into_tensor(out, on(xs[rank]))
            check(f"all_gather_into_tensor {tag}", out, torch.cat(xs))
            outs = [empty(n, dtype=dtype) for _ in range(world)]
            dist.all_gather(outs, on(xs[rank]))
            for r in range(world):
                check(f"all_gather[{r}] {tag}", outs[r], xs[r])
            m = n // world if n >= 1000 else n
            src = [x[:m * world].reshape(world, m) if n >= 1000 else x.repeat(world, 1)
                   for x in xs]
            out = empty(world, m, dtype=dtype)
            dist.all_to_all_single(out, on(src[rank]))
            check(f"all_to_all_single {tag}", out,
                  torch.stack([src[r][rank] for r in range(world)]))
            dst = world - 1
            glist = [empty(n, dtype=dtype) for _ in range(world)] if rank == dst else None
            dist.gather(on(xs[rank]), glist, dst=dst)
            if rank == dst:
                for r in range(world):
                    check(f"gather[{r}] {tag}", glist[r], xs[r])
            out = empty(n, dtype=dtype)
            dist.scatter(out, [on(x) for x in xs] if rank == 0 else None, src=0)
            check(f"scatter {tag}", out, xs[rank])

    # Unsupported pairs raise before any byte moves, naming both; the group stays usable.
    for dtype in DTYPES:
        for op, rop in OPS.items():
            if supported(op, dtype):
                continue
            t = torch.ones(4, dtype=dtype, device=device)
            calls = {
                "all_reduce": (dist.all_reduce, (t,), {"op": rop}),
                "reduce": (dist.reduce, (t,), {"dst": 0, "op": rop}),
                "reduce_scatter_tensor": (
                    dist.reduce_scatter_tensor,
                    (empty(1, dtype=dtype), torch.ones(world, dtype=dtype, device=device)),
                    {"op": rop}),
            }
            for name, (fn, args, kwargs) in calls.items():
                try:
                    fn(*args, **kwargs)
                    bad.append(f"{name} {op} {dtype}: no error")
                except (TypeError, ValueError) as e:
                    msg = str(e)
                    if op not in msg or str(dtype) not in msg:
                        bad.append(f"{name} {op} {dtype}: message does not name both: {msg}")
    t = torch.full((3,), float(rank + 1), device=device)
    dist.all_reduce(t)
    check("all_reduce after the rejected ops", t, torch.full((3,), float(world * (world + 1) // 2)))
    return bad


def _assert_no_failures(results: list[list[str]]) -> None:
    failures = [f for r in results for f in r]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:40])


@pytest.mark.parametrize("world", [2, 3, 4])
def test_matrix(world: int) -> None:
    _assert_no_failures(run_ranks(_matrix, world, timeout=150))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("world", [2, 3, 4])
def test_matrix_on_cuda_tensors(world: int) -> None:
    """The same matrix on CUDA tensors (the CUDA adapter's staging, every dtype and op)."""
    _assert_no_failures(run_ranks(_matrix, world, "cuda", timeout=300))


def test_reference_is_round_once() -> None:
    """Sanity of the reference itself: for bfloat16 sums, rounding once differs from rounding
    at every step on some elements, so the matrix really checks the float32 accumulation."""
    for dtype in HALVES:
        xs = [make_input(r, "SUM", dtype, 1001) for r in range(3)]
        stepwise = xs[0].clone()
        for x in xs[1:]:
            stepwise = stepwise + x
        assert not torch.equal(stepwise, reference(xs, "SUM")), dtype


GRID_WORLD = 8
GRID_CASES = [("SUM", torch.float32), ("AVG", torch.float32), ("MAX", torch.bfloat16),
              ("SUM", torch.float16), ("BXOR", torch.int64), ("PRODUCT", torch.float64)]


def _grid(rank: int, world: int) -> tuple[list[str], dict[str, int]]:
    """1 MiB all-reduces, reduce-scatters (of 1 MiB inputs) and all-gathers (into 1 MiB),
    which 8 ranks run on grids (``grid.columns``), blocking and queued back to back (the
    engine starts an op's first sends early), checked exactly."""
    from mccl.algorithms import grid

    runs = {"all_reduce": 0, "reduce_scatter": 0, "all_gather": 0}

    def counting(name: str):
        plain = getattr(grid, name)

        def counted(*args, **kwargs):
            runs[name] += 1
            plain(*args, **kwargs)

        setattr(grid, name, counted)

    for name in runs:
        counting(name)
    bad: list[str] = []

    def check(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
        if not _same(got, want):
            bad.append(f"rank {rank}: {what}: wrong result")

    for op, dtype in GRID_CASES:
        n = (1 << 20) // max(4, dtype.itemsize)  # halves run in float32: 1 MiB there too
        xs = [make_input(r, op, dtype, n) for r in range(world)]
        ref = reference(xs, op)
        m = n // world
        ts = [xs[rank].clone() for _ in range(4)]
        dist.all_reduce(ts[0], op=OPS[op])
        works = [dist.all_reduce(x, op=OPS[op], async_op=True) for x in ts[1:]]
        outs = [torch.empty(m, dtype=dtype) for _ in range(4)]
        dist.reduce_scatter_tensor(outs[0], xs[rank], op=OPS[op])
        works += [dist.reduce_scatter_tensor(o, xs[rank], op=OPS[op], async_op=True)
                  for o in outs[1:]]
        for w in works:
            w.wait()
        for x in ts:
            check(f"all_reduce {op} {dtype}", x, ref)
        for o in outs:
            check(f"reduce_scatter_tensor {op} {dtype}", o, ref[rank * m:(rank + 1) * m])
        gathered = [torch.empty(n, dtype=dtype) for _ in range(3)]
        dist.all_gather_into_tensor(gathered[0], xs[rank][:m])
        for w in [dist.all_gather_into_tensor(g, xs[rank][:m], async_op=True)
                  for g in gathered[1:]]:
            w.wait()
        for g in gathered:
            check(f"all_gather_into_tensor {dtype}", g, torch.cat([x[:m] for x in xs]))
    return bad, runs


def test_collectives_over_a_grid() -> None:
    results = run_ranks(_grid, GRID_WORLD, timeout=150)
    failures = [f for bad, _ in results for f in bad]
    assert not failures, "\n".join(failures[:20])
    want = {"all_reduce": 4 * len(GRID_CASES), "reduce_scatter": 4 * len(GRID_CASES),
            # an all-gather moves the half types' 2 bytes: 512 KiB, a ring
            "all_gather": 3 * sum(dtype.itemsize >= 4 for _, dtype in GRID_CASES)}
    assert all(runs == want for _, runs in results), results


def _grid_against_ring(rank: int, world: int) -> str:
    """The last rank all-reduces twice as many elements (the ring) as the others (a grid)."""
    n = (1 << 20) // 4
    t = torch.ones(2 * n if rank == world - 1 else n)
    try:
        dist.all_reduce(t)
        dist.barrier()
    except RuntimeError as e:
        return str(e)
    return "no error"


def test_a_grid_all_reduce_against_a_ring_of_another_size_fails_every_rank() -> None:
    """The grid and the ring talk to different peers; a mismatch between them must still
    reach every rank as an error naming it (the group timeout is longer than the test's)."""
    msgs = run_ranks(_grid_against_ring, GRID_WORLD, timeout=60, pg_timeout_s=300)
    for rank, msg in enumerate(msgs):
        assert "collective mismatch" in msg and "262144" in msg and "524288" in msg, (rank, msg)


KILLED = 5


def _grid_with_a_kill(rank: int, world: int) -> tuple[int, str]:
    """1 MiB all-reduces (a 2 x 4 grid) until rank ``KILLED`` kills itself at its 30th."""
    import os
    import signal

    t = torch.ones((1 << 20) // 4)
    for i in range(200):
        if rank == KILLED and i == 30:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            dist.all_reduce(t)
        except RuntimeError as e:
            return i, str(e)
    return 200, "no error"


def test_a_rank_killed_during_grid_all_reduces_fails_every_survivor() -> None:
    """A grid talks to a rank's row and its column only; the death of a rank must still fail
    every survivor's op, naming it (the group timeout is longer than the test's)."""
    results = run_ranks(_grid_with_a_kill, GRID_WORLD, timeout=60, pg_timeout_s=300,
                        expect_missing=(KILLED,))
    for rank, got in enumerate(results):
        if rank == KILLED:
            continue
        i, msg = got
        assert i in (29, 30) and f"rank {KILLED}" in msg, (rank, i, msg)


def _mixed_forms(rank: int, world: int) -> tuple[list[str], int]:
    """1 MiB all-gathers and reduce-scatters (grids on 8 ranks) where some ranks call the
    list form and the others the flat one: the two forms agree on the wire (as on gloo), so
    they must pick the same algorithm. Returns the failures and the grid runs."""
    from mccl.algorithms import grid

    runs = 0
    plain = {name: getattr(grid, name) for name in ("all_gather", "reduce_scatter")}

    def counted(name: str):
        def run(*args, **kwargs):
            nonlocal runs
            runs += 1
            plain[name](*args, **kwargs)
        return run

    for name in plain:
        setattr(grid, name, counted(name))
    bad: list[str] = []
    m = (1 << 20) // 4 // world
    for listed in ({0}, {3}, set(range(world))):
        mine = torch.arange(m, dtype=torch.float32) + 1000 * rank
        if rank in listed:
            outs = [torch.empty(m) for _ in range(world)]
            dist.all_gather(outs, mine)
            got = torch.cat(outs)
        else:
            got = torch.empty(m * world)
            dist.all_gather_into_tensor(got, mine)
        want = torch.cat([torch.arange(m, dtype=torch.float32) + 1000 * r for r in range(world)])
        if not torch.equal(got, want):
            bad.append(f"rank {rank}: all_gather, list form on {sorted(listed)}: wrong result")
        full = torch.arange(m * world, dtype=torch.float32) * (rank + 1)
        out = torch.empty(m)
        if rank in listed:
            dist.reduce_scatter(out, list(full.chunk(world)))
        else:
            dist.reduce_scatter_tensor(out, full)
        want = (torch.arange(m * world, dtype=torch.float32) * (world * (world + 1) // 2))
        if not torch.equal(out, want[rank * m:(rank + 1) * m]):
            bad.append(f"rank {rank}: reduce_scatter, list form on {sorted(listed)}: "
                       "wrong result")
    return bad, runs


def test_list_and_flat_forms_mixed_across_ranks_on_a_grid() -> None:
    results = run_ranks(_mixed_forms, GRID_WORLD, timeout=120, pg_timeout_s=30)
    failures = [f for bad, _ in results for f in bad]
    assert not failures, "\n".join(failures[:20])
    assert all(runs == 6 for _, runs in results), results  # every op ran on the grid
