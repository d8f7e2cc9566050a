"""Emulated hosts for tests that need separate hosts: a cluster brought up for one test, or
the test skipped with the one-line reason (no root, no iproute2, not Linux)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from mccl.bench import cluster as cl


def worker_prefix(base: str) -> str:
    """``base`` (a file's cluster prefix) made this test runner's own: under xdist, tests of
    one file run on several workers at once, and two clusters of one prefix replace each
    other's namespaces (seen on the H200's 8-worker suite runs)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "").removeprefix("gw")
    return base if not worker else base[: 8 - len(worker)] + worker


def cluster_or_skip(n: int, rate: str | None, prefix: str) -> cl.Cluster:
    """A cluster of ``n`` hosts that could come up here (not up yet); else skip the test."""
    c = cl.Cluster(n, rate, prefix=prefix)
    try:
        c.check()
    except cl.ClusterUnavailable as exc:
        pytest.skip(str(exc))
    return c


@contextmanager
def emulated_hosts(n: int, rate: str | None, prefix: str) -> Iterator[cl.Cluster]:
    """``n`` hosts on a bridge with links shaped to ``rate``; removed (and checked gone)
    when the test ends."""
    c = cluster_or_skip(n, rate, prefix)
    try:
        yield c.up()
    finally:
        c.down()
        assert cl.list_namespaces(c.ip, prefix) == []
