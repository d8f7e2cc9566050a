"""How long a group's full mesh of connections takes to set up, for many ranks at once.

    python benchmarks/mesh_setup.py --ranks 16,64,128 [--backlog 4] [--order nearest,zero]
        [--rounds 2] [--json FILE]

Every rank is a thread of this one process (so hundreds fit on a small machine), running
``rendezvous.connect_mesh`` on loopback over an in-process store: the handshakes, the
acceptors and the listen backlog are mccl's own; the times include this process's GIL, so
compare variants with each other, not with a real network. ``--order zero`` dials rank 0
first (every rank's first dial lands on rank 0 at once, the order before the twenty-eighth
session), ``nearest`` is the library's (rank r dials r - 1 first). ``--backlog`` overrides
``rendezvous.LISTEN_BACKLOG`` (the library listens with at least the group's size; pass a
small one to see what a kernel cap such as macOS's default 128 does to a larger group).
Needs about n^2 file descriptors (``ulimit -n``).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ORDERS = ("nearest", "zero")
TIMEOUT_S = 120.0


def setup_once(n: int, order: str, backlog: int | None) -> dict:
    import torch.distributed as dist

    from mccl.transport import rendezvous

    saved = rendezvous.dial_order, rendezvous.LISTEN_BACKLOG
    if order == "zero":
        rendezvous.dial_order = lambda rank: range(rank)
    listen = rendezvous.socket.socket.listen
    if backlog is not None:  # the kernel's cap, as a smaller somaxconn would impose it
        rendezvous.socket.socket.listen = lambda self, _n=0: listen(self, backlog)
    store = dist.HashStore()
    took: list[float | None] = [None] * n
    errors: list[str] = []
    meshes: list[dict] = [{} for _ in range(n)]

    def rank(r: int) -> None:
        t0 = time.monotonic()
        try:
            _, meshes[r] = rendezvous.connect_mesh(store, r, n, f"setup{n}{order}", TIMEOUT_S,
                                                   "127.0.0.1")
            took[r] = time.monotonic() - t0
        except Exception as e:  # noqa: BLE001 - reported in the result
            errors.append(f"rank {r}: {e!r}")

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(n)]
    t0 = time.monotonic()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT_S + 10)
        wall = time.monotonic() - t0
    finally:
        rendezvous.dial_order, rendezvous.LISTEN_BACKLOG = saved
        rendezvous.socket.socket.listen = listen
        for m in meshes:
            for s in m.values():
                s.close()
    done = [t for t in took if t is not None]
    return {"ranks": n, "order": order, "backlog": backlog, "wall_s": round(wall, 3),
            "slowest_rank_s": round(max(done), 3) if done else None,
            "connected": len(done), "errors": errors[:5]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="16,64,128")
    ap.add_argument("--order", default=",".join(ORDERS))
    ap.add_argument("--backlog", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    orders = args.order.split(",")
    if not set(orders) <= set(ORDERS):
        ap.error(f"--order takes {', '.join(ORDERS)}")
    rows = []
    for n in (int(x) for x in args.ranks.split(",")):
        for rnd in range(args.rounds):
            for order in orders:  # interleaved, so drift hits both
                row = setup_once(n, order, args.backlog) | {"round": rnd}
                rows.append(row)
                print(f"ranks {n:4d}  order {order:8s} backlog {args.backlog or 'library'}: "
                      f"{row['wall_s']:.2f} s, {row['connected']}/{n} connected"
                      + (f", errors {row['errors']}" if row["errors"] else ""), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows},
                                        indent=1) + "\n")
    return 0 if all(r["connected"] == r["ranks"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
