"""Sparse COO all-reduce (SUM), as gloo serves DDP's ``nn.Embedding(sparse=True)`` gradients."""

from __future__ import annotations

import pytest
import torch

from mccl.bench.spawn import run_ranks

#: (dtype, size, sparse dims); every rank builds every rank's tensor from a seed.
CASES = [
    (torch.float32, (50,), 1),
    (torch.float64, (12, 3), 1),  # hybrid: one dense dim per entry
    (torch.float16, (7, 5, 2), 2),
    (torch.bfloat16, (30, 4), 1),
    (torch.int64, (9, 9), 2),
    (torch.complex64, (20,), 1),
    (torch.bool, (16,), 1),
]


def _tensor(case: int, rank: int) -> torch.Tensor:
    """Uncoalesced (repeated indices), and empty on rank 1 of every even case."""
    dtype, size, sparse_dim = CASES[case]
    gen = torch.Generator().manual_seed(1000 * case + rank)
    nnz = 0 if rank == 1 and case % 2 == 0 else 3 + 4 * rank
    idx = torch.stack([torch.randint(0, size[d], (nnz,), generator=gen)
                       for d in range(sparse_dim)])
    vals = torch.randn(nnz, *size[sparse_dim:], generator=gen, dtype=torch.float64) * 4
    if dtype == torch.bool:
        vals = vals > 0
    elif dtype.is_complex:
        vals = torch.complex(vals, -vals)
    return torch.sparse_coo_tensor(idx, vals.to(dtype), size, check_invariants=True)


def _expected(case: int, world: int) -> torch.Tensor:
    dtype = CASES[case][0]
    if dtype == torch.bool:
        out = _tensor(case, 0).to_dense()
        for r in range(1, world):
            out = out | _tensor(case, r).to_dense()
        return out
    acc = torch.complex128 if dtype.is_complex else (
        torch.int64 if not dtype.is_floating_point else torch.float64)
    return sum(_tensor(case, r).to_dense().to(acc) for r in range(world)).to(dtype)


def _sums(rank: int, world: int) -> list[tuple]:
    import torch.distributed as dist

    out = []
    for case in range(len(CASES)):
        t = _tensor(case, rank)
        if case % 3 == 0:  # async, through the Future as DDP reads it
            fut = dist.all_reduce(t, async_op=True).get_future()
            assert fut.wait()[0] is t
        else:
            dist.all_reduce(t)
        assert t.is_sparse and t.is_coalesced()
        vals = t._values()  # plain lists back to the parent (exact for every dtype here)
        out.append((t._indices().tolist(), (vals.double() if vals.dtype.itemsize == 2
                                            else vals).tolist(), tuple(t.shape), str(t.dtype)))
    none = torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.long), torch.zeros(0), (4,))
    dist.all_reduce(none)  # no entries anywhere
    assert none._nnz() == 0 and none.shape == (4,)
    empty_rows = torch.sparse_coo_tensor(torch.tensor([[0, rank]]), torch.zeros(2, 0), (5, 0))
    dist.all_reduce(empty_rows)  # entries of no elements: rows 0..world-1 after the sum
    assert empty_rows._indices().tolist() == [list(range(world))]
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_sparse_all_reduce_sums(world: int) -> None:
    results = run_ranks(_sums, world, timeout=120)
    for case, (dtype, _, _) in enumerate(CASES):
        want = _expected(case, world)
        for rank in range(world):
            idx, vals, shape, got_dtype = results[rank][case]
            assert got_dtype == str(dtype) and shape == tuple(want.shape)
            wide = torch.float64 if dtype.itemsize == 2 else dtype
            got = torch.sparse_coo_tensor(torch.tensor(idx, dtype=torch.long),
                                          torch.tensor(vals, dtype=wide).to(dtype), shape,
                                          check_invariants=True)
            if dtype.is_floating_point and dtype.itemsize == 2:
                torch.testing.assert_close(got.to_dense(), want, rtol=1e-2, atol=1e-2)
            else:
                torch.testing.assert_close(got.to_dense(), want, rtol=1e-12, atol=1e-12)
            # every rank the same bits, indices included
            assert (idx, vals) == results[0][case][:2]


def _refused(rank: int, world: int) -> list[str]:
    import torch.distributed as dist

    t = _tensor(0, rank)
    errors = []
    for call in (lambda: dist.all_reduce(t, op=dist.ReduceOp.MAX),
                 lambda: dist.all_reduce(torch.eye(3).to_sparse_csr()),
                 lambda: dist.broadcast(t, 0)):
        try:
            call()
            errors.append("no error")
        except ValueError as e:
            errors.append(str(e))
    dist.all_reduce(t)  # the group is still usable: nothing was sent
    return errors


