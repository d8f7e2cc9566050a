"""The command-line tools refuse bad input in one line before any rank starts, clean up on
SIGTERM as on Ctrl-C, keep what was measured, and leave a user's cluster alone.

No timing thresholds: every wait is for a condition, under a generous deadline; every
subprocess has a timeout. Cluster tests skip without root and iproute2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mccl.bench import cluster as cl

REPO = Path(__file__).resolve().parents[1]
PREFIX = "mcclcli"  # neither a user's "mccl" cluster nor the other tests' prefix
RUN_TIMEOUT_S = 120
#: Exits before any rank starts.
QUICK = ["--ceiling-seconds", "0", "--world-sizes", "2", "--sizes", "8", "--backends", "gloo",
         "--iters", "1", "--warmup", "0", "--time-budget", "0", "--min-sample", "0"]


def _run(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S, env=env)


def _one_line_error(res: subprocess.CompletedProcess, status: int, text: str) -> None:
    assert res.returncode == status, res.stderr[-2000:]
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    assert text in res.stderr, res.stderr[-2000:]


def _cluster_or_skip(hosts: int = 2) -> cl.Cluster:
    c = cl.Cluster(hosts, None, prefix=PREFIX)
    try:
        c.check()
    except cl.ClusterUnavailable as exc:
        pytest.skip(str(exc))
    return c


def _remove_test_cluster(ip: str | None) -> None:
    if ip:
        cl.remove_namespaces(ip, PREFIX)
    cl._set_owner(PREFIX, None)


# -- 2: a cluster made to stay is not a crashed run's leftovers ---------------------------
def test_owner_record_tells_leftovers_from_clusters_made_to_stay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cl, "OWNER_DIR", str(tmp_path))
    assert not cl.is_run_leftover(PREFIX)  # nothing recorded: made by hand or by `up`
    cl._set_owner(PREFIX, cl.PERSISTENT_OWNER)
    assert not cl.is_run_leftover(PREFIX) and cl.owner_pid(PREFIX) is None
    cl._set_owner(PREFIX, os.getpid())  # this process made it
    assert cl.is_run_leftover(PREFIX)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    cl._set_owner(PREFIX, gone.pid)  # a crashed run
    assert cl.is_run_leftover(PREFIX)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        cl._set_owner(PREFIX, live.pid)  # another run, still going
        assert not cl.is_run_leftover(PREFIX) and cl.owner_pid(PREFIX) == live.pid
    finally:
        live.kill()
        live.wait(timeout=10)


@pytest.mark.timeout(180)
def test_runs_refuse_to_replace_a_cluster_made_with_up() -> None:
    """Before: bench --cluster and train --cluster deleted a cluster made with
    `python -m mccl.cluster up` (it records no owner, and was taken for leftovers)."""
    made = _cluster_or_skip()
    try:
        made.up(persist=True)
        names = cl.list_namespaces(made.ip, PREFIX)
        for owner in (cl.PERSISTENT_OWNER, None):  # as `up` records it; as older `up` did
            cl._set_owner(PREFIX, owner)
            run = cl.Cluster(2, None, prefix=PREFIX)
            with pytest.raises(cl.ClusterError, match=f"--prefix {PREFIX} down"):
                run.up()
            run.down()  # a refused run's clean-up leaves it alone too
            assert cl.list_namespaces(made.ip, PREFIX) == names
        res = _run("mccl.bench", "--cluster", "--prefix", PREFIX, *QUICK)
        _one_line_error(res, 3, "already has a cluster that no run owns")
        assert cl.list_namespaces(made.ip, PREFIX) == names
    finally:
        _remove_test_cluster(made.ip)
