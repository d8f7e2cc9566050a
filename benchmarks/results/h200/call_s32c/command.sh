#!/usr/bin/env bash
# Thirty-second session, call C (carry .debs; run from the repository root): the library of
# 69934e1 (this session's failure-handling fixes) on torch 2.11 with a GPU: CUDA hand-off
# tests, CPU hand-off tests, then the whole suite.
set -u
OUT=$OUT DEADLINE_S=420 bash benchmarks/h200/run_all.sh env tests suite > $OUT/run.log 2>&1