def test_sparse_bad_input_refused_before_sending() -> None:
    errors = run_ranks(_refused, 2, timeout=60)[0]
    assert "SUM only, got MAX" in errors[0]
    assert "torch.sparse_csr" in errors[1]
    assert "only dense tensors" in errors[2]


def _leaf_that_requires_grad(rank: int, world: int) -> list[str]:
    import torch.distributed as dist

    leaf = _tensor(0, rank).requires_grad_()
    before = leaf.detach().clone()
    try:
        dist.all_reduce(leaf)
        said = "no error"
    except RuntimeError as e:
        said = str(e)
    t = _tensor(0, rank)
    dist.all_reduce(t)  # every rank ran the op: the group is in step and usable
    kept = torch.equal(leaf.detach().to_dense(), before.to_dense())
    right = torch.equal(t.to_dense(), _expected(0, world).to_dense())
    return [said, f"leaf kept {kept}", f"next sum right {right}"]


def test_sparse_leaf_that_requires_grad_is_refused_as_by_gloo() -> None:
    """Before: its indices and values were replaced (gloo refuses it: an in-place write to
    a leaf that requires grad)."""
    for said, kept, right in run_ranks(_leaf_that_requires_grad, 2, timeout=60):
        assert "mccl all_reduce" in said and "leaf Variable that requires grad" in said, said
        assert kept == "leaf kept True" and right == "next sum right True", (kept, right)


def _shapes_differ(rank: int, world: int, dense: bool) -> str:
    import torch.distributed as dist

    if dense:  # a dense dim differs: the values' sizes would differ too
        t = torch.sparse_coo_tensor(torch.tensor([[0]]), torch.ones(1, 3 + rank), (4, 3 + rank))
    else:
        t = torch.sparse_coo_tensor(torch.tensor([[0]]), torch.tensor([1.0]), (4 + rank,))
    try:
        dist.all_reduce(t)
    except Exception as e:  # noqa: BLE001 - the test reads the message
        return str(e)
    return "no error"


@pytest.mark.parametrize("dense", [False, True])
def test_sparse_shape_mismatch_fails_every_rank(dense: bool) -> None:
    want = ("(4, 3)", "(4, 5)") if dense else ("(4,)", "(6,)")
    for msg in run_ranks(_shapes_differ, 3, dense, timeout=60, pg_timeout_s=20):
        assert "different sizes" in msg and all(w in msg for w in want), msg


def _rounding_and_views(rank: int, world: int) -> list:
    import torch.distributed as dist

    # bfloat16 steps by 2 at 256: 256 + 1 + 1 is 258 only if the ones are summed before
    # rounding, though all three sit on one rank (half types travel uncoalesced)
    idx = torch.zeros(1, 3 if rank == 0 else 0, dtype=torch.long)
    vals = torch.tensor([256.0, 1.0, 1.0] if rank == 0 else [], dtype=torch.bfloat16)
    half = torch.sparse_coo_tensor(idx, vals, (2,), check_invariants=True)
    dist.all_reduce(half)
    # the caller's own real view of a complex tensor holds the result, as its base does
    c = torch.sparse_coo_tensor(torch.tensor([[rank]]), torch.tensor([1 + 2j]), (world,),
                                check_invariants=True)
    v = torch.view_as_real(c)
    dist.all_reduce(v)
    return [half.to_dense().tolist(), v.to_dense().tolist(),
            [[z.real, z.imag] for z in c.to_dense().tolist()]]


def test_sparse_half_rounds_once_and_real_views_get_the_result() -> None:
    for half, view, base in run_ranks(_rounding_and_views, 2, timeout=60):
        assert half == [258.0, 0.0]
        assert view == [[1.0, 2.0], [1.0, 2.0]] and base == view


def _embedding_ddp(rank: int, world: int) -> tuple[float, float]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    out = []
    for group in (dist.new_group(backend="gloo"), dist.group.WORLD):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Embedding(40, 8, sparse=True), torch.nn.Linear(8, 1))
        start = net[0].weight.detach().clone()
        model = DDP(net, process_group=group)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        gen = torch.Generator().manual_seed(7 + rank)
        for _ in range(5):
            x = torch.randint(0, 40, (6,), generator=gen)
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
        out.append([p.detach().clone() for p in model.parameters()])
    gloo, mccl = out
    moved = (gloo[0] - start).abs().max().item()
    return moved, max((a - b).abs().max().item() for a, b in zip(gloo, mccl, strict=True))


def test_ddp_sparse_embedding_matches_gloo() -> None:
    for moved, diff in run_ranks(_embedding_ddp, 2, timeout=120):
        assert moved > 1e-3, "training did not move the embedding"
        assert diff <= 1e-6, f"max |mccl - gloo| = {diff}"
