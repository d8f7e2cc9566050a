#!/usr/bin/env bash
# Forty-third session, call B (carry .debs; run from the repository root), code of e9c510f
# (the bad-input fixes of eb52a38, the Work.wait timeout check and the CUDA
# expanded-view case): CUDA and CPU hand-off tests, then the whole suite (8 workers).
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=400 bash benchmarks/h200/run_all.sh env tests suite
