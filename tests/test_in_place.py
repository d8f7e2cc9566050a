"""Inputs that share memory with the op's own outputs, as users write them in place.

The layouts the ops are written for (an all-gather's input in its own rank's slot of the
output, a reduce-scatter's output in its own rank's part of the input) run as they are; any
other sharing (``all_to_all_single(t, t)``, an input in another rank's slot) must still give
the right values: receives may not overwrite input that is yet to be sent or reduced. Sizes
are large enough that sends are still under way when the first receives land.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from mccl.bench.spawn import run_ranks

SMALL, LARGE = 8, 1 << 20


def _values(rank: int, n: int, device: str = "cpu") -> torch.Tensor:
    """Exact in float32 and in sums over a few ranks; differ by rank and by position."""
    return (torch.arange(n, device=device) % 997 + 1000 * (rank + 1)).float()


def _cases(rank: int, world: int, n: int, dev: str) -> list[str]:
    bad: list[str] = []
    nxt, ranks = (rank + 1) % world, range(world)
    everyone = torch.cat([_values(r, n, dev) for r in ranks])

    def check(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
        if not torch.equal(got, want):
            wrong = (got != want).nonzero()
            bad.append(f"rank {rank} n={n}: {what}: {wrong.numel()} wrong elements, first at "
                       f"{wrong[0].tolist()}")

    for slot, what in ((rank, "own slot"), (nxt, "next rank's slot")):
        out = torch.zeros(world * n, device=dev)
        out[slot * n:(slot + 1) * n] = _values(rank, n, dev)
        dist.all_gather_into_tensor(out, out[slot * n:(slot + 1) * n])
        check(f"all_gather_into_tensor, input in the {what}", out, everyone)

    out = torch.zeros(world * n + n // 2, device=dev)  # input straddling two slots
    inp = out[n // 2:n // 2 + n]
    inp.copy_(_values(rank, n, dev))
    dist.all_gather_into_tensor(out[:world * n], inp)
    check("all_gather_into_tensor, input across two slots", out[:world * n], everyone)

    outs = [torch.zeros(n, device=dev) for _ in ranks]
    outs[nxt] = _values(rank, n, dev)
    dist.all_gather(outs, outs[nxt])
    check("all_gather, input is another rank's output", torch.cat(outs), everyone)

    # one buffer in every slot: the slots are written in the list's order, so every rank ends
    # with the last rank's values (gloo's result); in place each would hold another rank's
    buf = torch.zeros(n, device=dev)
    dist.all_gather([buf] * world, _values(rank, n, dev))
    check("all_gather into one buffer in every slot", buf, _values(world - 1, n, dev))
    halves = torch.zeros(n + n // 2, device=dev)  # slots overlapping by half
    outs = [halves[(r % 2) * (n // 2):(r % 2) * (n // 2) + n] for r in ranks]
    dist.all_gather(outs, _values(rank, n, dev))
    want = torch.zeros(n + n // 2, device=dev)
    for r in ranks:
        want[(r % 2) * (n // 2):(r % 2) * (n // 2) + n] = _values(r, n, dev)
    check("all_gather into overlapping slots", halves, want)

    total = sum(_values(r, n, dev) for r in ranks)
    for part, what in ((rank, "own part"), (nxt, "next rank's part")):
        inp = torch.cat([_values(rank, n, dev)] * world)
        dist.reduce_scatter_tensor(inp[part * n:(part + 1) * n], inp)
        check(f"reduce_scatter_tensor, output is its input's {what}",
              inp[part * n:(part + 1) * n], total)

    ins = [_values(rank, n, dev) for _ in ranks]
    dist.reduce_scatter(ins[nxt], ins)
    check("reduce_scatter, output is another rank's input", ins[nxt], total)

    t = torch.cat([_values(rank, n, dev) + 100_000 * d for d in ranks])
    dist.all_to_all_single(t, t)
    check("all_to_all_single(t, t)", t, torch.cat([_values(r, n, dev) + 100_000 * rank
                                                   for r in ranks]))

    bufs = [_values(rank, n, dev) + 100_000 * d for d in ranks]
    dist.all_to_all(bufs, bufs)
    check("all_to_all, outputs are the inputs", torch.cat(bufs),
          torch.cat([_values(r, n, dev) + 100_000 * rank for r in ranks]))

    root = world - 1
    parts = [_values(root, n, dev) + 100_000 * d for d in ranks]
    out = parts[(root + 1) % world] if rank == root else torch.zeros(n, device=dev)
    want = (_values(root, n, dev) + 100_000 * rank).clone()
    dist.scatter(out, parts if rank == root else None, src=root)
    check("scatter, the root's output is another rank's part", out, want)
    return bad


def _both_sizes(rank: int, world: int, dev: str) -> list[str]:
    if dev == "cuda":
        torch.cuda.set_device(0)  # the ranks share the machine's first GPU
    return _cases(rank, world, SMALL, dev) + _cases(rank, world, LARGE, dev)


@pytest.mark.parametrize("world", [3, 4])
def test_inputs_sharing_memory_with_outputs_give_the_right_values(world: int) -> None:
    bad = run_ranks(_both_sizes, world, "cpu", timeout=180)
    assert not any(bad), "\n".join(line for rank in bad for line in rank)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_inputs_sharing_memory_with_outputs_give_the_right_values() -> None:
    """Staged through host copies (the CUDA hand-off): the same cases on CUDA tensors."""
    bad = run_ranks(_both_sizes, 3, "cuda", timeout=240)
    assert not any(bad), "\n".join(line for rank in bad for line in rank)


def test_only_inputs_outside_the_ops_layout_are_copied() -> None:
    """The in-place layouts the ops are written for take no copy (FSDP2 all-gathers in
    place); other sharing copies the input, and only where memory is really shared."""
    from mccl.device.strided import clashing_inputs

    n, w = 6, 4
    out = torch.zeros(w * n)
    reads, writes = [False, True], [True, False]
    for r in range(w):  # all_gather_into_tensor(out, out[slot]) on rank r
        own = [(1, 0, r * n * out.element_size())]
        assert clashing_inputs([out, out[r * n:(r + 1) * n]], reads, writes, own) == []
        other = out[((r + 1) % w) * n:((r + 1) % w + 1) * n]
        assert clashing_inputs([out, other], reads, writes, own) == [1]
    assert clashing_inputs([out, out[1:n + 1]], reads, writes, [(1, 0, 0)]) == [1]
    assert clashing_inputs([out, out], reads, writes) == [1]  # all_to_all_single(t, t)
    assert clashing_inputs([out[:n], out[n:2 * n]], reads, writes) == []  # neighbours
    assert clashing_inputs([out[:0], out], reads, writes) == []  # empty shares nothing
    strided = out.view(n, w)[:, 0]  # every w-th element: spans the whole buffer
    assert clashing_inputs([out[1:2], strided], reads, writes) == [1]


def test_only_outputs_sharing_memory_with_each_other_are_copied() -> None:
    from mccl.device.strided import clashing_outputs

    n = 6
    out = torch.zeros(4 * n)
    slots = [out[i * n:(i + 1) * n] for i in range(4)]
    assert clashing_outputs(slots, [True] * 4) == []  # neighbours
    assert clashing_outputs([slots[0]] * 3, [True] * 3) == [0, 1, 2]
    assert clashing_outputs([slots[0], slots[1], slots[0]], [True] * 3) == [0, 2]
    assert clashing_outputs([slots[0], slots[0]], [True, False]) == []  # one is only read
    assert clashing_outputs([out[: n + 1], slots[2], out[n:2 * n]], [True] * 3) == [0, 2]
    assert clashing_outputs([out[:0], out[:0], slots[3]], [True] * 3) == []  # empty ones
    assert clashing_outputs([out, slots[1], slots[3]], [True] * 3) == [0, 1, 2]  # nested


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 60), st.integers(0, 12)),
                min_size=1, max_size=40))
def test_the_span_index_answers_as_a_scan_of_its_spans_would(steps) -> None:
    """Adds and removes of byte ranges (empty ones too), each followed by queries of every
    small range: the index agrees with a plain list."""
    from mccl.device.strided import SpanIndex, spans_meet

    index, held = SpanIndex(), []
    for remove, lo, n in steps:
        span = (lo, lo + n)
        if remove and span in held:
            held.remove(span)
            index.remove([span])
        elif not remove:
            held.append(span)
            index.add([span])
        for qlo in range(0, 75, 3):
            for qn in (0, 1, 5, 20):
                q = (qlo, qlo + qn)
                assert index.meets(q) == any(spans_meet(q, h) for h in held), (q, held)
