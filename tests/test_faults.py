"""Never hang, never corrupt, on real processes: dead (kill -9), stalled (SIGSTOP) and
unplugged peers, abort, collective mismatches at 2, 3 and 4 ranks, and bad input.

Each test is one spawned run that goes through several scenarios on fresh subgroups, to keep
the suite fast. Time to error is recorded but never asserted: the only timing assertion is that
errors arrive before run_ranks' hard timeout.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest

from mccl.bench.spawn import free_port, run_ranks

#: Group timeout of the groups in which a peer stalls.
STALL_TIMEOUT_S = 5.0


def _storm(rank: int, group, name: str, victim: int, act) -> dict:
    """All-reduce 4 MB (ring path) until it fails; ``act`` runs on the victim's side thread
    mid-collective. Returns how and when this rank's op failed."""
    import torch
    import torch.distributed as dist

    from mccl import CollectiveError

    store = dist.distributed_c10d._get_default_store()
    key = f"fault/{name}"
    if rank == victim:
        def fire() -> None:
            time.sleep(0.3)
            store.set(key, repr(time.time()))
            act()

        threading.Thread(target=fire, daemon=True).start()
    t = torch.ones(1 << 20)
    try:
        for _ in range(100_000):
            dist.all_reduce(t, group=group)
    except CollectiveError as e:
        failed_at = time.time()
        return {"peer": e.peer, "op": e.op, "msg": str(e),
                "after_s": failed_at - float(store.get(key).decode())}
    return {"msg": "no error"}


