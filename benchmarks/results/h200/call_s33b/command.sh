#!/usr/bin/env bash
# Thirty-third session, call B (carry .debs; run from the repository root): this session's
# library on torch 2.11 with a GPU: CUDA hand-off tests (the in-place cases now include
# outputs sharing memory), CPU hand-off tests, then the whole suite.
set -u
OUT=$OUT DEADLINE_S=480 bash benchmarks/h200/run_all.sh env tests suite > $OUT/run.log 2>&1
