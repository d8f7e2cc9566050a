"""Can a pipelined ring all-reduce in plain Python fill the emulated links where mccl does not?

    python benchmarks/bare_ring.py --hosts 4 --rate 10gbit --sizes 64M,256M --json OUT

A control for the bench's remaining gap to gloo at 16-256 MB. Every rank runs, in turn and
interleaved round by round, mccl's all-reduce, gloo's, and a bare ring written here: two
sockets (to the right, from the left), one sender thread fed zero-copy views, the calling
thread receiving with MSG_WAITALL and adding with numpy; no framing, no engine, no hand-off.
Each variant of the bare ring (``--bare "name:chunk=1M,lowat=256K" ...``) gets its own
sockets. Each sample is a barrier (on a gloo group) and one op, as the bench's samples are at
these sizes; its time is the slowest rank's. Reported as % of the ideal (the ring's bytes per
link over the single-stream ceiling measured in the same run). If the bare ring fills the link
and mccl does not, the gap is in mccl's machinery; if neither does, it is in plain Python
threads and sockets on this box. Linux, root (network namespaces); a diagnostic, not a test.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import threading
import time
from collections import deque
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mccl.bench.report import parse_size  # noqa: E402
from mccl.bench.spawn import Hosts, run_ranks  # noqa: E402

PG_TIMEOUT_S = 120.0
DEFAULT_BARE = ("bare:chunk=1M,lowat=256K",)
_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", 25)
_WAITALL = socket.MSG_WAITALL


class BareRing:
    """A pipelined ring all-reduce of float32 numpy arrays over two plain sockets."""

    def __init__(self, rank: int, world: int, right: socket.socket, left: socket.socket,
                 chunk: int, send_piece: int = 0, recv_piece: int = 0):
        self.rank, self.world, self.right, self.left = rank, world, right, left
        self.chunk_elems = max(1, chunk // 4)
        self.send_piece = send_piece  # bytes per sendall of a chunk (0: the whole chunk)
        self.recv_piece = max(1, recv_piece // 4) if recv_piece else 0  # elements
        self.queue: deque = deque()
        self.cv = threading.Condition()
        self.queued = self.sent = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._send_loop, daemon=True)
        self.thread.start()

    def _send_loop(self) -> None:
        try:
            while True:
                with self.cv:
                    while not self.queue:
                        self.cv.wait()
                    view = self.queue.popleft()
                if view is None:
                    return
                step = self.send_piece or len(view)
                for off in range(0, len(view), step):
                    self.right.sendall(view[off:off + step])
                with self.cv:
                    self.sent += 1
                    self.cv.notify_all()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            with self.cv:
                self.error = e
                self.cv.notify_all()

    def _send(self, view) -> int:
        with self.cv:
            self.queue.append(memoryview(view).cast("B"))
            self.queued += 1
            self.cv.notify()
            return self.queued

    def _wait_sent(self, ticket: int) -> None:
        with self.cv:
            while self.sent < ticket:
                if self.error is not None:
                    raise self.error
                self.cv.wait(1.0)

    def _recv(self, view) -> None:
        mv = memoryview(view).cast("B")
        got = 0
        while got < len(mv):
            n = self.left.recv_into(mv[got:], 0, _WAITALL)
            if n == 0:
                raise ConnectionError("left neighbour closed")
            got += n

    def _recv_reduce(self, dst, tmp) -> None:
        """Receive a chunk into ``tmp`` and add it into ``dst``, in pieces if asked."""
        import numpy as np

        step = self.recv_piece or len(dst)
        for a in range(0, len(dst), step):
            part = tmp[a:a + step]
            self._recv(part)
            np.add(dst[a:a + step], part, out=dst[a:a + step])

    def _chunks(self, bounds: list[int], seg: int) -> list[tuple[int, int]]:
        lo, hi = bounds[seg], bounds[seg + 1]
        return [(a, min(a + self.chunk_elems, hi)) for a in range(lo, hi, self.chunk_elems)]

    def close(self) -> None:
        with self.cv:
            self.queue.append(None)
            self.cv.notify()
        self.thread.join(5.0)

    def all_reduce(self, arr) -> None:
        import numpy as np

        w, r = self.world, self.rank
        bounds = [len(arr) * i // w for i in range(w + 1)]
        tmp = np.empty(self.chunk_elems, dtype=arr.dtype)
        first = 0
        for lo, hi in self._chunks(bounds, r):
            first = self._send(arr[lo:hi])
        for s in range(w - 1):  # reduce-scatter: partial sums go round, one more rank each step
            for lo, hi in self._chunks(bounds, (r - s - 1) % w):
                self._recv_reduce(arr[lo:hi], tmp[:hi - lo])
                self._send(arr[lo:hi])  # the last step's sums are all-gather's first sends
        self._wait_sent(first)  # our own segment's first sends read it; it is received next
        for t in range(w - 1):  # all-gather: final sums go round, received in place
            for lo, hi in self._chunks(bounds, (r - t) % w):
                self._recv(arr[lo:hi])
                if t < w - 2:
                    self._send(arr[lo:hi])
        self._wait_sent(self.queued)


VARIANT_KEYS = {"chunk": "1M", "lowat": "0", "send_piece": "0", "recv_piece": "0"}


def _parse_variant(spec: str) -> tuple[str, dict[str, int]]:
    name, _, opts = spec.partition(":")
    kv = dict(o.split("=", 1) for o in opts.split(",") if o)
    unknown = set(kv) - set(VARIANT_KEYS)
    if unknown:
        raise SystemExit(f"bare_ring: unknown option(s) {sorted(unknown)} in {spec!r}")
    return name, {k: parse_size(kv.get(k, d)) for k, d in VARIANT_KEYS.items()}


def _connect_ring(rank: int, world: int, addr: str, group, lowat: int):
    """Socket to rank + 1 and from rank - 1 (ports exchanged over the gloo group)."""
    import torch.distributed as dist

    lsock = socket.socket()
    lsock.bind((addr, 0))
    lsock.listen(1)
    ends: list = [None] * world
    dist.all_gather_object(ends, (addr, lsock.getsockname()[1]), group=group)
    right = socket.create_connection(ends[(rank + 1) % world], timeout=30)
    lsock.settimeout(30)
    left, _ = lsock.accept()
    lsock.close()
    for s in (right, left):
        s.settimeout(None)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if lowat:
            s.setsockopt(socket.IPPROTO_TCP, _NOTSENT_LOWAT, lowat)
    return right, left


def rank_main(rank: int, world: int, sizes: list[int], rounds: int, reps: int,
              bare: list[str], addrs: list[str]) -> dict:
    """Times per (variant, size): this rank's seconds per sample."""
    import torch
    import torch.distributed as dist

    g = dist.new_group(backend="gloo")
    rings = {}
    for spec in bare:
        name, opt = _parse_variant(spec)
        right, left = _connect_ring(rank, world, addrs[rank], g, opt["lowat"])
        rings[name] = BareRing(rank, world, right, left, opt["chunk"], opt["send_piece"],
                               opt["recv_piece"])
    times: dict[str, list[float]] = {}
    wrong: list[str] = []
    for size in sizes:
        x = torch.ones(size // 4 // world * world)
        arr = x.numpy()
        runs = {"mccl": lambda x=x: dist.all_reduce(x),
                "gloo": lambda x=x: dist.all_reduce(x, group=g)}
        runs.update({n: (lambda ring=ring, arr=arr: ring.all_reduce(arr))
                     for n, ring in rings.items()})
        for name, fn in runs.items():  # warm-up, and a value check of every variant
            x.fill_(1.0)
            fn()
            if not bool((x == world).all()):
                wrong.append(f"{name} {size}")
        for _ in range(rounds):
            for name, fn in runs.items():
                for _ in range(reps):
                    x.fill_(1.0)
                    dist.barrier(group=g)
                    t0 = time.perf_counter()
                    fn()
                    times.setdefault(f"{name}@{size}", []).append(time.perf_counter() - t0)
    for ring in rings.values():
        ring.close()
    return {"times": times, "wrong": wrong}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--rate", default="10gbit")
    ap.add_argument("--sizes", default="64M,256M")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--bare", nargs="*", default=list(DEFAULT_BARE),
                    help='bare-ring variants "name:chunk=SIZE,lowat=SIZE,send_piece=SIZE,'
                         'recv_piece=SIZE" (0: unset / whole chunks)')
    ap.add_argument("--json", type=Path)
    ap.add_argument("--timeout", type=float, default=500.0)
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    from mccl.bench.ceiling import measure_ceiling
    from mccl.bench.cluster import Cluster

    with Cluster(args.hosts, args.rate) as c:
        bps = measure_ceiling(c)["bytes_per_s"]
        addrs = [c.addr(i) for i in range(args.hosts)]
        per_rank = run_ranks(rank_main, args.hosts, sizes, args.rounds, args.reps, args.bare,
                             addrs, backend="mccl", timeout=args.timeout,
                             pg_timeout_s=PG_TIMEOUT_S,
                             hosts=Hosts(tuple(c.hosts), c.addr(0), c.iface))
    rows = []
    for key in per_rank[0]["times"]:
        name, size = key.rsplit("@", 1)
        nbytes = int(size) // 4 // args.hosts * args.hosts * 4
        ideal = 2 * (args.hosts - 1) / args.hosts * nbytes / bps
        slowest = [max(r["times"][key][i] for r in per_rank)
                   for i in range(len(per_rank[0]["times"][key]))]
        med = statistics.median(slowest)
        rows.append({"variant": name, "size": nbytes, "median_ms": med * 1e3,
                     "min_ms": min(slowest) * 1e3, "max_ms": max(slowest) * 1e3,
                     "ideal_ms": ideal * 1e3, "pct_of_ideal": 100 * ideal / med,
                     "samples_ms": [t * 1e3 for t in slowest]})
        print(f"{name:>12} {nbytes / 2**20:6.0f} MiB  median {med * 1e3:8.2f} ms  "
              f"min {min(slowest) * 1e3:8.2f}  max {max(slowest) * 1e3:8.2f}  "
              f"ideal {ideal * 1e3:8.2f}  {100 * ideal / med:5.1f} %", flush=True)
    wrong = sorted({w for r in per_rank for w in r["wrong"]})
    if wrong:
        print("WRONG RESULTS:", wrong, flush=True)
    if args.json:
        args.json.write_text(json.dumps({
            "command": " ".join(sys.argv), "hosts": args.hosts, "rate": args.rate,
            "ceiling_Bps": bps, "rounds": args.rounds, "reps": args.reps, "bare": args.bare,
            "rows": rows, "wrong": wrong}, indent=1))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