def _faults(rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist

    from mccl import CollectiveError

    pids: list = [None] * world
    dist.all_gather_object(pids, os.getpid())
    everyone = list(range(world))
    short = timedelta(seconds=STALL_TIMEOUT_S)
    g_stop = dist.new_group(everyone, timeout=short)
    g_link = dist.new_group(everyone, timeout=short)
    g_abort = dist.new_group(everyone)
    g_kill = dist.new_group(everyone, timeout=short)
    out: dict = {}

    # 1. Rank 2 is stopped (SIGSTOP) mid-collective; rank 0 resumes it once all failed.
    store = dist.distributed_c10d._get_default_store()
    out["stop"] = _storm(rank, g_stop, "stop", 2, lambda: os.kill(os.getpid(), signal.SIGSTOP))
    if rank != 2:
        store.set(f"stop/done/{rank}", "1")
    if rank == 0:
        store.wait([f"stop/done/{r}" for r in everyone if r != 2])
        os.kill(pids[2], signal.SIGCONT)
    dist.barrier()  # the default group survives: it did not depend on rank 2 meanwhile

    # 2. Rank 1's link to rank 2 drops mid-collective.
    out["link"] = _storm(rank, g_link, "link", 1,
                         lambda: g_link._mesh.peer(2).sock.shutdown(2))  # SHUT_RDWR
    dist.barrier()

    # 3. Abort unblocks a receive nobody answers and the op queued behind it.
    if rank == 0:
        t = torch.zeros(4)
        w1 = dist.irecv(t, src=1, group=g_abort)
        w2 = dist.all_reduce(torch.ones(4), group=g_abort, async_op=True)
        futs = [w1.get_future(), w2.get_future()]  # asked for before the failure
        threading.Timer(0.3, g_abort.abort).start()
        res = []
        for w, fut in zip((w1, w2), futs, strict=True):
            try:
                w.wait()
                res.append("no error")
            except CollectiveError as e:
                res.append(str(e))
            # the moment wait() raised, the Work and its Future say so (as on gloo)
            out.setdefault("done_when_raised", []).append(
                (w.is_completed(), w.is_success(), fut.done()))
        try:
            dist.all_reduce(torch.ones(4), group=g_abort)
            res.append("no error")
        except CollectiveError as e:
            res.append(str(e))
        out["abort"] = res
    dist.barrier()

    # 4. Rank 3 is killed (kill -9) mid-collective; ranks 0 and 1 are not its ring neighbours.
    out["kill"] = _storm(rank, g_kill, "kill", 3, lambda: os.kill(os.getpid(), signal.SIGKILL))

    # The survivors tear down cleanly and no mccl thread is left behind.
    t0 = time.monotonic()
    dist.destroy_process_group()
    out["destroy_s"] = time.monotonic() - t0
    time.sleep(0.5)
    out["threads"] = [t.name for t in threading.enumerate()  # (mccl-complete: process-wide)
                      if t.name.startswith(("mccl-comm", "mccl-send", "mccl-accept"))]
    return out


def test_dead_stalled_and_unplugged_peers() -> None:
    res = run_ranks(_faults, 4, timeout=240, pg_timeout_s=60, expect_missing=(3,))
    assert res[3] is None
    for rank in (0, 1):  # rank 2 was the one stopped, rank 3 is dead by now
        stop = res[rank]["stop"]
        assert stop["peer"] == 2 and stop["op"] == "all_reduce", stop
        assert "rank 2" in stop["msg"] and "group timeout" in stop["msg"], stop
    for rank in (0, 1, 2):
        r = res[rank]
        kill = r["kill"]
        assert kill["peer"] == 3 and "rank 3" in kill["msg"], kill
        assert "killed" in kill["msg"] or "reset" in kill["msg"] or "closed" in kill["msg"], kill
        assert r["threads"] == [], r["threads"]
    # Rank 2 hears that the others gave up on it: its own message does not name a peer at
    # fault (the report it forwards, another rank's, does name rank 2).
    victim = res[2]["stop"]
    head = victim["msg"].split(": ", 1)[0]
    assert victim["peer"] == 2 and "gave up on rank 2" in victim["msg"], victim
    assert head.endswith("failed [blamed on this rank by a peer]"), victim
    for rank in range(3):
        link = res[rank]["link"]
        assert link["peer"] in (1, 2) and "all_reduce" in link["msg"], link
        assert "failed" in res[rank]["stop"]["msg"]
    aborted = res[0]["abort"]
    assert all("abort" in m for m in aborted), aborted
    assert res[0]["done_when_raised"] == [(True, False, True)] * 2, res[0]["done_when_raised"]


# ---------------------------------------------------------------- mismatch and bad input

def _cases(rank: int):
    """name -> (normal op, odd op); each op returns a check of its own result (or None)."""
    import torch
    import torch.distributed as dist

    R = dist.ReduceOp
    big = 100_000

    def ar(n, dtype=torch.float32, op=R.SUM):
        def f(g):
            t = torch.full((n,), rank + 1, dtype=dtype)
            dist.all_reduce(t, op=op, group=g)
            w = dist.get_world_size(g)
            want = w * (w + 1) // 2 if op == R.SUM else w
            return bool((t == want).all())
        return f

    def bc(n, root):
        def f(g):
            t = torch.full((n,), float(dist.get_rank(g) == root))
            dist.broadcast(t, group_src=root, group=g)
            return bool((t == 1).all())
        return f

    def ag(n):
        def f(g):
            outs = [torch.empty(n) for _ in range(dist.get_world_size(g))]
            dist.all_gather(outs, torch.full((n,), float(dist.get_rank(g))), group=g)
            return all(bool((o == i).all()) for i, o in enumerate(outs))
        return f

    def arc(n, dtype=torch.complex64):  # as torch hands it over: its real view
        def f(g):
            t = torch.full((n,), complex(rank + 1, 1), dtype=dtype)
            dist.all_reduce(t, group=g)
            w = dist.get_world_size(g)
            return bool((t == complex(w * (w + 1) // 2, w)).all())
        return f

    def ga(n, root):
        def f(g):
            me = dist.get_rank(g)
            outs = [torch.empty(n) for _ in range(dist.get_world_size(g))] if me == root else None
            dist.gather(torch.full((n,), float(me)), outs, group_dst=root, group=g)
            return outs is None or all(bool((o == i).all()) for i, o in enumerate(outs))
        return f

    def a2a(from_0: int, to_last: int = 2):  # splits of 2 rows, but for rank 0 -> last
        def f(g):
            w, me = dist.get_world_size(g), dist.get_rank(g)
            ins, outs = [2] * w, [2] * w
            if me == 0:
                ins[-1] = to_last
            if me == w - 1:
                outs[0] = from_0
            out = torch.full((sum(outs),), -1.0)
            dist.all_to_all_single(out, torch.full((sum(ins),), float(me)), outs, ins, group=g)
            want = torch.cat([torch.full((k,), float(src)) for src, k in enumerate(outs)])
            return torch.equal(out, want)
        return f

    def arcoal(sizes):  # one total, split into tensors differently on the odd rank
        def f(g):
            ts = [torch.full((k,), float(10 ** i * (rank + 1))) for i, k in enumerate(sizes)]
            dist.all_reduce_coalesced(ts, group=g)
            w = dist.get_world_size(g)
            return all(bool((t == 10 ** i * w * (w + 1) // 2).all()) for i, t in enumerate(ts))
        return f

    return {
        "op": (ar(8), bc(8, 0)),
        "op_ring": (ar(big), ag(big // 4)),
        "count": (ar(8), ar(12)),
        "count_ring": (ar(big), ar(big + 4)),
        "count_zero": (ar(8), ar(0)),
        "dtype": (ar(8), ar(8, torch.int32)),
        "dtype_complex": (arc(4), arc(4, torch.complex128)),
        "redop": (ar(8), ar(8, op=R.MAX)),
        # (before, only the total was signed: the odd rank's tensors took the others' sums)
        "coalesced_split": (arcoal([2, 3]), arcoal([3, 2])),
        "root": (bc(8, 0), bc(8, 1)),
        "root_gather": (ga(8, 0), ga(8, 1)),
        "count_gather": (ga(8, 0), ga(0, 0)),
        # the last rank expects another count from rank 0 than rank 0 sends it
        "splits": (a2a(2), a2a(3)),
        "splits_to_zero": (a2a(2), a2a(0)),
        "splits_from_zero": (a2a(0, to_last=0), a2a(2, to_last=0)),
    }


def _bad_inputs(rank: int, w: int):
    """name -> (call that must raise on every rank, words its message must contain)."""
    import torch
    import torch.distributed as dist

    o = torch.ones
    return {
        "meta device": (lambda: dist.all_reduce(o(4, device="meta")), ["meta"]),
        "mixed devices": (lambda: dist.all_gather([o(2)] * w, o(2, device="meta")),
                          ["devices"]),
        "dtype": (lambda: dist.all_reduce(o(4).to(torch.float8_e4m3fn)), ["dtype", "float8"]),
        "op": (lambda: dist.all_reduce(o(4), op=dist._make_nccl_premul_sum(2.0)),
               ["PREMUL_SUM"]),
        "op/dtype": (lambda: dist.all_reduce(o(4), op=dist.ReduceOp.BXOR), ["BXOR", "float32"]),
        "list length": (lambda: dist.all_gather([o(2)] * (w + 1), o(2)), ["list", str(w)]),
        "scatter list": (lambda: dist.reduce_scatter(o(2), [o(2)] * (w - 1)), ["list"]),
        "all_to_all list": (lambda: dist.all_to_all([o(2)] * w, [o(2)] * (w + 1)), ["inputs"]),
        "output size": (lambda: dist.all_gather_into_tensor(o(2 * w + 1), o(2)),
                        ["output", "elements"]),
        "input size": (lambda: dist.reduce_scatter_tensor(o(2), o(2 * w + 3)),
                       ["input", "elements"]),
        "splits": (lambda: dist.all_to_all_single(o(2 * w), o(2 * w), [1] * (w + 1)),
                   ["split"]),
        "expanded": (lambda: dist.all_reduce(o(1).expand(4)), ["expanded", "(4,)"]),
        "expanded output": (lambda: dist.all_gather([o(1).expand(4)] * w, o(4)),
                            ["expanded"]),
        "root": (lambda: dist.broadcast(o(2), src=w + 3), []),
        "recv from self": (lambda: dist.recv(o(2), src=rank), ["itself"]),
        "nested": (lambda: dist.all_reduce(torch.nested.nested_tensor([o(2), o(3)])),
                   ["nested"]),
        "tag range": (lambda: dist.send(o(2), dst=(rank + 1) % w, tag=1 << 40), ["tag"]),
        # (before: a float rank failed deep inside, a float split size was truncated)
        "float peer": (lambda: dist.send(o(2), dst=float((rank + 1) % w)),
                       ["TypeError", "peer rank must be an int"]),
        "float tag": (lambda: dist.send(o(2), dst=(rank + 1) % w, tag=1.5),
                      ["TypeError", "tag must be an int"]),
        "float splits": (lambda: dist.all_to_all_single(o(2 * w), o(2 * w), [2.0] * w),
                         ["TypeError", "output split size must be an int", "2.0"]),
    }


def _next_all_reduce_wrong(rank: int, world: int) -> str:
    """After an error: an all-reduce on the group; "" where it is still in step and usable
    (the sum is right), else what it gave."""
    import torch
    import torch.distributed as dist

    s = torch.full((3,), float(rank))
    dist.all_reduce(s)
    return "" if bool((s == world * (world - 1) / 2).all()) else f"all_reduce gave {s.tolist()}"


def _mismatch_and_bad_input(rank: int, world: int) -> dict:
    import torch.distributed as dist

    out: dict = {"mismatch": [], "bad": []}
    for name, (normal, odd) in _cases(rank).items():
        for n in (2, 3, 4):
            g = dist.new_group(list(range(n)), timeout=timedelta(seconds=30))
            if rank >= n:
                continue
            me = dist.get_rank(g)
            t0 = time.monotonic()
            op_ok, at, msg, peer = None, "op", "", None
            try:
                op_ok = (odd if me == n - 1 else normal)(g)
                at = "next op"
                dist.barrier(group=g)
                at = "none"
            except Exception as e:  # noqa: BLE001
                msg, peer = str(e), getattr(e, "peer", None)
            out["mismatch"].append((name, n, me, op_ok, at, time.monotonic() - t0, msg, peer))

    for name, (call, words) in _bad_inputs(rank, world).items():
        try:
            call()
            err = "NO ERROR"
        except (TypeError, ValueError, RuntimeError) as e:
            err = f"{type(e).__name__}: {e}"
        usable = not _next_all_reduce_wrong(rank, world)  # still usable after every error
        out["bad"].append((name, words, err, usable))
    return out


#: Mismatch cases whose odd op differs from the others' in what an error frame carries of it
#: (op, dtype, reduce op, count; not a root, an all-to-all's splits or a coalesced
#: all-reduce's split).
SIGNED_APART = ("op", "op_ring", "count", "count_ring", "dtype", "dtype_complex", "redop",
                "count_gather", "root_gather")


@pytest.fixture(scope="module")
def mismatch_run() -> list[dict]:
    return run_ranks(_mismatch_and_bad_input, 4, timeout=240, pg_timeout_s=60)


def test_mismatch_every_rank_errors(mismatch_run) -> None:
    """Ranks that issue different ops, counts, dtypes, reduce ops or roots at one sequence
    number all get an error naming the mismatch, at 2, 3 and 4 ranks with one odd rank. In an
    op without a root, a rank whose part needed nothing from others may complete it; its
    result is then right, and its next op on the group raises. Ops with a root fail on every
    rank. A rank receiving a part of another count than it expects (all_to_all_single's
    splits, zero on either side included) fails in that op."""
    rows = [row for r in mismatch_run for row in r["mismatch"]]
    assert len(rows) == len(_cases(0)) * (2 + 3 + 4)
    for name, n, me, op_ok, at, _, msg, peer in rows:
        where = f"{name} at {n} ranks, rank {me}"
        if name in SIGNED_APART and n >= 3 and me != n - 1 and at == "op":
            # the odd rank's op differs in its signature: the others name it, not each other
            # (before, one of them read "blamed on this rank")
            assert peer == n - 1, f"{where}: names rank {peer}: {msg}"
        assert at != "none", f"{where}: no error"
        assert "collective mismatch" in msg and "rank" in msg, f"{where}: {msg}"
        # a forwarded mismatch carries its own text, not the detecting rank's wrapper
        assert msg.count(" failed [") <= 1, f"{where}: nested: {msg}"
        assert op_ok in (None, True), f"{where}: the op returned a wrong result"
        if name.startswith("root"):  # every rank waits for all to join an op with a root
            assert at == "op", f"{where}: the op itself did not fail ({msg})"
        if name.startswith("splits") and me == n - 1:  # it receives the odd part: it knows
            assert at == "op", f"{where}: the receiver's op did not fail ({msg})"


def test_bad_input_is_clear_and_group_stays_usable(mismatch_run) -> None:
    for rank, r in enumerate(mismatch_run):
        for name, words, err, usable in r["bad"]:
            assert err != "NO ERROR", f"rank {rank}: {name} did not raise"
            for w in words:
                assert w in err, f"rank {rank}: {name}: {w!r} not in {err!r}"
            assert usable, f"rank {rank}: group unusable after {name}"


def _issued_in_different_orders(rank: int, world: int) -> str:
    """Rank 0 waits for a message from rank 1 before its all-reduce, rank 1 sends it after
    its own: each waits for the other (an irecv posted there instead would not block)."""
    import torch
    import torch.distributed as dist

    try:
        if rank == 0:
            got = torch.zeros(3)
            dist.recv(got, 1)
            dist.all_reduce(torch.ones(2))
        else:
            dist.all_reduce(torch.ones(2))
            dist.send(torch.arange(3.0), 0)
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        return str(e)
    return "NO ERROR"


def test_ranks_waiting_on_each_other_are_told_so() -> None:
    """The group timeout's message says the silent peer reported waiting for this rank, so
    a user sees an ordering problem rather than a dead or slow peer. Either rank may time
    out first; the other then gets its error frame, which carries the same explanation."""
    msgs = run_ranks(_issued_in_different_orders, 2, timeout=120, pg_timeout_s=3)
    for rank, msg in enumerate(msgs):
        assert "group timeout" in msg and "each waits for the other" in msg, f"{rank}: {msg}"
    assert any(f"rank {1 - r} last reported waiting for rank {r}" in m
               for r, m in enumerate(msgs)), msgs


#: Scenarios of ``_unread_at_shutdown``: op after a normal all-reduce, then the group is
#: destroyed with no later op that could trip over the stray data.
UNREAD_CASES = ("extra op", "unreceived send", "clean")


def _unread_at_shutdown(rank: int, world: int) -> dict[str, list[str]]:
    """Per scenario, on a fresh subgroup: what this rank's 'mccl' logger reported at ERROR
    while the group was destroyed."""
    import logging
    import warnings

    import torch
    import torch.distributed as dist

    found: dict[str, list[str]] = {}
    kept: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            kept.append(record.getMessage())

    keep = Keep(logging.ERROR)
    logging.getLogger("mccl").addHandler(keep)
    for case in UNREAD_CASES:
        g = dist.new_group(list(range(world)))
        t = torch.full((4,), float(rank))
        dist.all_reduce(t, group=g)
        lone = None
        if case == "extra op":  # only rank 0 issues it: it sends, and waits for the peers
            if rank == 0:
                lone = dist.all_to_all_single(torch.empty(0), torch.ones(world - 1),
                                              output_split_sizes=[0] * world,
                                              input_split_sizes=[0] + [1] * (world - 1),
                                              group=g, async_op=True)
            dist.barrier()  # (sent before any peer says BYE: a send after it raises)
        elif case == "unreceived send":
            if rank == 0:
                dist.send(t, dst=1, group=g)
            # rank 1 shuts down only after the message went out: a send to a peer that has
            # already said BYE raises (Mesh.check_open) instead of leaving stray data
            dist.barrier()
        elif case == "clean":
            dist.broadcast(t, src=0, group=g)
        kept.clear()
        dist.destroy_process_group(g)
        found[case] = list(kept)
        if lone is not None:  # it cannot complete: the peers never issued it
            try:
                lone.wait()
                found["lone op"] = "completed"
            except Exception as e:  # noqa: BLE001
                found["lone op"] = f"{type(e).__name__}: {e}"
    # no logging set up that would show the 'mccl' logger: a RuntimeWarning instead
    logging.getLogger("mccl").removeHandler(keep)

    def stray(g) -> None:  # every rank sends its neighbour a message nobody receives
        dist.send(torch.zeros(4), dst=(rank + 1) % world, group=g)
        dist.barrier()

    g = dist.new_group(list(range(world)))
    stray(g)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.destroy_process_group(g)
    found["warned"] = [str(w.message) for w in caught if w.category is RuntimeWarning]
    # warnings made errors (python -W error): the finding must not make the destroy raise
    g = dist.new_group(list(range(world)))
    stray(g)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist.destroy_process_group(g)
    return found


@pytest.mark.parametrize("world", [2, 3])
def test_stray_data_is_reported_at_shutdown(world: int) -> None:
    """Data nobody reads: an all-to-all issued by rank 0 alone (it fails there once the
    peers leave: it waits for their parts, empty ones too), a send nobody receives (it
    completes); with no later op the data would go unread silently.
    Destroying the group reads what the peers sent up to their BYE and logs each finding as an
    error (a RuntimeWarning where no logging shows the 'mccl' logger); a clean group reports
    nothing."""
    found = run_ranks(_unread_at_shutdown, world, timeout=120)
    for rank, by_case in enumerate(found):
        assert by_case["clean"] == [], f"rank {rank}: {by_case['clean']}"
        warned = by_case["warned"]
        assert warned and all("never received" in m for m in warned), (rank, warned)
        extra = by_case["extra op"]
        if rank == 0:  # its lone op fails as its peers leave, it does not complete
            assert all("shut the group down while rank 0 still waits" in m for m in extra), \
                extra
            assert by_case["lone op"].startswith("CollectiveError"), by_case["lone op"]
            assert "shut the group down" in by_case["lone op"], by_case["lone op"]
        else:
            assert len(extra) == 1 and "rank 0 issued op #2" in extra[0], extra
            assert "never issued" in extra[0], extra
        sent = by_case["unreceived send"]
        if rank == 1:
            assert len(sent) == 1 and "point-to-point message" in sent[0], sent
            assert "never received" in sent[0] and "rank 0 sent rank 1" in sent[0], sent
        else:
            assert sent == [], sent


# ---------------------------------------------------------------- peers that went away

def _departures(rank: int, world: int) -> dict:
    """Rank 0's view of peers that left or stopped reading, each on a fresh subgroup; the
    last scenario leaves the default group's subgroup counters apart, so it comes last."""
    import torch
    import torch.distributed as dist

    from mccl import CollectiveError

    out: dict = {}
    short = timedelta(seconds=1)

    def attempt(fn) -> str:
        try:
            fn()
        except CollectiveError as e:
            return str(e)
        return "NO ERROR"

    # 1. A send to a peer that has shut the group down: an error, not a message lost.
    g = dist.new_group([0, 1])
    if rank == 1:
        dist.destroy_process_group(g)
    dist.barrier()
    if rank == 0:
        time.sleep(0.5)  # its BYE has arrived
        out["send after bye"] = attempt(lambda: dist.send(torch.ones(4), 1, group=g))
    dist.barrier()
    # ... and a collective whose root only sends (gloo raises too)
    g = dist.new_group([0, 1])
    if rank == 1:
        dist.destroy_process_group(g)
    dist.barrier()
    if rank == 0:
        time.sleep(0.5)
        out["broadcast after bye"] = attempt(lambda: dist.broadcast(torch.ones(4), 0, group=g))
    dist.barrier()

    # 2. A mismatched broadcast fails on both ranks, the root too; after the peer's
    # connections closed (ERROR_LINGER_S later) the next op names the mismatch, not a broken
    # pipe. On ranks 1 and 2, so the messages carry global ranks too.
    g = dist.new_group([1, 2])
    if rank in (1, 2):
        n = 4 if rank == 1 else 6  # broadcast from group rank 0 with different counts
        first = attempt(lambda: dist.broadcast(torch.ones(n), src=1, group=g))
        if rank == 1:
            time.sleep(4.0)  # rank 2's error frame is here and its sockets are closed
            out["after mismatch"] = (first, attempt(
                lambda: dist.all_reduce(torch.ones(1 << 18), group=g)))
    dist.barrier()

    # 3. A send to a peer that stopped reading (its group idle, 64 MB queued): the sender's
    # error says so within twice the group timeout, not a raw errno.
    g = dist.new_group([0, 1], timeout=short)
    if rank == 0:
        out["send to a silent peer"] = attempt(
            lambda: dist.send(torch.ones(16 << 20), 1, group=g))
    dist.barrier()

    # 4. Ctrl-C while blocked in a collective reaches the caller as KeyboardInterrupt.
    g = dist.new_group([0, 1], timeout=timedelta(seconds=30))
    if rank == 0:
        # A shell's background job starts with SIGINT ignored, and its children inherit that:
        # take Python's own Ctrl-C handler, as an interactive run has it.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        try:
            dist.all_reduce(torch.ones(4), group=g)
            out["ctrl-c"] = "NO ERROR"
        except KeyboardInterrupt:
            out["ctrl-c"] = "KeyboardInterrupt"
        except Exception as e:  # noqa: BLE001
            out["ctrl-c"] = f"{type(e).__name__}: {e}"
    if rank == 1:
        time.sleep(1.5)
        attempt(lambda: dist.all_reduce(torch.ones(4), group=g))
    dist.barrier()

    # 5. A rank that never joins a new group: the others fail within that group's timeout,
    # naming it (not after the default group's timeout).
    if rank != 2:
        try:
            dist.new_group([0, 1, 2], timeout=timedelta(seconds=2))
            out["join"] = "NO ERROR"
        except Exception as e:  # noqa: BLE001
            out["join"] = str(e)
    dist.barrier()
    # 6. ... and when it does create the group, after they gave up: it hears at once that
    # they had stopped waiting, and why (not that they "did not join": they never got to
    # publish the keys it waits for).
    if rank == 2:
        try:
            dist.new_group([0, 1, 2], timeout=timedelta(seconds=2))
            out["late join"] = "NO ERROR"
        except Exception as e:  # noqa: BLE001
            out["late join"] = str(e)
    dist.barrier()  # rank 0 holds the store: it stays until rank 2 is done with it
    return out


def test_peers_that_went_away_or_stopped_reading() -> None:
    res = run_ranks(_departures, 3, timeout=180, pg_timeout_s=120)
    r0, r1 = res[0], res[1]
    assert "rank 1 has shut the group down" in r0["send after bye"], r0
    assert "rank 1 has shut the group down" in r0["broadcast after bye"], r0
    first, after = r1["after mismatch"]
    assert "collective mismatch" in first, first  # the root waits for all to join: it fails
    assert "collective mismatch" in after and "(global rank 1)" in after, after
    assert "accepted no data" in r0["send to a silent peer"], r0
    assert r0["ctrl-c"] == "KeyboardInterrupt", r0
    for r in (r0, r1):
        assert "did not join" in r["join"] and "[2]" in r["join"], r["join"]
    late = res[2]["late join"]
    # at once, with their reason, instead of after its own timeout
    assert "cannot form: a rank stopped waiting" in late, late
    assert "rank(s) [2] did not join" in late, late


def _late_but_alive(rank: int, world: int) -> str:
    """Rank 0's receive waits longer than the group timeout while both ranks keep running
    collectives together; the message comes after them. The sender is alive all along."""
    import torch
    import torch.distributed as dist

    got = torch.zeros(4)
    w = dist.irecv(got, src=1) if rank == 0 else None
    try:
        for _ in range(5):
            dist.barrier()
            time.sleep(0.6)  # 3 s in all, the group timeout is 2 s
        if rank == 1:
            dist.send(torch.ones(4), dst=0)
        else:
            w.wait()
            assert torch.equal(got, torch.ones(4)), got
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        return str(e)
    return "ok"


def test_a_posted_receive_times_out_only_when_the_group_goes_quiet() -> None:
    assert run_ranks(_late_but_alive, 2, timeout=60, pg_timeout_s=2) == ["ok", "ok"]


def _any_source_after_a_departure(rank: int, world: int) -> dict | None:
    """Rank 1 leaves cleanly while ranks 0 and 2 receive from any peer: nobody sends, so they
    time out (as gloo does); the error blames no rank and says who left. Rank 2 starts late,
    so rank 0's error frame reaches it first: forwarded, it still blames nobody."""
    import torch
    import torch.distributed as dist

    from mccl import CollectiveError

    dist.barrier()
    if rank == 1:
        dist.destroy_process_group()
        return None
    if rank == 2:
        time.sleep(1.5)
    try:
        dist.recv(torch.empty(2))
    except CollectiveError as e:
        return {"msg": str(e), "peer": e.peer}
    return {"msg": "no error", "peer": None}


def test_an_any_source_receive_that_times_out_blames_nobody_and_names_who_left() -> None:
    res = run_ranks(_any_source_after_a_departure, 3, timeout=90, pg_timeout_s=3)
    for r in (res[0], res[2]):
        assert "from any rank" in r["msg"] and "rank 1 shut the group down" in r["msg"], r
        assert "blamed on this rank" not in r["msg"] and r["peer"] is None, r


def _later_than_the_timeout(rank: int, world: int, size: int) -> str:
    """Rank 1 comes to an all-reduce after the others gave up waiting for it (group timeout
    2 s); everything they sent before that waits in its sockets."""
    import torch
    import torch.distributed as dist

    from mccl import CollectiveError

    # On 3 ranks a small all-reduce has rank 2 wait on rank 0 alone, and rank 0 on rank 1:
    # rank 2 names rank 1 only once rank 0's probe (or its error) reached it (the probe race
    # of 602b4cb failed this test on loaded machines). A barrier first (op #1) lines the ranks
    # up; rank 2 then comes 0.5 s after rank 0.
    dist.barrier()
    if rank == 1:
        time.sleep(4.5)
    elif rank == 2:
        time.sleep(0.5)
    t = torch.ones(size)
    try:
        dist.all_reduce(t)
    except CollectiveError as e:
        return str(e)
    return f"no error, sum {t[0].item()}"


@pytest.mark.parametrize("size", [1, 1000, 70_000])
def test_a_rank_later_than_the_timeout_fails_the_op_its_peers_failed(size: int) -> None:
    """Before: the late rank found its peers' data (sent before they timed out) in its
    sockets, returned the full sum, and heard of their failure only at its next op."""
    res = run_ranks(_later_than_the_timeout, 3, size, timeout=60, pg_timeout_s=2)
    late = res[1]
    assert "op #2" in late and "gave up on rank 1" in late, late
    for rank in (0, 2):
        assert "op #2" in res[rank] and "rank 1" in res[rank], res[rank]


def _a_wait_that_times_out(rank: int, world: int) -> list[str]:
    import torch
    import torch.distributed as dist

    if rank == 1:
        time.sleep(2.5)  # its peer's ops wait for it meanwhile
    first = dist.all_reduce(torch.ones(1000), async_op=True)
    second = dist.all_reduce(torch.ones(10), async_op=True)
    said = []
    if rank == 0:
        for work in (second, first):
            try:
                work.wait(timeout=timedelta(seconds=1.2))
                said.append("completed")
            except Exception as e:  # noqa: BLE001 - the message is what is checked
                said.append(f"{type(e).__name__}: {e}")
    first.wait()
    second.wait()
    return said


def test_a_wait_that_times_out_says_what_the_op_waits_for() -> None:
    """``work.wait(timeout)`` that runs out names what the op is doing: queued behind the
    running op, which waits for a silent rank (here rank 1, 2.5 s late), or running itself;
    the op goes on and completes once the rank comes."""
    said = run_ranks(_a_wait_that_times_out, 2, timeout=60)[0]
    assert said[0].startswith("CollectiveError: mccl all_reduce: wait() timed out after 1.2s "
                              "(op #2 is queued behind op #1, which is running and waits for "
                              "rank 1, silent for "), said
    assert said[1] == "completed" or said[1].startswith(
        "CollectiveError: mccl all_reduce: wait() timed out after 1.2s (op #1 is running and "
        "waits for rank 1"), said


def _shorter_timeout(rank: int, world: int) -> str:
    """The group starts with a 60 s timeout; ``set_timeout`` shortens it to 2 s on both ranks.
    Rank 1 then joins an all-reduce 6 s late: rank 0 must give up on it after the new timeout
    (with the old one the late rank would arrive in time and the op would succeed)."""
    import torch
    import torch.distributed as dist

    pg = dist.group.WORLD
    for bad in (timedelta(0), 5):
        try:
            pg.set_timeout(bad)
            return f"set_timeout({bad!r}) was accepted"
        except (TypeError, ValueError) as e:
            assert "timeout" in str(e), e
    pg.set_timeout(timedelta(seconds=2))
    if rank == 1:
        time.sleep(6)
    try:
        dist.all_reduce(torch.ones(4))
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        return str(e)
    return "ok"


def test_set_timeout_applies_to_later_ops() -> None:
    r0, _ = run_ranks(_shorter_timeout, 2, timeout=60, pg_timeout_s=60)
    # Rank 1 may still finish its op: rank 0's part of it was sent before rank 0 gave up.
    # (With the 60 s timeout rank 0's op would succeed once rank 1 joins after 6 s. The
    # seconds the message gives are measured, so a slow machine may read 3s: not checked.)
    assert "no data from rank 1 for" in r0 and "(group timeout)" in r0, r0


# ---------------------------------------------------------------- leaving without destroy

_EXIT_SCRIPT = r'''
import sys, time, threading
from datetime import timedelta
import torch, torch.distributed as dist
import mccl
rank, port = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("mccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=2, timeout=timedelta(seconds=20))
store = dist.distributed_c10d._get_default_store()

def slow(fut):
    time.sleep(0.3)  # still running when the interpreter exits
    return fut.value()

w = dist.all_reduce(torch.ones(1000), async_op=True)
w.get_future().then(slow)
w.wait()
if rank == 1:
    store.set("leaving", "1")
    sys.exit(0)  # no destroy_process_group, a callback still running
store.wait(["leaving"])
time.sleep(1.0)
try:
    dist.send(torch.ones(4), 1)
    print("RESULT NO ERROR", flush=True)
except Exception as e:
    print("RESULT", e, flush=True)
'''


def _run_script_ranks(path, text: str, world: int) -> tuple[list[int], list[str]]:
    """Run ``text`` as ``world`` processes (argv: rank, port of rank 0's tcp:// store), each
    within 90 s; their exit codes and outputs (stdout and stderr together)."""
    path.write_text(text)
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(path), str(r), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=90)[0])
    finally:
        for p in procs:
            p.kill()
    return [p.returncode for p in procs], outs


def test_leaving_without_destroy_exits_cleanly_and_tells_the_peers(tmp_path) -> None:
    """A process that exits without destroy_process_group, a Future callback of mccl's still
    running: it exits with status 0 (a daemon completer thread cut off inside the callback
    aborted the process), and its peers hear it has gone (a send to it was lost)."""
    codes, outs = _run_script_ranks(tmp_path / "leave.py", _EXIT_SCRIPT, 2)
    assert codes == [0, 0], outs
    assert ("RESULT mccl send (p2p) on rank 0 of group '0' failed [peer rank 1]: peer failure: "
            "rank 1 has shut the group down") in outs[0], outs[0]


_STORE_HOST_LEAVES_SCRIPT = r'''
import os, signal, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
import mccl
rank, port = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("mccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=3, timeout=timedelta(seconds=20))
dist.all_reduce(torch.ones(4))
if rank == 2:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
try:
    if rank == 0:  # fails when rank 2 dies, then exits: the store goes with it
        w = dist.irecv(torch.empty(4), 2)
        w.wait()
    else:
        time.sleep(3.0)  # rank 0 has gone by now
        dist.barrier()
    print("RESULT NO ERROR", flush=True)
except Exception as e:
    print("RESULT", e, flush=True)
'''


def test_a_broken_group_leaves_no_word_once_every_rank_formed_it(tmp_path) -> None:
    """A rank whose group breaks after an op that needed every rank's data completed does not
    leave word in the store (nobody waits in set-up for it): the store's host may have exited
    after its own error, and each call to its store made torch print a C++ trace on stderr
    (seen by an audit: rank 1 here, before the fix)."""
    _, outs = _run_script_ranks(tmp_path / "store_host_leaves.py", _STORE_HOST_LEAVES_SCRIPT, 3)
    for rank in (0, 1):
        assert "RESULT mccl" in outs[rank] and "rank 2 closed the connection" in outs[rank], \
            outs[rank]
    assert "TCPStore" not in outs[1] and "recvValue" not in outs[1], outs[1]


def _p2p_dtypes(rank: int, world: int) -> list[str]:
    import torch
    import torch.distributed as dist

    out = []
    for sent, into in ((torch.ones(4), torch.zeros(4, dtype=torch.int32)),
                       (torch.ones(2, dtype=torch.complex64), torch.zeros(2, dtype=torch.float64)),
                       (torch.ones(2, dtype=torch.complex64), torch.zeros(4))):
        g = dist.new_group([0, 1], timeout=timedelta(seconds=30))
        try:
            if rank == 0:
                dist.send(sent, dst=1, group=g)
            else:
                dist.recv(into, src=0, group=g)
            dist.barrier(group=g)
            out.append(f"NO ERROR {into.tolist() if rank else ''}")
        except Exception as e:  # noqa: BLE001
            out.append(f"{type(e).__name__}: {e}")
    return out


def test_a_message_received_into_another_dtype_is_refused() -> None:
    """A send and its receive of the same bytes but different dtypes (float32 into int32;
    complex64, whose parts are float32, into float64): the receive fails naming both dtypes,
    instead of reading the bits as the other type, and the sender's next op on the group
    fails too. complex64 into float32 pairs is the same data, as on gloo: received."""
    res = run_ranks(_p2p_dtypes, 2, timeout=120, pg_timeout_s=30)
    *refused, same_data = zip(res[0], res[1], strict=True)
    for pair, (sender, receiver) in enumerate(refused):
        assert receiver.startswith("CollectiveError") and "another dtype" in receiver, receiver
        names = [("torch.float32", "torch.int32"), ("torch.float32", "torch.float64")][pair]
        for name in names:
            assert name in receiver, receiver
        assert sender.startswith("CollectiveError"), sender  # its barrier: told by rank 1
    assert same_data == ("NO ERROR ", "NO ERROR [1.0, 0.0, 1.0, 0.0]")


def _complex_pairs(rank: int, world: int) -> list[list[float]]:
    import torch
    import torch.distributed as dist

    z = torch.tensor([1 + 2j, 3 + 4j, 5j], dtype=torch.complex64)
    # rank 0 passes float views of a complex tensor, the others plain float32 tensors
    mine = (lambda: torch.view_as_real(z.clone())) if rank == 0 else (
        lambda: torch.view_as_real(z).clone())
    t = mine()
    dist.all_reduce(t)
    got = [t.flatten().tolist()]
    t = mine().mul_(rank + 1)  # in place: still rank 0's view
    dist.broadcast(t, src=world - 1)
    got.append(t.flatten().tolist())
    outs = [mine() for _ in range(world)]
    dist.all_gather(outs, mine().add_(rank))
    got.append(torch.cat(outs).flatten().tolist())
    return got


def test_a_float_view_of_a_complex_tensor_is_float() -> None:
    """A float32 view of a complex tensor (``torch.view_as_real``) on one rank meets plain
    float32 tensors on the others: the same dtype, as on gloo (it used to be signed as
    complex64 and fail as a mismatch naming a dtype no rank passed)."""
    world = 3
    res = run_ranks(_complex_pairs, world, timeout=120, pg_timeout_s=30)
    pairs = [1.0, 2.0, 3.0, 4.0, 0.0, 5.0]
    want = [[world * v for v in pairs], [world * v for v in pairs],
            [v + r for r in range(world) for v in pairs]]
    assert res == [want] * world


def _outcome(call) -> str:
    """"NO ERROR", or the error ``call`` raised with its type and blamed peer."""
    try:
        call()
        return "NO ERROR"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__} peer={getattr(e, 'peer', '?')}: {e}"


def _abort_while_sending(rank: int, world: int) -> str:
    import torch
    import torch.distributed as dist

    g = dist.new_group([0, 1], timeout=timedelta(seconds=60))
    try:
        if rank == 1:  # alive, but never receives: rank 0's large send blocks
            time.sleep(4)
            return "idle"
        threading.Timer(1.0, g.abort).start()
        return _outcome(lambda: dist.send(torch.ones(4_000_000), dst=1, group=g))
    finally:
        dist.barrier()


def test_aborting_a_group_fails_its_blocked_send_as_aborted() -> None:
    """``abort()`` from another thread unblocks a send that the (live) peer does not read;
    the error says the group was aborted, not that the peer's connection was reset."""
    res = run_ranks(_abort_while_sending, 2, timeout=120, pg_timeout_s=60)
    assert res[0].startswith("CollectiveError peer=None"), res[0]
    assert "aborted" in res[0] and "reset" not in res[0], res[0]


def _abort_while_peers_wait(rank: int, world: int) -> str:
    import torch
    import torch.distributed as dist

    g = dist.new_group(list(range(world)), timeout=timedelta(seconds=60))
    try:
        if rank == 0:  # never joins: aborts while the others wait for it
            time.sleep(1.0)
            g.abort()
            return "aborted"
        return _outcome(lambda: dist.all_reduce(torch.ones(4), group=g))
    finally:
        dist.barrier()


def test_peers_of_a_rank_that_aborts_are_told_so() -> None:
    """A rank that aborts its group tells the peers it had nothing queued for why, before
    it cuts the connections: they read "closed the connection (process exited or was
    killed?)" of a live rank."""
    res = run_ranks(_abort_while_peers_wait, 3, timeout=120, pg_timeout_s=60)
    for rank in (1, 2):
        assert "peer=0" in res[rank] and "rank 0 aborted process group" in res[rank], res


def _abort_in_an_op_its_peer_comes_to_later(rank: int, world: int) -> str:
    import torch
    import torch.distributed as dist

    g = dist.new_group([0, 1], timeout=timedelta(seconds=60))
    try:
        dist.all_reduce(torch.ones(1), group=g)
        if rank == 0:  # sends its part of the small op, waits for rank 1's, then aborts
            threading.Timer(1.0, g.abort).start()
        else:
            time.sleep(2.5)  # comes to the op after the abort: rank 0's part is waiting
        return _outcome(lambda: dist.all_reduce(torch.ones(1000), group=g))
    finally:
        dist.barrier()


def test_a_rank_that_comes_to_an_op_its_peer_aborted_in_fails_it() -> None:
    """Before: rank 1 found rank 0's data of the op in its socket, returned the full sum
    and heard of the abort only at its next op, while rank 0's op had failed. The abort's
    report is numbered with the op it cut short, which the peer checks before success."""
    res = run_ranks(_abort_in_an_op_its_peer_comes_to_later, 2, timeout=120, pg_timeout_s=60)
    assert "aborted" in res[0], res
    assert "peer=0" in res[1] and "rank 0 aborted process group" in res[1], res


def _rooted_ops_on_expanded_views(rank: int, world: int) -> list[tuple[str, str, bool]]:
    import torch
    import torch.distributed as dist

    def expanded() -> torch.Tensor:
        return torch.full((1,), float(rank + 1)).expand(4)

    root = 1
    calls = {  # name -> (call, does this rank have to take the result into the view?)
        "broadcast, every rank": (lambda: dist.broadcast(expanded(), src=root), rank != root),
        "broadcast, root only": (
            lambda: dist.broadcast(expanded() if rank == root else torch.zeros(4), src=root),
            False),
        "reduce, every rank": (lambda: dist.reduce(expanded(), dst=root), rank == root),
    }
    out = []
    for name, (call, takes) in calls.items():
        t = torch.zeros(4)
        try:
            if name == "broadcast, root only" and rank != root:
                dist.broadcast(t, src=root)
                err = "" if bool((t == root + 1).all()) else f"wrong result {t.tolist()}"
            else:
                call()
                err = ""
        except ValueError as e:
            err = f"ValueError: {e}"
        if takes:
            ok = err.startswith("ValueError") and "expanded" in err
        else:
            ok = err == ""
        out.append((name, err, ok and not _next_all_reduce_wrong(rank, world)))
    return out


def test_rooted_ops_on_expanded_views_keep_the_group_in_step() -> None:
    """A broadcast or reduce whose tensor is an expanded view (elements sharing memory) on
    some ranks: where a rank only reads it, the op runs; where it would take the result,
    that rank's call raises a ValueError naming the view, after the op ran with a private
    copy in its place, so no rank runs the op alone and the group stays usable (before,
    a root that merely read the view ran the op while the others refused theirs)."""
    for rank, rows in enumerate(run_ranks(_rooted_ops_on_expanded_views, 3, timeout=120,
                                          pg_timeout_s=30)):
        for name, err, ok in rows:
            assert ok, f"rank {rank}, {name}: {err or 'no error'}"


def _odd_arguments_on_one_rank(rank: int, world: int) -> list[tuple[str, str]]:
    """Only the last rank's result tensor is an expanded view, or its arguments are ints in
    another form; sparse tensors of different sizes. Returns (case, what is wrong) rows."""
    import numpy as np
    import torch
    import torch.distributed as dist

    last, w = world - 1, world
    odd = rank == last

    def out(n: int) -> torch.Tensor:  # the result tensor: an expanded view on the last rank
        return torch.zeros(1).expand(n) if odd else torch.zeros(n)

    mine = torch.full((2,), float(rank + 1))
    total = sum(range(1, w + 1))
    gathered = [float(r + 1) for r in range(w) for _ in range(2)]
    cases = {  # name -> (call returning the result, the result expected where not refused)
        "all_reduce": (lambda: (t := out(2) if odd else mine.clone(), dist.all_reduce(t))[0],
                       [float(total - w)] * 2),  # (the last rank's view holds zeros)
        "all_gather": (lambda: (outs := [out(2) for _ in range(w)],
                                dist.all_gather(outs, mine))[0], gathered),
        "all_gather_into_tensor": (lambda: (o := out(2 * w),
                                            dist.all_gather_into_tensor(o, mine))[0], gathered),
        "reduce_scatter_tensor": (lambda: (o := out(2), dist.reduce_scatter_tensor(
            o, torch.ones(2 * w)))[0], [float(w)] * 2),
        "all_to_all_single": (lambda: (o := out(2 * w), dist.all_to_all_single(
            o, mine.repeat(w)))[0], gathered),
        "gather": (lambda: (outs := [out(2) for _ in range(w)] if rank == last else None,
                            dist.gather(mine, outs, dst=last))[0], gathered),
        "scatter": (lambda: (o := out(2), dist.scatter(
            o, [torch.full((2,), 7.0)] * w if rank == 0 else None, src=0))[0], [7.0, 7.0]),
    }
    rows = []
    for name, (call, want) in cases.items():
        try:
            got = call()
            if odd:
                wrong = "no error"
            elif got is None:  # a gather's other ranks
                wrong = ""
            else:
                flat = torch.cat(got).tolist() if isinstance(got, list) else got.tolist()
                wrong = "" if flat == want else f"wrong result {flat}, expected {want}"
        except ValueError as e:
            wrong = "" if odd and "expanded" in str(e) else f"ValueError: {e}"
        rows.append((f"expanded {name}", wrong))
        rows.append((f"after expanded {name}", _next_all_reduce_wrong(rank, w)))

    # Ranks and tags in other int forms (before: a tensor rank never matched a message)
    t = torch.zeros(2)
    if rank == 0:
        dist.send(torch.full((2,), 5.0), torch.tensor(1), tag=np.int64(3))
        dist.recv(t, src=np.int64(1), tag=torch.tensor(4))
    elif rank == 1:
        dist.recv(t, torch.tensor(0), tag=np.int64(3))
        dist.send(torch.full((2,), 5.0), dst=np.int32(0), tag=torch.tensor(4))
    rows.append(("tensor and numpy ranks and tags",
                 "" if rank > 1 or t.tolist() == [5.0, 5.0] else f"received {t.tolist()}"))

    # Sparse tensors of different sizes: every rank finds it after the same exchange
    sp = torch.sparse_coo_tensor([[0]], [1.0], (3 + rank,))
    try:
        dist.all_reduce(sp)
        rows.append(("sparse sizes", "no error"))
    except ValueError as e:
        rows.append(("sparse sizes", "" if "different sizes" in str(e) else str(e)))
    rows.append(("after sparse sizes", _next_all_reduce_wrong(rank, w)))
    return rows


def test_odd_arguments_on_one_rank_keep_the_group_in_step() -> None:
    """A result tensor that is an expanded view on one rank only (its peers cannot tell):
    that rank's op raises a ValueError naming the view after the op ran with a private copy
    in its place, the others get their results and the group stays usable (before, only
    broadcast and reduce did so; the other ops raised before joining, leaving the peers in
    the op, and the group broke). Ranks and tags given as numpy ints or one-element tensors
    work as on gloo, and sparse tensors of different sizes fail on every rank without
    breaking the group."""
    for rank, rows in enumerate(run_ranks(_odd_arguments_on_one_rank, 3, timeout=120,
                                          pg_timeout_s=20)):
        for name, wrong in rows:
            assert not wrong, f"rank {rank}, {name}: {wrong}"


def _sub_second_and_endless_timeouts(rank: int, world: int) -> str:
    """A 300 ms group timeout (rank 1 joins the all-reduce a second late), then a timeout of
    10**8 days (longer than a thread wait can take: capped, as gloo takes it)."""
    import torch
    import torch.distributed as dist

    pg = dist.group.WORLD
    pg.set_timeout(timedelta(milliseconds=300))
    if rank == 1:
        time.sleep(1.0)
    said = "ok"
    try:
        dist.all_reduce(torch.ones(4))
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        said = str(e)
    g = dist.new_group([0, 1], timeout=timedelta(days=10**8))
    t = torch.ones(3)
    dist.all_reduce(t, group=g)
    return said if rank == 0 else f"sum {t.tolist()}"


def test_sub_second_and_endless_timeouts() -> None:
    """Before: a 300 ms timeout read "no data from rank 1 for 0s", and a timeout of 10**8 days
    raised a bare OverflowError from a thread wait."""
    r0, r1 = run_ranks(_sub_second_and_endless_timeouts, 2, timeout=60, pg_timeout_s=30)
    # (the seconds are measured: a loaded machine may notice the silence after a second or
    # more, so the sub-second spelling itself is checked in test_wire's seconds_text test)
    assert re.search(r"no data from rank 1 for (0\.\d+|[1-9]\d*)s \(group timeout\)", r0), r0
    assert r1 == "sum [2.0, 2.0, 2.0]", r1


def _quiet_store_rank(rank: int, world: int, port: int, answered: int) -> tuple[str, str]:
    """Rank 1's store stops answering after ``answered`` calls, as when its link to the
    store's host goes down while the group forms (torch's TCPStore client then waits for a
    reply for as long as TCP retransmits, about 15 minutes)."""
    import torch.distributed as dist

    base = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=timedelta(seconds=60))

    class Quiet(dist.Store):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def _call(self, name: str, *args):
            self.calls += 1
            if self.calls > answered:
                time.sleep(3600)
            return getattr(base, name)(*args)

        def set(self, key, value):
            return self._call("set", key, value)

        def get(self, key):
            return self._call("get", key)

        def add(self, key, amount):
            return self._call("add", key, amount)

        def check(self, keys):
            return self._call("check", keys)

        def multi_get(self, keys):
            return self._call("multi_get", keys)

    try:
        dist.init_process_group("mccl", store=base if rank == 0 else Quiet(), rank=rank,
                                world_size=world, timeout=timedelta(seconds=3))
    except Exception as e:  # noqa: BLE001 - the error is what the test checks
        return type(e).__name__, str(e)
    dist.destroy_process_group()
    return "formed", ""


@pytest.mark.parametrize("answered", [0, 2])
def test_a_rank_whose_store_stops_answering_fails_within_the_timeout(answered: int) -> None:
    out = run_ranks(_quiet_store_rank, 2, free_port(), answered, init=False, timeout=60)
    assert out[0][0] != "formed" and out[1][0] != "formed", out
    assert "gave no answer to" in out[1][1], out


def _send_cut_by_the_groups_failure(rank: int, world: int) -> str:
    import torch
    import torch.distributed as dist

    g = dist.new_group([0, 1], timeout=timedelta(seconds=3))
    try:
        if rank == 1:  # alive, but never receives nor sends: rank 0's large send blocks
            time.sleep(8)
            return "idle"
        w = dist.isend(torch.ones(4_000_000), dst=1, group=g)
        try:  # times out: the group fails, and its connections close under the send
            dist.recv(torch.empty(1), src=1, group=g)
        except Exception:  # noqa: BLE001
            pass
        return _outcome(w.wait)
    finally:
        dist.barrier()


def test_a_send_cut_by_the_groups_own_failure_says_so() -> None:
    """A send blocked on a live peer that does not read, when the group fails for another
    reason (here a receive that timed out): the error gives that reason, not a reset
    connection that suggests the peer died."""
    res = run_ranks(_send_cut_by_the_groups_failure, 2, timeout=120, pg_timeout_s=60)
    assert "the group failed first" in res[0] and "no message" in res[0], res[0]
    assert "reset" not in res[0] and "killed" not in res[0], res[0]


def _failed_groups_are_freed(rank: int, world: int, port: int) -> list[tuple[int, int]]:
    """Three times: the last rank never joins the others' queued ops (whose Futures and
    errors the caller holds and raises), they abort the group, everyone destroys it. Then
    the group must be gone: no engine left, no sockets kept open."""
    import gc
    import weakref

    import torch
    import torch.distributed as dist

    from mccl import engine

    left = []
    for cycle in range(3):
        dist.init_process_group("mccl", init_method=f"tcp://127.0.0.1:{port + cycle}",
                                rank=rank, world_size=world, timeout=timedelta(seconds=20))
        dist.all_reduce(torch.ones(8))
        pg = weakref.ref(dist.group.WORLD)
        if rank < world - 1:
            works = [dist.all_reduce(torch.ones(100_000), async_op=True) for _ in range(3)]
            works.append(dist.irecv(torch.empty(4), src=world - 1))
            futures = [w.get_future() for w in works]
            time.sleep(0.3)
            dist.distributed_c10d._abort_process_group()
            for waitable in works + futures:
                try:
                    waitable.wait()
                except RuntimeError:
                    pass
            del works, futures
        else:
            time.sleep(0.6)
        if dist.is_initialized():
            dist.destroy_process_group()
        gc.collect()
        left.append((len(engine._LIVE), int(pg() is not None)))
        time.sleep(0.5)  # the others' destroy is done before the next group forms
    return left


def test_a_failed_group_is_freed_once_destroyed() -> None:
    """The errors that Works and Futures raised pinned a failed group (its engine, sockets
    and store) for good: one more after every abort and re-init (fd counts grew by 10 per
    cycle on the store's rank)."""
    port = free_port()
    results = run_ranks(_failed_groups_are_freed, 3, port + 1, init=False, timeout=120)
    for rank, left in enumerate(results):
        assert left == [(0, 0)] * 3, (rank, left)


def _ops_after_a_failed_receive(rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    g = dist.new_group([0, 1], timeout=timedelta(seconds=2))
    out: dict = {}
    if rank == 0:  # rank 1 never sends: the receive times out and the group fails
        out["recv"] = _outcome(lambda: dist.recv(torch.empty(4), src=1, group=g))
        out["isend"] = _outcome(lambda: dist.isend(torch.ones(4), dst=1, group=g).wait())
        out["send"] = _outcome(lambda: dist.send(torch.ones(4), dst=1, group=g))
        out["all_reduce"] = _outcome(lambda: dist.all_reduce(torch.ones(4), group=g))
        store.set("after_failed_recv/done", "1")
    else:
        store.wait(["after_failed_recv/done"])
        time.sleep(0.2)  # rank 0's report of its failure has arrived
        out["isend"] = _outcome(lambda: dist.isend(torch.ones(4), dst=0, group=g).wait())
    dist.barrier()
    return out


def test_ops_after_a_failed_receive_are_refused() -> None:
    """Once a receive failed, the group is broken: a CPU send (which does not queue) was
    let through on this rank until the failure closed the connections, seconds later, and
    "completed" although the group had failed. Every later op, on both ranks, must fail."""
    res = run_ranks(_ops_after_a_failed_receive, 2, timeout=120, pg_timeout_s=60)
    assert "no message" in res[0]["recv"] or "Timeout" in res[0]["recv"], res[0]
    for rank, out in enumerate(res):
        for op, said in out.items():
            assert said != "NO ERROR", (rank, op, out)
    for op in ("isend", "send", "all_reduce"):
        assert "failed" in res[0][op], (op, res[0])


def _messages_sent_ahead(rank: int, world: int, rounds: int, per_round: int) -> list[str]:
    """Rank 0 sends ``per_round`` messages of 16 KiB, then joins an all-reduce; rank 1 joins
    the all-reduce first (reading past those messages, which it must keep), then receives
    them. With the keep limit at 64 KiB."""
    import torch
    import torch.distributed as dist

    from mccl.transport import mesh

    mesh.STASH_MAX_BYTES = 64 << 10
    said = []
    for r in range(rounds):
        msgs = [torch.full((4096,), float(r * 100 + i)) for i in range(per_round)]
        t = torch.ones(8)
        if rank == 0:
            works = [dist.isend(m, dst=1) for m in msgs]
            said.append(_outcome(lambda t=t: dist.all_reduce(t)))
            said += [_outcome(w.wait) for w in works]
        else:
            said.append(_outcome(lambda t=t: dist.all_reduce(t)))
            for m in msgs:
                got = torch.empty_like(m)
                outcome = _outcome(lambda got=got: dist.recv(got, src=0))
                said.append(outcome if outcome != "NO ERROR" or torch.equal(got, m)
                            else f"WRONG {got[:2].tolist()} for {m[:2].tolist()}")
        if t.tolist() != [2.0] * 8 and said[-1 - (per_round if rank else 0)] == "NO ERROR":
            said.append(f"WRONG all_reduce {t.tolist()}")
    said.append(_outcome(lambda: dist.all_reduce(torch.ones(1))))  # is the group still up?
    return said


def test_messages_sent_ahead_of_their_receives_are_kept_within_a_bound() -> None:
    """A rank that reads past messages no receive wants yet (to reach the op behind them)
    keeps them, up to ``mesh.STASH_MAX_BYTES``: without a bound a sender that kept sending
    while its peer waited in another op filled the peer's memory (20 GB). Under the bound,
    twice (what a receive took is freed), every value arrives; past it, both ranks' ops fail
    naming the limit, instead of the memory."""
    fits = run_ranks(_messages_sent_ahead, 2, 2, 3, timeout=120)
    assert all(s == "NO ERROR" for out in fits for s in out), fits
    over = run_ranks(_messages_sent_ahead, 2, 1, 6, timeout=120)
    # rank 1 fails in the all-reduce; rank 0 may have completed it (it got rank 1's part)
    # but learns of the failure by its next op at the latest
    assert "STASH_MAX_BYTES" in over[1][0] and "sent a point-to-point message" in over[1][0], (
        over[1])
    assert all(s != "NO ERROR" for s in over[1]), over[1]
    assert "STASH_MAX_BYTES" in over[0][-1], over[0]


def _send_to_a_rank_that_died(rank: int, world: int) -> dict:
    """A chain 0 -> 1 -> 2 of 4 MiB sends; rank 2 dies. Rank 1's send to it fails; rank 1's
    next all-reduce must fail at once (not wait in it while rank 0's messages pile up), and
    rank 0, whose send rank 1 stops reading, must name rank 2, not rank 1."""
    import torch
    import torch.distributed as dist

    t = torch.ones(1 << 20)
    dist.barrier()
    if rank == 2:
        dist.recv(t, src=1)
        os._exit(0)  # without a word: a crash
    out: dict = {}
    began = time.monotonic()
    try:
        for _ in range(400):  # bounded: each send either completes or fails
            if time.monotonic() - began > 60:
                break
            if rank == 1:
                dist.recv(t, src=0)
            dist.send(t, dst=rank + 1)
        out["chain"] = "NO ERROR"
    except Exception as e:  # noqa: BLE001
        out["chain"] = f"{type(e).__name__} peer={getattr(e, 'peer', '?')}: {e}"
    out["all_reduce"] = _outcome(lambda: dist.all_reduce(torch.ones(2)))
    return out


def test_a_send_to_a_rank_that_died_breaks_the_group() -> None:
    """A failed CPU send broke nothing: the group went on, the sender's next all-reduce waited
    on its other peer, which kept sending, and kept every message (memory without bound); and
    that peer, whose writes were cut when the group went down, named the live rank as the one
    that exited. Now the send's failure breaks the group, as a failed receive does, and the
    report reaches the peers."""
    res = run_ranks(_send_to_a_rank_that_died, 3, timeout=120, pg_timeout_s=30,
                    expect_missing=(2,))
    for rank in (0, 1):
        out = res[rank]
        assert "peer=2" in out["chain"], (rank, out)
        assert "failed earlier" in out["all_reduce"] and "peer=2" in out["all_reduce"], (
            rank, out)
    assert "reported by rank 1" in res[0]["chain"], res[0]


def _forked_child(rank: int, world: int) -> dict:
    """Rank 0 posts receives that rank 1 answers only later, and forks; the child waits on
    those inherited receives and their futures (one made before the fork), tries an op on
    the group it inherited, then runs mccl's exit handler (what a normal exit runs) and
    leaves. The parent's group must still work, and the parent's receives get their
    messages."""
    import json

    import torch
    import torch.distributed as dist

    from mccl import engine

    out: dict = {}
    if rank == 0:  # a Future completed by a worker thread, which then idles (in the parent)
        warm = dist.irecv(torch.zeros(1), src=1).get_future()
    dist.barrier()
    if rank == 1:
        dist.send(torch.ones(1), dst=0)
    else:
        warm.wait()
        box = torch.zeros(3)
        pending = dist.irecv(box, src=1)
        asked_work = dist.irecv(torch.zeros(1), src=1)
        asked = asked_work.get_future()  # made before the fork
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                said = {"wait": _outcome(pending.wait),
                        "future": _outcome(lambda: pending.get_future().wait()),
                        "asked": _outcome(asked_work.wait),
                        "asked_future": _outcome(asked.wait),
                        "op": _outcome(lambda: dist.all_reduce(torch.ones(2)))}
                engine._shut_down_at_exit()
                os.write(w, json.dumps(said).encode()[:4000])
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            out["child"] = json.loads(f.read().decode() or "{}")
        os.waitpid(pid, 0)
    t = torch.full((4,), float(rank + 1))
    out["all_reduce"] = _outcome(lambda: dist.all_reduce(t))
    out["values"] = t.tolist()
    if rank == 1:
        dist.send(torch.full((3,), 7.0), dst=0)
        dist.send(torch.ones(1), dst=0)
    else:
        out["recv"] = _outcome(pending.wait)
        out["asked"] = _outcome(asked.wait)
        out["box"] = box.tolist()
    return out


def test_a_forked_child_leaves_the_parents_groups_alone() -> None:
    """A child made by os.fork that exited normally shut the parent's groups down at its
    exit (their sockets are shared): the parent's next op failed on both ranks, each blaming
    the other, live, rank. Now the child's copies are disowned: an op there is refused, and
    its exit touches nothing. A Work the parent issued failed to finish in the child, whose
    wait on it hung: it now fails there, naming the fork, and still finishes in the parent."""
    res = run_ranks(_forked_child, 2, timeout=120)
    child = res[0]["child"]
    assert "forked child cannot use it" in child["op"], res[0]
    for how in ("wait", "future", "asked", "asked_future"):
        assert "forked child cannot wait for it" in child[how], (how, res[0])
    for rank in (0, 1):
        assert res[rank]["all_reduce"] == "NO ERROR", res
        assert res[rank]["values"] == [3.0] * 4, res
    assert res[0]["recv"] == res[0]["asked"] == "NO ERROR", res[0]
    assert res[0]["box"] == [7.0] * 3, res[0]
