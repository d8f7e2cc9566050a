"""Where one op's fixed cost goes: timestamps along mccl's path, per stage, medians over ops.

    python benchmarks/oppath.py --world 4 --op all_reduce --size 1M [--device cuda] [--async]
        [--variants "new:;old:inline_cuda=0,gpu_wait=0"] [--profile] [--hosts 8 --rate 10gbit]
        [--stream]

Stages (microseconds from the ``torch.distributed`` call): the process group entered (its
shared all-gather / reduce-scatter body for those),
``Engine.submit``, ``Engine._execute`` (on the caller's thread when the op runs inline, else on
the comm thread), a staged (device) hand-off's copies out enqueued and waited for, the op's
body, its first send, its last receive, the staged hand-off's release begun, the hand-off
released (copies back enqueued), the call (and ``Work.wait``) returned, and returned = that
plus the device's sync. Each op runs after a barrier, so what a previous op left on the wire
is not counted; ``--stream`` runs them back to back instead, as the bench does (no barrier,
no device sync per op: a device copy left by one op delays the next), and adds the period
between calls. The ranks are local processes on loopback (the fixed cost is Python and thread
hand-offs, not the link), or with ``--hosts N`` one per emulated host of a cluster (root and
iproute2), as the bench's cluster runs place them.
``--variants`` compares settings of mccl's constants (keys: benchmarks/h200/ab/mccl_ab.py) in
one run, interleaved in rounds, so the machine's drift hits them alike. ``--profile`` adds a
cProfile of rank 0's timed ops (the functions with the most time of their own; the profiler
slows Python down, so read it for shares, not times). Tooling only: it patches mccl's classes
in its own processes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "h200" / "ab"))

from mccl.bench.cli import add_rx_steering, steering  # noqa: E402
from mccl.bench.ops import element_count  # noqa: E402
from mccl.bench.report import parse_size  # noqa: E402
from mccl.bench.spawn import run_ranks  # noqa: E402

#: The process group method each torch.distributed call reaches.
PG_METHODS = {"all_reduce": "allreduce", "all_gather": "_allgather_flat",
              "reduce_scatter": "_reduce_scatter_flat"}
STAGES = ("pg", "submit", "execute", "staged", "copied", "body", "first_send", "last_got",
          "release", "released", "called", "returned")
WARMUP_OPS = 10
ROUNDS = 4  # with --variants: each variant runs reps/ROUNDS ops per round
PROFILE_ROWS = 30  # functions listed by --profile


def _stamping(fn, st: dict[str, float], now):
    """``fn`` that stamps "body" when the first part of the op's body runs."""

    def timed(ch, hosts):
        st.setdefault("body", now())
        return fn(ch, hosts)

    return timed


