"""Experiment (thirty-seventh session): where a 1 MB reduce-scatter on 4 emulated 10 Gbit hosts
spends the ~250 us it takes beyond an all-gather of the same size. Times blocking ops back to
back, then records one rank's per-chunk timeline (recv waits, reduces, sends) for a few ops.

    python benchmarks/h200/exp_rs_timeline.py OUT_JSON [variant ...]   (root, iproute2)

Variants: ``base``; ``nopool`` (reduce-scatter's small-buffer pool off); ``torchviews``
(thirty-eighth session: the torch view calls that all-reduce's and reduce-scatter's host
paths made before 6ee3616, put back at the same points, each releasing the GIL once).
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time

N_HOSTS = 4
SIZE = 1 << 20
WARM, TIMED, TRACED = 30, 200, 5


def _torch_views() -> None:
    """Put back the torch calls of the host paths before 6ee3616: ``detach().view(-1)`` of an
    all-reduce's tensor, ``reshape(-1)`` of a reduce-scatter's output (in its second part)."""
    from mccl import collectives as coll

    rs_finish, red_init = coll.ReduceScatter.finish, coll._Reducible.__init__

    def finish(self, ch, hosts):
        (hosts[0] if self.flat else hosts[-1]).reshape(-1)
        rs_finish(self, ch, hosts)

    def init(self, t, copy):
        t.detach().view(-1)
        red_init(self, t, copy)

    coll.ReduceScatter.finish, coll._Reducible.__init__ = finish, init


def _rank(rank: int, w: int, variant: str) -> dict:
    import torch
    import torch.distributed as dist

    from mccl.algorithms import ring

    if variant == "nopool":
        ring.REDUCE_SCATTER_POOL_SLOTS = 0
    if variant == "torchviews":
        _torch_views()
    n = SIZE // 4
    inp, out = torch.ones(n), torch.empty(n // w)
    agout, big = torch.empty(n), torch.ones(n)
    ops = {"reduce_scatter": lambda: dist.reduce_scatter_tensor(out, inp),
           "all_gather": lambda: dist.all_gather_into_tensor(agout, out),
           "all_reduce": lambda: dist.all_reduce(big)}
    res: dict = {"variant": variant, "per_op_us": {}, "trace": {}}
    for name, fn in ops.items():
        for _ in range(WARM):
            fn()
        samples = []
        for _ in range(10):
            dist.barrier()
            t = time.perf_counter()
            for _ in range(TIMED // 10):
                fn()
            samples.append((time.perf_counter() - t) / (TIMED // 10) * 1e6)
        res["per_op_us"][name] = statistics.median(samples)
    # traced ops: wrap the ring functions' channel
    log: list = []

    class Traced:
        def __init__(self, ch):
            self._ch = ch

        def __getattr__(self, a):
            return getattr(self._ch, a)

        def send(self, peer, buf):
            log.append(("send", time.perf_counter(), buf.nbytes))
            return self._ch.send(peer, buf)

        def recv(self, peer, buf):
            t0 = time.perf_counter()
            self._ch.recv(peer, buf)
            log.append(("recv", t0, time.perf_counter(), buf.nbytes))

        def flush(self):
            t0 = time.perf_counter()
            self._ch.flush()
            log.append(("flush", t0, time.perf_counter()))

    def wrap(fn_name: str, has_reduce: bool):
        real = getattr(ring, fn_name)

        def traced(ch, *args, **kwargs):
            log.append((fn_name, time.perf_counter()))
            if has_reduce:
                args = list(args)
                red = args[2]

                def timed_reduce(*a):
                    t0 = time.perf_counter()
                    red(*a)
                    log.append(("reduce", t0, time.perf_counter()))
                args[2] = timed_reduce
            r = real(Traced(ch), *args, **kwargs)
            log.append((fn_name + " end", time.perf_counter()))
            return r
        setattr(ring, fn_name, traced)

    wrap("reduce_scatter_start", False)
    wrap("reduce_scatter", True)
    wrap("all_gather_start", False)
    wrap("all_gather", False)
    for name in ("reduce_scatter", "all_gather"):
        fn = ops[name]
        runs = []
        for _ in range(TRACED):
            dist.barrier()
            log.clear()
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            runs.append({"call": [0.0, (t1 - t0) * 1e6],
                         "events": [[e[0]] + [round((x - t0) * 1e6, 1) if isinstance(x, float)
                                              else x for x in e[1:]] for e in log]})
        res["trace"][name] = runs
    return res


def main() -> int:
    from mccl.bench import cluster as cl
    from mccl.bench.spawn import Hosts, run_ranks

    out_path = sys.argv[1]
    variants = sys.argv[2:] or ["base"]
    results = []
    c = cl.Cluster(N_HOSTS, "10gbit", prefix="mexp", cc="bbr")
    with c.up():
        hosts = Hosts(tuple(c.hosts), c.addr(0), c.iface)
        for v in variants:
            r = run_ranks(_rank, N_HOSTS, v, timeout=240, hosts=hosts)
            results.append(r)
            print(v, {k: round(max(x["per_op_us"][k] for x in r)) for k in r[0]["per_op_us"]},
                  flush=True)
    with open(out_path, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    random.seed()
    sys.exit(main())
