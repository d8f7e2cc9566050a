"""mccl.device.mps logic with fakes of the torch.mps APIs (no Apple hardware here or in CI).

The fakes stand in for ``torch.mps.Event`` and ``torch.mps._host_alias_storage`` (which on a
Mac returns a CPU storage sharing the MTLBuffer); tensors are CPU tensors playing the MPS
tensors. What is checked is mccl's side of the contract: who records and who waits, that the
ring gets views of the same bytes, when it falls back to staging, and the end-to-end results.
"""

from __future__ import annotations

import threading

import pytest
import torch

import mccl.device.mps as mps_mod
from mccl.bench.spawn import run_ranks
from mccl.device import adapter_for
from mccl.device.mps import MpsAdapter, UnifiedHandoff, host_view
from mccl.device.staging import StagingHandoff
from tests.device_fakes import FakeMpsEvent, fake_alias, install_fake_mps


@pytest.fixture
def fake_mps(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(torch.mps, "Event", FakeMpsEvent)
    monkeypatch.setattr(torch.mps, "_host_alias_storage", fake_alias, raising=False)
    FakeMpsEvent.instances.clear()
    return FakeMpsEvent


def _on_comm_thread(fn):
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("v", fn()), name="comm")
    t.start()
    t.join(10)
    return box.get("v")


def test_unified_hands_the_ring_the_same_bytes(fake_mps) -> None:
    a = MpsAdapter(unified=True)
    assert a.unified
    t = torch.arange(8.0)
    h = a.prepare([t], [True], [True])
    assert isinstance(h, UnifiedHandoff)
    (ev,) = fake_mps.instances
    assert ev.record_threads == [threading.current_thread().name]  # O1 on the caller
    hosts = _on_comm_thread(h.acquire)
    assert ev.sync_threads == ["comm"]  # the comm thread waits on that marker only
    assert hosts[0].data_ptr() == t.data_ptr()
    hosts[0].mul_(2)  # the ring writes in place
    h.release()
    assert torch.equal(t, 2 * torch.arange(8.0))
    assert h.gate() is None and h.result_context() is None


def test_host_view_keeps_offset_shape_and_strides(fake_mps) -> None:
    base = torch.arange(24.0).reshape(4, 6)
    v = base[1:3]  # storage offset 6
    hv = host_view(v, fake_alias)
    assert hv.storage_offset() == 6 and hv.shape == v.shape and hv.stride() == v.stride()
    assert torch.equal(hv, v)
    hv.fill_(-1)
    assert torch.equal(base[1:3], torch.full((2, 6), -1.0))
    assert host_view(torch.empty(0), fake_alias).numel() == 0


def test_staging_when_disabled_by_the_flag(fake_mps) -> None:
    a = MpsAdapter(unified=False)
    assert not a.unified
    t = torch.ones(4)
    h = a.prepare([t], [True], [True])
    assert isinstance(h, StagingHandoff)
    assert fake_mps.instances == []  # blocking copies: no marker needed
    hosts = _on_comm_thread(h.acquire)
    assert hosts[0].data_ptr() != t.data_ptr()
    hosts[0].add_(1)
    _on_comm_thread(h.release)
    assert torch.equal(t, torch.full((4,), 2.0))


def test_staging_when_torch_has_no_alias_api(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    monkeypatch.setattr(torch.mps, "Event", FakeMpsEvent)
    monkeypatch.delattr(torch.mps, "_host_alias_storage", raising=False)
    with caplog.at_level("WARNING", logger="mccl.device"):
        a = MpsAdapter(unified=True)
    assert not a.unified and "2.13" in caplog.text
    h = a.prepare([torch.ones(3)], [True], [True])
    assert isinstance(h, StagingHandoff)


def test_storage_the_alias_refuses_is_staged(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    def refuse(storage):
        raise RuntimeError("not a shared MTLBuffer")

    monkeypatch.setattr(torch.mps, "Event", FakeMpsEvent)
    monkeypatch.setattr(torch.mps, "_host_alias_storage", refuse, raising=False)
    a = MpsAdapter(unified=True)
    with caplog.at_level("WARNING", logger="mccl.device"):
        h1 = a.prepare([torch.ones(3)], [True], [True])
        h2 = a.prepare([torch.ones(3)], [True], [True])
    assert isinstance(h1, StagingHandoff) and isinstance(h2, StagingHandoff)
    assert caplog.text.count("cannot be aliased") == 1


def test_adapter_for_mps_follows_the_unified_flag(fake_mps) -> None:
    dev = torch.device("mps")
    assert adapter_for(dev, unified=True).unified
    assert not adapter_for(dev, unified=False).unified
    assert mps_mod.alias_api() is fake_alias


# ---- end to end: real ranks, ops through the MPS adapter with fakes ----

def _mps_ops(rank: int, world: int, unified: bool) -> bool:
    import torch.distributed as dist

    import mccl.process_group as pg

    install_fake_mps(alias=True)
    adapter = MpsAdapter(unified=unified)
    pg.adapter_for = lambda device, unified=True: adapter
    t = torch.full((50_000,), float(rank + 1))  # ring path
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((50_000,), float(sum(range(1, world + 1)))))
    h = torch.full((7,), 0.25 * rank, dtype=torch.float16)
    dist.all_reduce(h, op=dist.ReduceOp.MAX)
    assert torch.equal(h, torch.full((7,), 0.25 * (world - 1), dtype=torch.float16))
    out = torch.empty(world * 2)
    dist.all_gather_into_tensor(out, torch.full((2,), float(rank)))
    assert torch.equal(out, torch.arange(world).float().repeat_interleave(2))
    # one tensor twice without a wait between: the second op reads the first one's result
    # (staging: its copy out waits for the first op's copy back)
    c = torch.ones(20_000)
    works = [dist.all_reduce(c, async_op=True) for _ in range(2)]
    for w in works:
        w.wait()
    assert torch.equal(c, torch.full((20_000,), float(world * world)))
    # strided tensors: unified host views keep the strides, so the result goes through a
    # contiguous copy and back into the shared storage
    base = torch.arange(12.0).view(3, 4)
    tr = (base * (rank + 1)).t()
    dist.all_reduce(tr)
    assert torch.equal(tr, (base * sum(range(1, world + 1))).t())
    col = torch.zeros(6, 2)
    dist.all_gather_into_tensor(col[:, 1], torch.full((3,), float(rank)))
    assert torch.equal(col[:, 1], torch.arange(world).float().repeat_interleave(3))
    assert not col[:, 0].any()
    events = len(FakeMpsEvent.instances)
    # a lazy neg view: an alias would expose its raw bytes (the values negated), so it is staged
    neg = torch._neg_view(torch.full((5,), float(rank + 1)))
    dist.all_reduce(neg, op=dist.ReduceOp.MAX)  # (a SUM of the raw bytes would pass)
    assert torch.equal(neg.resolve_neg(), torch.full((5,), -1.0))
    return events > 0 if unified else events == 0


@pytest.mark.parametrize("unified", [True, False], ids=["unified", "staging"])
def test_collectives_end_to_end_through_the_mps_adapter(unified: bool) -> None:
    assert all(run_ranks(_mps_ops, 2, unified))