def _rank(rank: int, world: int, op: str, size: int, reps: int, device: str,
          async_op: bool, variants: list[tuple[str, str]], profile: bool = False,
          stream: bool = False) -> dict:
    import cProfile
    import io
    import pstats
    import warnings

    import mccl_ab
    import torch
    import torch.distributed as dist

    from mccl import engine
    from mccl.device import staging
    from mccl.transport.mesh import Mesh

    warnings.simplefilter("ignore", FutureWarning)  # deprecated *_tensor names: same path
    now = time.perf_counter
    st: dict[str, float] = {}

    def stamp(owner: object, name: str, label: str, wrap_body: bool = False,
              after: bool = False) -> None:
        """Stamp ``label`` when ``owner.name`` is first entered (``after``: each time it
        returns)."""
        f = getattr(owner, name)

        def stamped(*a, **k):
            if after:
                got = f(*a, **k)
                st[label] = now()
                return got
            st.setdefault(label, now())
            if wrap_body:  # Engine._execute(self, job): stamp the job's body (or start part)
                job = a[1]
                for part in ("start", "body"):
                    fn = getattr(job, part)
                    if fn is not None:
                        setattr(job, part, _stamping(fn, st, now))
            return f(*a, **k)

        setattr(owner, name, stamped)

    pg_cls = type(dist.group.WORLD)
    stamp(pg_cls, PG_METHODS[op], "pg")
    stamp(engine.Engine, "submit", "submit")
    stamp(engine.Engine, "_execute", "execute", wrap_body=True)
    stamp(engine.OpChannel, "send", "first_send")
    stamp(Mesh, "end_op", "released")  # the op's hand-off released (copies back enqueued)
    stamp(engine.OpChannel, "recv", "last_got", after=True)  # the op's last receive returned
    # A staged (device) hand-off: its copies out enqueued, their wait over (and whether it
    # first slept on the producer's marker), its release begun.
    handoff = staging.StagingHandoff
    stamp(handoff, "_stage_out", "staged", after=True)
    stamp(handoff, "acquire", "copied", after=True)
    stamp(handoff, "release", "release")
    slept = [0, 0]
    await0 = handoff._await

    def await_(self, fence):
        if not self._ready_slept:
            slept[0] += self._ready is not None and not self._ready.query()
            slept[1] += 1
        await0(self, fence)

    handoff._await = await_
    dev = torch.device(device, 0) if device == "cuda" else torch.device(device)
    n = element_count(op, size, world, 4)
    full = torch.ones(n, device=dev)
    part = torch.ones(n // world, device=dev)
    run = {"all_reduce": lambda: dist.all_reduce(full, async_op=async_op),
           "all_gather": lambda: dist.all_gather_into_tensor(full, part, async_op=async_op),
           "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, full, async_op=async_op)}[op]

    prof: cProfile.Profile | None = None  # made after the warm-up: the timed ops only

    last_start = [0.0]

    def one() -> dict[str, float]:
        if not stream:
            dist.barrier()
        st.clear()
        t0 = now()
        if prof is not None:
            prof.enable()
        w = run()
        if w is not None:
            w.wait()
        st["called"] = now()
        if prof is not None:
            prof.disable()
        if device == "cuda" and not stream:
            torch.cuda.current_stream(dev).synchronize()
        t1 = now()
        period = {"period": (t0 - last_start[0]) * 1e6} if stream else {}
        last_start[0] = t0
        return ({k: (v - t0) * 1e6 for k, v in st.items()} | {"returned": (t1 - t0) * 1e6}
                | period)

    for _ in range(WARMUP_OPS):
        one()
    if profile and rank == 0:
        prof = cProfile.Profile()
    rows: dict[str, list[dict[str, float]]] = {name: [] for name, _ in variants}
    rounds = ROUNDS if len(variants) > 1 else 1
    for _ in range(rounds):
        for name, spec in variants:
            restore = mccl_ab.apply(spec)
            try:
                one()  # the first op after a switch is not counted
                rows[name] += [one() for _ in range(max(1, reps // rounds))]
            finally:
                restore()
    if device == "cuda":
        torch.cuda.synchronize()
    out: dict = {name: {k: statistics.median(r[k] for r in rs) for k in (*STAGES, "period")
                        if all(k in r for r in rs)} for name, rs in rows.items()}
    if slept[1]:  # (warm-up included)
        out["_ready_slept"] = f"{slept[0]} of {slept[1]}"
    if prof is not None:
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(PROFILE_ROWS)
        out["_profile"] = text.getvalue()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--op", default="all_reduce", choices=sorted(PG_METHODS))
    ap.add_argument("--size", default="1M")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--async", dest="async_op", action="store_true",
                    help="async_op=True and wait() (always on the comm thread)")
    ap.add_argument("--stream", action="store_true",
                    help="back to back, as the bench times ops: no barrier and no device "
                         "sync per op (returned = the call returned; adds the period "
                         "between calls)")
    ap.add_argument("--variants", default="base:",
                    help='"name:key=v,key=v;name2:..." (keys: benchmarks/h200/ab/mccl_ab.py)')
    ap.add_argument("--json", type=Path)
    ap.add_argument("--profile", action="store_true",
                    help="cProfile rank 0's timed ops (printed; shares, not times)")
    ap.add_argument("--hosts", type=int, default=0,
                    help="run one rank per emulated host of a cluster of this many (overrides "
                         "--world; needs root and iproute2)")
    ap.add_argument("--rate", default="10gbit", help="with --hosts: the links' rate")
    add_rx_steering(ap)
    a = ap.parse_args()
    variants = [tuple(v.split(":", 1)) for v in a.variants.split(";") if v]
    world = a.hosts or a.world
    args = (_rank, world, a.op, parse_size(a.size), a.reps, a.device, a.async_op, variants,
            a.profile, a.stream)
    timeout = 120 + a.reps * 0.1 * len(variants)
    if a.hosts:
        from mccl.bench.cluster import Cluster
        from mccl.bench.spawn import Hosts

        with Cluster(a.hosts, a.rate, steer=steering(a.rx_steering)) as c:
            res = run_ranks(*args, timeout=timeout,
                            hosts=Hosts(tuple(c.hosts), c.addr(0), c.iface))
    else:
        res = run_ranks(*args, timeout=timeout)
    profile = res[0].pop("_profile", None)
    slept = [r.pop("_ready_slept", None) for r in res]
    out = {"world": world, "op": a.op, "size": a.size, "device": a.device,
           "async_op": a.async_op, "variants": a.variants, "hosts": a.hosts,
           "rate": a.rate if a.hosts else None, "stages_us_median": res}
    for name, stages in res[0].items():
        line = " ".join(f"{k}={v:.0f}" for k, v in stages.items())
        where = f"{a.hosts} hosts at {a.rate}" if a.hosts else "loopback"
        print(f"{a.op} {a.size} n={world} {a.device} {'async' if a.async_op else 'blocking'} "
              f"{where} [{name}]: rank0 {line}")
        slowest = max(range(world), key=lambda r: res[r][name].get("first_send", 0.0))
        if world > 1:
            line = " ".join(f"{k}={v:.0f}" for k, v in res[slowest][name].items())
            print(f"    latest first send: rank{slowest} {line}")
    if any(slept):
        print("ops whose wait for their copies out first slept on the producer's marker, per "
              "rank:", ", ".join(f"rank{r} {s}" for r, s in enumerate(slept)))
    if profile:
        print(profile)
    if a.json:
        a.json.write_text(json.dumps(out | ({"profile": profile} if profile else {}), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
