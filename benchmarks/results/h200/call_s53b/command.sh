#!/usr/bin/env bash
# Fifty-third session, call B (carry .debs; run from the repository root): the 10 Gbit stage
# again with the library of da82092 (call A's machine read every backend's CPU cost per op
# 30-50 % higher than the runs before it), then the whole suite on torch 2.11 (the fix of
# the _leave_word unit test had not run there).
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=400 \
    bash benchmarks/h200/run_all.sh env cluster suite
