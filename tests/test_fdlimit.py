"""Groups under a low open-file limit: the soft limit is raised toward the hard one before a
group's sockets open, and where the hard limit leaves no room the group fails at once with a
clear error on every rank (instead of "Too many open files" mid-rendezvous)."""

from __future__ import annotations

import errno
import types

import pytest
import torch

from mccl.bench.spawn import run_ranks
from mccl.transport import fdlimit

INFINITY = -1  # the fake resource module's RLIM_INFINITY


class FakeLimits:
    """A stand-in for the ``resource`` module: one RLIMIT_NOFILE, with setrlimit calls kept."""

    RLIMIT_NOFILE = 7
    RLIM_INFINITY = INFINITY

    def __init__(self, soft: int, hard: int, refuse_above: int | None = None):
        self.limits = (soft, hard)
        self.calls: list[tuple[int, int]] = []
        self.refuse_above = refuse_above

    def getrlimit(self, which: int) -> tuple[int, int]:
        assert which == self.RLIMIT_NOFILE
        return self.limits

    def setrlimit(self, which: int, limits: tuple[int, int]) -> None:
        assert which == self.RLIMIT_NOFILE
        self.calls.append(limits)
        if self.refuse_above is not None and limits[0] > self.refuse_above:
            raise ValueError("not allowed to raise maximum limit")
        self.limits = limits


@pytest.fixture
def limits(monkeypatch: pytest.MonkeyPatch):
    """Install a FakeLimits with ``open_count`` fixed at 40."""

    def install(soft: int, hard: int, platform: str = "linux",
                refuse_above: int | None = None) -> FakeLimits:
        fake = FakeLimits(soft, hard, refuse_above)
        monkeypatch.setattr(fdlimit, "resource", fake)
        monkeypatch.setattr(fdlimit, "open_count", lambda: 40)
        monkeypatch.setattr(fdlimit, "sys", types.SimpleNamespace(platform=platform,
                                                                   maxsize=2**63 - 1))
        return fake

    return install


def test_a_limit_with_room_is_left_alone(limits) -> None:
    fake = limits(1024, 4096)
    fdlimit.make_room(100, "group g")
    assert fake.calls == []


@pytest.mark.parametrize("sockets,soft,hard,platform,want", [
    (100, 128, 4096, "linux", 256),            # doubled
    (600, 256, 4096, "linux", 704),            # the need (40 + 600) plus the headroom
    (100, 128, 200, "linux", 200),             # no higher than the hard limit
    (250, 256, INFINITY, "darwin", 512),       # macOS, unlimited hard limit
    (20000, 256, INFINITY, "darwin", 10240),   # ... but never above OPEN_MAX there
    (100, 128, INFINITY, "linux", 256),
])
def test_a_short_soft_limit_is_raised(limits, sockets: int, soft: int, hard: int,
                                      platform: str, want: int) -> None:
    fake = limits(soft, hard, platform)
    if 40 + sockets > want:
        with pytest.raises(OSError, match="open-file limit is 10240"):
            fdlimit.make_room(sockets, "group g")
    else:
        fdlimit.make_room(sockets, "group g")
    assert fake.calls == [(want, hard)]


def test_no_room_under_the_hard_limit_is_a_clear_error(limits) -> None:
    limits(256, 256)
    with pytest.raises(OSError) as e:
        fdlimit.make_room(300, "rank 3 of group 'default' (301 ranks)")
    assert e.value.errno == errno.EMFILE
    text = str(e.value)
    for words in ("rank 3 of group 'default' (301 ranks)", "300 more open files",
                  "40 are open", "limit is 256", "hard limit 256", "ulimit -n"):
        assert words in text


def test_a_refused_raise_still_leaves_what_fits(limits) -> None:
    """A platform that refuses the raise: fine while the sockets fit, else the clear error."""
    fake = limits(128, INFINITY, "darwin", refuse_above=128)
    fdlimit.make_room(60, "group g")  # 100 open then, under 128
    with pytest.raises(OSError, match="hard limit unlimited"):
        fdlimit.make_room(100, "group g")
    assert fake.limits == (128, INFINITY) and len(fake.calls) == 2


@pytest.mark.parametrize("soft,hard,platform,want", [
    (256, INFINITY, "darwin", (256, "unlimited", 10240 - 40 - 4 + 1)),
    (256, 4096, "linux", (256, 4096, 4096 - 40 - 4 + 1)),
    (8192, 8192, "darwin", (8192, 8192, 8192 - 40 - 4 + 1)),
    (INFINITY, INFINITY, "linux", ("unlimited", "unlimited", None)),
])
def test_the_doctor_is_told_the_largest_group_that_fits(limits, soft, hard, platform,
                                                        want) -> None:
    limits(soft, hard, platform)
    got = fdlimit.summary()
    assert (got["soft"], got["hard"], got["largest_group"]) == want and got["open"] == 40


def test_open_descriptors_are_counted() -> None:
    import os

    before = fdlimit.open_count()
    r, w = os.pipe()
    try:
        assert fdlimit.open_count() == before + 2
    finally:
        os.close(r)
        os.close(w)


def _groups_under_a_low_limit(rank: int, w: int, groups: int) -> tuple:
    import resource

    import torch.distributed as dist

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = fdlimit.open_count() + 10  # room for one group of w ranks, not for `groups`
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    sums = []
    for i in range(groups):
        g = dist.new_group(list(range(w)))
        t = torch.full((1000,), float(rank + i))
        dist.all_reduce(t, group=g)
        sums.append(t[0].item())
    raised = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return sums, raised > low


def test_groups_beyond_a_low_soft_limit_raise_it() -> None:
    w, groups = 4, 4
    results = run_ranks(_groups_under_a_low_limit, w, groups, timeout=120)
    want = [float(sum(range(w)) + w * i) for i in range(groups)]
    for sums, raised in results:
        assert sums == want and raised


def _a_group_beyond_the_hard_limit(rank: int, w: int) -> str:
    import resource

    import torch.distributed as dist

    tight = fdlimit.open_count() + 3  # fewer than a group of w ranks needs
    resource.setrlimit(resource.RLIMIT_NOFILE, (tight, tight))
    try:
        dist.new_group(list(range(w)))
        error = "no error"
    except OSError as e:
        error = str(e)
    dist.barrier()  # the default group still works (rank 0 keeps the store up meanwhile)
    return error


def test_a_group_beyond_the_hard_limit_fails_clearly_on_every_rank() -> None:
    w = 3
    for error in run_ranks(_a_group_beyond_the_hard_limit, w, timeout=120):
        assert "more open files (one socket per peer)" in error, error
        assert "ulimit -n" in error and f"({w} ranks)" in error
