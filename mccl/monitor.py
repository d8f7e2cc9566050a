"""monitored_barrier: rank 0 waits a bounded time for every rank and names the ones missing."""

from __future__ import annotations

import time

import numpy as np

from .errors import CollectiveError
from .ops import Kind, signature
from .transport.framing import P2P
from .transport.mesh import Mesh


def monitored_barrier(mesh: Mesh, tag: int, timeout_s: float, wait_all_ranks: bool) -> None:
    """Runs on the comm thread. Raises CollectiveError naming the ranks that did not arrive.

    The other ranks wait for rank 0's release for ``timeout_s`` plus the group's timeout (gloo
    waits the group's timeout): rank 0 may enter later than they do, and a rank that gave up
    first would fail rank 0's wait with its own error instead of the names of the missing."""
    sig = signature(Kind.MONITORED_BARRIER)
    token = np.zeros(1, dtype=np.uint8)
    now = time.monotonic()
    if mesh.size == 1:
        return
    if mesh.rank != 0:
        waited = timeout_s + mesh.timeout_s
        mesh.send(0, P2P, sig, 0, token, tag=tag)
        try:
            mesh.recv_p2p_any(tag, token, now + waited)
        except TimeoutError as e:
            raise CollectiveError(
                f"rank {mesh.rank}: monitored_barrier got no release from rank 0 within "
                f"{waited:.1f}s", op="monitored_barrier", peer=0) from e
        return
    deadline = now + timeout_s
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
