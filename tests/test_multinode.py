"""torchrun across hosts: two emulated hosts (network namespaces on a bridge), two workers
each, c10d rendezvous, as on a fleet of Macs: one torchrun per machine pointing at the first.
Skips without root and iproute2 (``python -m mccl.cluster`` says why)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mccl.bench import cluster as cl
from tests.hosts import emulated_hosts, worker_prefix

PREFIX = worker_prefix("mcclmn")
TIMEOUT_S = 120

_WORKER = textwrap.dedent("""
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import mccl  # noqa: F401

    dist.init_process_group("mccl", timeout=timedelta(seconds=60))
    r, w = dist.get_rank(), dist.get_world_size()
    small = torch.full((1000,), float(r + 1))
    dist.all_reduce(small)
    large = torch.full((1 << 20,), float(r))
    dist.all_reduce(large)  # the ring, across the bridge
    ends = dist.new_group([0, w - 1])
    pair = torch.ones(3)
    if r in (0, w - 1):
        dist.all_reduce(pair, group=ends)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    for _ in range(3):
        model(torch.randn(4, 8) + r).sum().backward()
    weight = model.module.weight.grad.clone()
    first = weight.clone()
    dist.broadcast(first, 0)
    ok = (bool((small == w * (w + 1) / 2).all()) and bool((large == sum(range(w))).all())
          and bool((pair == (2 if r in (0, w - 1) else 1)).all()) and torch.equal(weight, first))
    print(f"RESULT rank={r} world={w} local={os.environ['LOCAL_RANK']} ok={ok}", flush=True)
    dist.destroy_process_group()
""")


@pytest.fixture
def two_hosts():
    with emulated_hosts(2, "1gbit", PREFIX) as c:
        yield c


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_torchrun_two_hosts_two_workers_each(two_hosts: cl.Cluster, tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    addrs = two_hosts.describe()["addrs"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = []
    for i, addr in enumerate(addrs):
        # --local-addr: the emulated hosts share one hostname, which torchrun would otherwise
        # advertise to the other host as the rendezvous store's address
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"{addrs[0]}:29400", "--rdzv-id", "mn",
                "--rdzv-conf", f"is_host={'true' if i == 0 else 'false'}",
                "--local-addr", addr, "--log-dir", str(tmp_path / f"torchrun{i}"), str(script)]
        procs.append(two_hosts.popen(i, argv, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True))
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=TIMEOUT_S)[0])
        except subprocess.TimeoutExpired:
            cl.kill_tree(proc)
            logs.append(proc.communicate()[0])
            pytest.fail("torchrun did not finish:\n" + "\n".join(x[-3000:] for x in logs))
    for proc, log in zip(procs, logs, strict=True):
        assert proc.returncode == 0, log[-4000:]
    # the workers of a host share its torchrun's output: lines may run together
    found = (re.findall(r"RESULT rank=\d+ \S+ \S+ ok=(?:True|False)", log) for log in logs)
    results = sorted(m for ms in found for m in ms)
    assert results == [f"RESULT rank={r} world=4 local={r % 2} ok=True" for r in range(4)], \
        "\n".join(logs)


def _over_link_local(rank: int, w: int, master: str, port: int) -> tuple:
    import socket
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    os.environ.pop("MCCL_SOCKET_IFNAME", None)  # the route to the master picks the address
    dist.init_process_group("mccl", init_method=f"tcp://[{master}]:{port}", rank=rank,
                            world_size=w, timeout=timedelta(seconds=30))
    t = torch.full((300_001,), float(rank + 1))
    dist.all_reduce(t)
    peers = [p for p in dist.group.WORLD._mesh.peers if p is not None]
    names = {p.sock.getpeername()[0].split("%")[0][:5] for p in peers}
    ok = bool(t.eq(w * (w + 1) / 2).all())
    dist.destroy_process_group()
    return ok, names, {p.sock.family == socket.AF_INET6 for p in peers}


LINK_LOCAL_WAIT_S = 10.0
# Each test's hosts have their own prefix: runners in parallel (xdist) may run them at once.
LINK_LOCAL_PREFIX = worker_prefix("mccl6")
IPV6_ONLY_PREFIX = worker_prefix("mccl6n")


def _link_local(c: cl.Cluster, i: int) -> str:
    """Host ``i``'s link-local IPv6 address once the kernel has finished checking it."""
    import time

    deadline = time.monotonic() + LINK_LOCAL_WAIT_S
    while time.monotonic() < deadline:
        out = subprocess.run([c.ip, "-n", c.hosts[i], "-6", "addr", "show", "dev", c.iface,
                              "scope", "link"], capture_output=True, text=True, timeout=10)
        m = re.search(r"inet6 (fe80::[0-9a-f:]+)/64 scope link\s*$", out.stdout, re.M)
        if m:  # (no "tentative" after "scope link": duplicate detection is done)
            return m.group(1)
        time.sleep(0.2)
    pytest.skip(f"host {i} has no usable IPv6 link-local address here")


def test_hosts_reach_each_other_over_ipv6_link_local() -> None:
    """A master given as a link-local IPv6 address (``fe80::...%eth0``): every rank listens
    on its own link-local address with its interface, and the group connects over IPv6."""
    import random

    from mccl.bench.spawn import HOST_PORTS, Hosts, run_ranks

    with emulated_hosts(3, None, LINK_LOCAL_PREFIX) as c:
        master = f"{_link_local(c, 0)}%{c.iface}"
        for i in (1, 2):
            _link_local(c, i)
        res = run_ranks(_over_link_local, 3, master, random.randint(*HOST_PORTS), init=False,
                        timeout=TIMEOUT_S, hosts=Hosts(tuple(c.hosts), master, c.iface))
    assert res == [(True, {"fe80:"}, {True})] * 3


def _named_interface(rank: int, w: int) -> tuple:
    import torch
    import torch.distributed as dist

    t = torch.full((300_001,), float(rank + 1))
    dist.all_reduce(t)
    peers = [p for p in dist.group.WORLD._mesh.peers if p is not None]
    return bool(t.eq(w * (w + 1) / 2).all()), sorted(p.sock.getpeername()[0] for p in peers)


def test_a_named_interface_with_ipv6_only() -> None:
    """MCCL_SOCKET_IFNAME names an interface that has IPv6 addresses only: each rank listens
    on its global IPv6 address there."""
    from mccl.bench.spawn import Hosts, run_ranks

    with emulated_hosts(3, None, IPV6_ONLY_PREFIX) as c:
        for i, host in enumerate(c.hosts):
            for argv in (["-4", "addr", "flush", "dev", c.iface],
                         ["-6", "addr", "add", f"fd77::{i + 1}/64", "dev", c.iface, "nodad"]):
                subprocess.run([c.ip, "-n", host, *argv], check=True, timeout=10)
        res = run_ranks(_named_interface, 3, timeout=TIMEOUT_S,
                        hosts=Hosts(tuple(c.hosts), "[fd77::1]", c.iface))
    assert res == [(True, [f"fd77::{p + 1}" for p in range(3) if p != r]) for r in range(3)]
