#!/usr/bin/env bash
# Thirty-fifth session, call A (carry .debs; run from the repository root): the library of
# aaf58e2 (the thirty-fourth session's last, never run on the H200) on torch 2.11: CUDA tests
# and CPU hand-off tests, then issue #7's cluster stage (10 Gbit, the machine's BBR, receive
# steering; CPU tensors 4 and 8 hosts, then CUDA all-reduce) as a regression check.
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=560 bash benchmarks/h200/run_all.sh env tests cluster
