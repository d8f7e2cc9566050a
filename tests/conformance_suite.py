"""PyTorch's own distributed conformance suite (``distributed_test._DistTestBase``) bound to mccl.

PyTorch gates many of its tests on backend names at import time (``BACKEND`` env var and the
``DistTestCases`` feature sets), so this module sets ``BACKEND=mccl``, declares mccl in the
feature sets it really has (plugin, ddp, subgroup; not gpu/cuda: this suite's GPU tests assume
NCCL-style one-GPU-per-rank), and only then imports the suite.

Each test forks ``WORLD_SIZE`` ranks (fork, not spawn: a spawned rank re-imports torch, ~5 s).
Not collected by pytest itself (the name does not start with ``test_``); ``test_conformance``
picks a curated subset and ``scripts/conformance.py`` runs a broad selection.
"""

from __future__ import annotations

import json
import os
import sys
import unittest
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

import mccl  # noqa: F401 - registers the backend before the suite's decorators run

#: The suite's world size; torch reads it when its module is imported (decorators) and again
#: while a test runs.
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "3"))
#: Variables the suite reads or writes; ``suite_env`` sets and then restores them, so
#: importing or running the suite inside pytest leaves the process's environment as it was.
_ENV_KEYS = ("BACKEND", "WORLD_SIZE", "TEMP_DIR", "INIT_METHOD", "MASTER_ADDR", "MASTER_PORT")


@contextmanager
def suite_env() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in _ENV_KEYS}
    os.environ["BACKEND"] = mccl.BACKEND_NAME
    os.environ["WORLD_SIZE"] = str(WORLD_SIZE)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


try:
    import expecttest  # noqa: F401 - torch.testing._internal needs it
except ImportError:  # pragma: no cover - reported by callers as a skip
    AVAILABLE = False
    IMPORT_ERROR = "expecttest is not installed (pip install expecttest)"
else:
    AVAILABLE = True
    IMPORT_ERROR = ""

#: Tests torch skips for every backend but gloo/nccl/mpi *by name* whose bodies run on CPU
#: tensors with any backend, and pass on mccl: run them (see docs/CONFORMANCE.md). The value
#: says what torch's gate claims.
UNLOCKED: dict[str, str] = {
    # (the *_group variants also need WORLD_SIZE >= 8: torch skips them on smaller worlds)
    **{f"test_all_reduce_coalesced_{g}{op}": "gloo only"
       for g in ("", "full_group_", "group_") for op in ("sum", "product", "min", "max")},
    **{f"test_all_to_all{v}": "Only MPI supports all_to_all"
       for v in ("", "_complex", "_full_group", "_group")},
    **{f"test_all_to_all_single_{s}{v}": "Only MPI supports CPU all_to_all_single"
       for s in ("equal_split", "unequal_split")
       for v in ("", "_complex", "_full_group", "_group")},
    "test_batch_isend_irecv_gloo": "GLOO Batch Send Recv CPU",
    "test_batch_isend_irecv_gloo_tags": "GLOO Batch Send Recv CPU",
    "test_batch_isend_irecv_op_list_err": "NCCL Batch Send Recv Only",
    "test_all_gather_object_default_pg": "gloo/ucc/nccl only",
    "test_all_gather_object_subgroup": "gloo/ucc/nccl only",
    "test_gather_object": "gloo/ucc/nccl only",
    "test_gather_object_subgroup": "gloo/ucc/nccl only",
    "test_scatter_object_list": "gloo only",
    "test_get_future": "get_future is only supported on mpi, nccl and gloo",
    "test_grads_same_across_ranks_with_no_sync": "gloo only",
    "test_sparse_all_reduce_sum": "Only Gloo backend supports sparse all reduce",
}

if AVAILABLE and dist.is_available():
    with suite_env():
        from torch.testing._internal import common_distributed as _cd

        for _feature in ("plugin", "ddp", "subgroup"):
            _cd.DistTestCases.backend_feature[_feature].add(mccl.BACKEND_NAME)
        if "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT" not in os.environ:
            _cd.TIMEOUT_DEFAULT = 90  # per test, then its ranks are killed (torch: 300 s)
        from torch.testing._internal.distributed.distributed_test import (
            DistributedTest,
            TestDistBackend,
        )

    class TestMcclConformance(TestDistBackend, DistributedTest._DistTestBase):
        """PyTorch's distributed tests, run on backend ``mccl`` with forked ranks."""

        def setUp(self) -> None:
            super().setUp()
            self._start_processes(torch.multiprocessing.get_context("fork").Process)

        def tearDown(self) -> None:
            super().tearDown()
            # torch's harness makes a FileStore file in /tmp per test (file:// init); the
            # store deletes it when its last user closes, which a test whose ranks exit
            # without releasing it never does (one file per suite run here)
            try:
                os.remove(self.file_name)
            except FileNotFoundError:
                pass

    def _name_gated(fn) -> bool:
        why = getattr(fn, "__unittest_skip_why__", "") or ""
        return bool(getattr(fn, "__unittest_skip__", False)) and any(
            k in why.lower() for k in ("gloo", "nccl", "mpi", "ucc", "backend mccl"))

    NAME_GATED: list[str] = sorted(
        n for n in dir(DistributedTest._DistTestBase)
        if n.startswith("test_") and _name_gated(getattr(DistributedTest._DistTestBase, n)))

    def unlock(names) -> None:
        """Run these tests although torch skips them by backend name: the subclass gets a
        plain method calling the suite's function (its own hardware checks still apply)."""
        for name in names:
            fn = getattr(DistributedTest._DistTestBase, name, None)
            if fn is None:  # renamed or gone in this torch version
                continue

            def test(self, _fn=fn):
                return _fn(self)

            test.__name__ = name
            setattr(TestMcclConformance, name, test)

    unlock(UNLOCKED)
    if os.environ.get("MCCL_CONFORMANCE_UNLOCK_ALL") == "1":
        unlock(NAME_GATED)

    ALL_TESTS: list[str] = sorted(n for n in dir(TestMcclConformance) if n.startswith("test_"))
else:  # pragma: no cover
    TestMcclConformance = None  # type: ignore[assignment,misc]
    NAME_GATED = []
    ALL_TESTS = []


def run_one(name: str) -> tuple[str, str]:
    """Run one suite test in this process (it forks its ranks); returns (outcome, detail) with
    outcome one of passed, failed, skipped."""
    if TestMcclConformance is None:
        return "skipped", IMPORT_ERROR
    if name not in ALL_TESTS:
        return "failed", f"{name} is not in this torch version's suite"
    result = unittest.TestResult()
    with suite_env():
        TestMcclConformance(name).run(result)
    if result.errors or result.failures:
        return "failed", "\n".join(tb for _, tb in result.errors + result.failures)
    if result.skipped:
        return "skipped", "; ".join(reason for _, reason in result.skipped)
    return "passed", ""


def main(argv: list[str]) -> int:
    """``python -m tests.conformance_suite OUT.jsonl NAME...``: run the tests in this fresh
    process (forking ranks from a process that ran nothing else) and append one JSON line per
    test to OUT.jsonl as it finishes."""
    out, names = argv[0], argv[1:]
    with open(out, "a") as f:
        for name in names:
            outcome, detail = run_one(name)
            f.write(json.dumps({"test": name, "outcome": outcome, "detail": detail[-4000:]})
                    + "\n")
            f.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
