"""A curated subset of PyTorch's own distributed conformance suite, run on mccl (3 ranks).

The full selection runs with ``python scripts/conformance.py`` (docs/CONFORMANCE.md has the
results and the reasons for every skip). This subset covers each collective, p2p (tags, any
source, batched), object collectives, subgroups and DDP, in about a second per test (ranks are
forked). Note: torch's all_reduce tests here do not check reduced values for every op; the
value checks live in test_matrix.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CI_SUBSET = [
    # collectives
    "test_all_reduce_sum", "test_all_reduce_max", "test_all_reduce_min", "test_all_reduce_product",
    "test_all_reduce_sum_async", "test_all_reduce_sum_complex",
    "test_all_reduce_complex_unsupported_ops", "test_all_reduce_full_group_sum",
    "test_all_reduce_coalesced_sum", "test_all_reduce_coalesced_max_complex_unsupported",
    "test_broadcast", "test_broadcast_full_group", "test_reduce_sum", "test_reduce_product",
    "test_reduce_full_group_max", "test_reduce_sum_twice", "test_all_gather",
    "test_all_gather_complex", "test_all_gather_full_group", "test_all_gather_coalesced_simple",
    "test_all_gather_coalesced_with_empty", "test_gather", "test_gather_checks", "test_scatter",
    "test_scatter_checks", "test_scatter_complex", "test_all_to_all",
    "test_all_to_all_single_equal_split", "test_all_to_all_single_unequal_split",
    "test_all_to_all_single_unequal_split_complex", "test_barrier", "test_sparse_all_reduce_sum",
    # point to point
    "test_send_recv", "test_send_recv_with_tag", "test_send_recv_any_source", "test_isend",
    "test_irecv", "test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags",
    "test_get_future",
    # objects and groups
    "test_all_gather_object_default_pg", "test_all_gather_object_subgroup", "test_gather_object",
    "test_scatter_object_list", "test_get_rank_size_group", "test_destroy_group",
    "test_get_backend", "test_Backend_enum_class",
    # DDP
    "test_DistributedDataParallelCPU", "test_DistributedDataParallel_requires_grad",
    "test_ddp_create_graph", "test_static_graph_api_cpu",
    "test_grads_same_across_ranks_with_no_sync",
]


def _available() -> bool:
    return importlib.util.find_spec("expecttest") is not None


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, dict]:
    """Runs the whole subset once, in a fresh interpreter: the ranks are forked from a process
    that ran nothing else (no other test's threads or torch state), and importing torch's test
    utilities (which change global torch flags) stays out of this pytest process."""
    out = tmp_path_factory.mktemp("conformance") / "results.jsonl"
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(root), os.environ.get("PYTHONPATH", "")]))
    for k in ("BACKEND", "WORLD_SIZE"):  # the suite sets its own
        env.pop(k, None)
    log = out.with_suffix(".log")
    with open(log, "w") as f:  # the ranks are chatty; keep their output out of the pipe
        proc = subprocess.run([sys.executable, "-m", "tests.conformance_suite", str(out),
                               *CI_SUBSET], cwd=root, env=env, timeout=900,
                              stdout=f, stderr=subprocess.STDOUT)
    rows = {}
    if out.exists():
        for line in out.read_text().splitlines():
            row = json.loads(line)
            rows[row["test"]] = row
    if proc.returncode != 0:
        rows["__error__"] = {"detail": log.read_text()[-4000:]}
    return rows


@pytest.mark.skipif(not _available(), reason="expecttest is not installed (dev extra)")
@pytest.mark.timeout(900)  # the first test also runs the module fixture (the whole subset)
@pytest.mark.parametrize("name", CI_SUBSET)
def test_torch_conformance(results: dict[str, dict], name: str) -> None:
    row = results.get(name)
    if row is None:
        pytest.fail(f"{name}: no result; the suite process said:\n"
                    f"{results.get('__error__', {}).get('detail', '')}")
    assert row["outcome"] == "passed", f"{name}: {row['outcome']}\n{row['detail']}"
