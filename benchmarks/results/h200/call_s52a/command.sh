#!/usr/bin/env bash
# Fifty-second session, call A (carry .debs; run from the repository root): the 10 Gbit
# stage (CPU all-reduce/all-gather/reduce-scatter and the CUDA all-reduce, 4 and 8 hosts,
# mccl vs gloo) with the library of 39cc830, then the CUDA and CPU hand-off tests and the
# whole suite on torch 2.11.
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=580 \
    bash benchmarks/h200/run_all.sh env cluster tests suite
