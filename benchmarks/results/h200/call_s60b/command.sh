#!/usr/bin/env bash
# NOT RUN: the sixtieth session had no device time left for it. To run at commit b9cc6aa
# (git checkout b9cc6aa; the commit after it reverted the caller's-stream copies).
# Sixtieth session, call B (run from the repository root): the CUDA tests again, after
# call A's new test was changed (its tensor was zeroed on the default stream and filled on
# another: a race of the test's own, which may explain call A's failure). If they pass, the
# caller's-stream copies can come back (git revert of the commit after b9cc6aa, library part).
set -u
R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader >$R/gpu.txt 2>&1
timeout 120 python3 -m pytest -q tests/test_device_cuda.py >$R/tests_cuda.log 2>&1; echo "rc=$?" >>$R/tests_cuda.log
cp $R/tests_cuda.log $OUT/; cat $R/gpu.txt; tail -30 $R/tests_cuda.log
