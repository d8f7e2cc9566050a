#!/usr/bin/env bash
# Thirty-fifth session, call B (carry .debs; run from the repository root): this session's
# library (any-source receive blame, bench/model CLI checks, generations of default groups in
# the store) on torch 2.11 with a GPU: CUDA tests, CPU hand-off tests, then the whole suite.
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=540 bash benchmarks/h200/run_all.sh env tests suite
