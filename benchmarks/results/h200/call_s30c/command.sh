#!/usr/bin/env bash
# Thirtieth session, call C (carry .debs; run from the repository root), the final rule
# (grid.MIN_STEPS_RATIO = 3.5): the grid's tests on torch 2.11, then the grid against the
# ring (grid_min=1000), two runs of each, interleaved, gloo once: 24 hosts at 1 Gbit
# (1 MB: a 4 x 6 grid, 2 MB: 2 x 12, 4 MB: the ring in both, a control), then 16 hosts at
# 10 Gbit (1 MB: 4 x 4, 2 MB: 2 x 8).
set -u
mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_algorithms.py \
    tests/test_matrix.py tests/test_bench_tools.py -k "grid or model" >"$OUT/tests.log" 2>&1
tail -3 "$OUT/tests.log"
RES=/tmp/ab1 OUT=$OUT/g1 RATE=1gbit WORLDS="24" SIZES=1M,2M,4M TL_VARIANTS=" " DEADLINE_S=200 \
    bash benchmarks/h200/ab.sh "grid:" "ring:grid_min=1000" "grid2:" "ring2:grid_min=1000"
RES=/tmp/ab10 OUT=$OUT/g10 RATE=10gbit WORLDS="16" SIZES=1M,2M,4M TL_VARIANTS=" " \
    DEADLINE_S=170 bash benchmarks/h200/ab.sh "grid:" "ring:grid_min=1000" "grid2:" \
    "ring2:grid_min=1000"
