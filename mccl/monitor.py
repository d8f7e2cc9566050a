"""monitored_barrier: rank 0 waits a bounded time for every rank and names the ones missing."""

from __future__ import annotations

import time

import numpy as np

from .errors import CollectiveError
from .ops import Kind, signature
from .transport.framing import P2P
from .transport.tcp import Mesh


def monitored_barrier(mesh: Mesh, tag: int, timeout_s: float, wait_all_ranks: bool) -> None:
    """Runs on the comm thread. Raises CollectiveError naming the ranks that did not arrive."""
    sig = signature(Kind.MONITORED_BARRIER)
    token = np.zeros(1, dtype=np.uint8)
    deadline = time.monotonic() + timeout_s
    if mesh.size == 1:
        return
    if mesh.rank != 0:
        mesh.send(0, P2P, sig, 0, token, tag=tag)
        try:
            mesh.recv_p2p_any(tag, token, deadline)
        except TimeoutError as e:
            raise CollectiveError(
                f"rank {mesh.rank}: monitored_barrier got no release from rank 0 within "
                f"{timeout_s:.1f}s", op="monitored_barrier", peer=0) from e
        return
    arrived: set[int] = set()
    missing: list[int] = []
    while len(arrived) < mesh.size - 1:
        try:
            arrived.add(mesh.recv_p2p_any(tag, token, deadline))
        except TimeoutError:
            missing = sorted(set(range(1, mesh.size)) - arrived)
            break
    if missing:
        shown = missing if wait_all_ranks else missing[:1]
        what = "Ranks" if len(shown) > 1 else "Rank"
        raise CollectiveError(
            f"{what} {', '.join(map(str, shown))} failed to pass monitored_barrier in "
            f"{timeout_s:.1f}s", op="monitored_barrier", peer=shown[0])
    for r in range(1, mesh.size):
        mesh.send(r, P2P, sig, 0, token, tag=tag)
