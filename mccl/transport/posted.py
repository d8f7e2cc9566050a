"""Point-to-point receives waiting for their message, matched the way torch.distributed
users expect: messages from one peer with one tag fill receives in the order they were
posted, and a receive from any peer competes with the ones naming that peer by age.

Indexed by (source, tag), so finding the receive a message fills, and taking it out, cost
the same with thousands posted as with one (a halo exchange or a pipeline schedule may post
that many before the first message comes).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


@dataclass(eq=False)
class PostedRecv:
    """A point-to-point receive waiting for its message (``Mesh.post_recv``). Whichever read of
    the comm thread meets the message fills ``buf``, so a receive never holds up the group's
    other ops (gloo's semantics: an ``irecv`` posted before a collective does not block it)."""

    src: int | None  # None: from any peer
    tag: int
    buf: memoryview
    since: float  # posted, or the group's last collective since: the timeout counts from here
    on_filled: Callable[[PostedRecv], None]
    dtype: int = 0  # the buffer's dtype code (0: any), checked against the message's
    source: int = -1  # the peer it came from, once filled
    order: int = field(default=0, repr=False)  # when it was posted, among the mesh's


class PostedRecvs:
    """The posted receives, oldest first, with an index by (source, tag)."""

    def __init__(self) -> None:
        self._all: dict[PostedRecv, None] = {}  # insertion order: the order posted
        self._by_key: dict[tuple[int | None, int], deque[PostedRecv]] = {}
        self._per_src: dict[int | None, int] = {}  # receives posted per source (None: any)
        self._count = itertools.count(1)

    def __bool__(self) -> bool:
        return bool(self._all)

    def __len__(self) -> int:
        return len(self._all)

    def __iter__(self) -> Iterator[PostedRecv]:
        return iter(self._all)

    def add(self, pr: PostedRecv) -> None:
        pr.order = next(self._count)
        self._all[pr] = None
        self._by_key.setdefault((pr.src, pr.tag), deque()).append(pr)
        self._per_src[pr.src] = self._per_src.get(pr.src, 0) + 1

    def remove(self, pr: PostedRecv) -> None:
        del self._all[pr]
        key = (pr.src, pr.tag)
        waiting = self._by_key[key]
        if waiting[0] is pr:
            waiting.popleft()
        else:
            waiting.remove(pr)
        if not waiting:
            del self._by_key[key]
        left = self._per_src[pr.src] - 1
        if left:
            self._per_src[pr.src] = left
        else:
            del self._per_src[pr.src]

    def asks_for(self, src: int) -> bool:
        """Whether a posted receive may take a message from ``src`` (one naming it, or one
        from any peer), whatever its tag."""
        return src in self._per_src or None in self._per_src

    def match(self, src: int, tag: int) -> PostedRecv | None:
        """The receive a message from ``src`` with ``tag`` fills: the oldest of those naming
        ``src`` and those from any peer."""
        named = self._by_key.get((src, tag))
        anyone = self._by_key.get((None, tag))
        if named and anyone:
            return named[0] if named[0].order < anyone[0].order else anyone[0]
        if named:
            return named[0]
        return anyone[0] if anyone else None

    def oldest_per_source(self) -> list[PostedRecv]:
        """The oldest receive of each source named (None counts as one source)."""
        firsts: dict[int | None, PostedRecv] = {}
        for waiting in self._by_key.values():
            pr = waiting[0]
            best = firsts.get(pr.src)
            if best is None or pr.order < best.order:
                firsts[pr.src] = pr
        return sorted(firsts.values(), key=lambda pr: pr.order)
