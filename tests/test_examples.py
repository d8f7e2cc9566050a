"""The examples in examples/ run on mccl and agree with their single-process references."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import model_parallel  # noqa: E402
import pytest  # noqa: E402
import train_ddp  # noqa: E402

from mccl.bench.spawn import run_ranks  # noqa: E402


def test_model_parallel_example() -> None:
    """Pipeline (send/recv) and expert parallelism (uneven all_to_all_single) on 3 ranks."""
    for rank, res in enumerate(run_ranks(model_parallel.demo, 3, timeout=120)):
        model_parallel._report(rank, res)
        assert sum(res["experts"]["routed"]) > 0


@pytest.mark.parametrize("argv, named", [
    (["--steps", "0"], "--steps: must be >= 1, got 0"),
    (["--batch-size", "-1"], "--batch-size: must be >= 1, got -1"),
    (["--log-every", "0"], "--log-every: must be >= 1"),
    (["--timeout", "nan"], "--timeout: must be > 0, got nan"),
])
def test_train_ddp_refuses_settings_that_train_nothing(argv, named, capsys) -> None:
    """Before: ``--steps 0`` printed the header and exited 0 as if it had trained."""
    with pytest.raises(SystemExit) as ended:
        train_ddp.parse_args(argv)
    assert ended.value.code == 2
    assert named in capsys.readouterr().err
    assert train_ddp.parse_args([]).steps == 40
