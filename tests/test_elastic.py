"""Elastic restart under torchrun: a worker is killed, torchrun restarts the group, training
resumes from the last checkpoint and ends with the same weights as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

from mccl.bench.spawn import free_port

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import elastic_train  # noqa: E402


def _torchrun(tmp_path: Path, args: list[str], timeout: float) -> str:
    """Run torchrun with 2 workers on ``args``; its output, once it exited 0 (else fail)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--log-dir", str(tmp_path / "torchrun"),  # else torchrun leaves a dir in /tmp
           *args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its workers
        log, _ = proc.communicate()
        raise AssertionError(f"torchrun did not finish:\n{log[-4000:]}") from None
    assert proc.returncode == 0, log[-4000:]
    return log


def test_killed_worker_restarts_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    log = _torchrun(tmp_path, [
        "--max-restarts", "2", "--monitor-interval", "0.2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
        str(ROOT / "examples" / "elastic_train.py"), "--steps", "30", "--ckpt-every", "5",
        "--crash-at-step", "17", "--ckpt-dir", str(tmp_path), "--out", str(out)], 240)
    res = json.loads(out.read_text())
    assert res["attempt"] == 1, res  # one restart happened
    assert res["resumed_from"] == 15, res  # the last checkpoint before the crash at step 17
    want = elastic_train.reference(30, 2)
    assert torch.allclose(torch.tensor(res["w"], dtype=torch.float64), want, rtol=0, atol=1e-12)
    assert "CollectiveError" in log or "exitcode: -9" in log, log[-4000:]


_REINIT = """
from datetime import timedelta

import torch
import torch.distributed as dist

import mccl  # noqa: F401

for i in range(3):
    dist.init_process_group("mccl", timeout=timedelta(seconds=30))
    g = dist.new_group([0, 1])
    t = torch.full((4,), float(dist.get_rank() + 1 + i))
    dist.all_reduce(t)
    dist.all_reduce(t, group=g)
    print(f"rank {dist.get_rank()} init {i}: {t[0].item()}", flush=True)
    dist.destroy_process_group()
"""


def test_init_again_after_destroy_under_torchrun(tmp_path: Path) -> None:
    """torchrun's store keeps a destroyed group's keys and torch names the next groups alike:
    a second and third init_process_group in the same workers must not read the keys of the
    first (a rank would dial a listener that is gone and wait out the timeout)."""
    script = tmp_path / "reinit.py"
    script.write_text(_REINIT)
    log = _torchrun(tmp_path, ["--master-port", str(free_port()), str(script)], 180)
    for i in range(3):
        for rank in range(2):
            assert f"rank {rank} init {i}: {6.0 + 4 * i}" in log, log[-4000:]
