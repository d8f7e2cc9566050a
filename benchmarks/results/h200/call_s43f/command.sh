#!/usr/bin/env bash
# Forty-third session, call F (carry .debs; run from the repository root), code of e7c687b
# (the probe fix, cluster prefixes per worker, sub-second and capped timeouts): CUDA and CPU
# hand-off tests, then the whole suite (8 workers).
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=330 bash benchmarks/h200/run_all.sh env tests suite
