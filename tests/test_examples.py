"""The examples in examples/ run on mccl and agree with their single-process references."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import model_parallel  # noqa: E402

from mccl.bench.spawn import run_ranks  # noqa: E402


def test_model_parallel_example() -> None:
    """Pipeline (send/recv) and expert parallelism (uneven all_to_all_single) on 3 ranks."""
    for rank, res in enumerate(run_ranks(model_parallel.demo, 3, timeout=120)):
        model_parallel._report(rank, res)
        assert sum(res["experts"]["routed"]) > 0
