#!/usr/bin/env bash
# Thirty-fourth session, call A (carry .debs; run from the repository root): the CUDA tests,
# now with the op x dtype x size matrix on CUDA tensors (2, 3, 4 ranks sharing the GPU), a
# rank killed with CUDA all-reduces queued, and object collectives / barrier(device_ids) /
# a subgroup with a CUDA device current; then the CPU hand-off tests. torch 2.11.
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=420 bash benchmarks/h200/run_all.sh env tests
