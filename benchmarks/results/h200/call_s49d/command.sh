#!/usr/bin/env bash
# Forty-ninth session, call D (carry .debs; same warm machine): the swap-order A/B of call A at
# the small sizes, for all three ops (1 and 4 MB, 4 and 8 hosts), to see whether the order
# explains the 1 MB cells of calls B and C (it does not: early and late read the same); then
# the CUDA and CPU hand-off tests on this torch (tests/: tests_cuda.log, tests_cpu_handoff.log).
set -u
mkdir -p $OUT/t; OPS=all_reduce,all_gather,reduce_scatter SIZES=1M,4M TL_RUNS=none \
    DEADLINE_S=230 RES=/tmp/ab4 OUT=$OUT \
    bash benchmarks/h200/ab.sh "early:" "late:cc_late=1" "early2:" "late2:cc_late=1"
RES=/tmp/t OUT=$OUT/t DEADLINE_S=200 bash benchmarks/h200/run_all.sh env tests
