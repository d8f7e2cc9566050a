#!/usr/bin/env bash
# Thirtieth session, call A (carry .debs; run from the repository root): the two-level grid
# all-reduce (mccl/algorithms/grid.py) against the ring (grid_min=1000), two runs of each,
# interleaved, gloo once per world: 10 Gbit on 8 and 4 hosts, then 5 Gbit on 16 hosts,
# all_reduce 256 KB-2 MB on CPU tensors. It ran the grid's first rule (a grid wherever
# it had fewer single-chunk steps than the ring: no 2-chunk floor on rows, no ratio);
# the final rule (grid.columns) picks fewer cells, see benchmarks/results/h200/README.md.
set -u
RES=/tmp/ab10 OUT=$OUT/g10 RATE=10gbit WORLDS="8 4" SIZES=256K,512K,1M,2M TL_VARIANTS=" " \
    DEADLINE_S=300 bash benchmarks/h200/ab.sh "grid:" "ring:grid_min=1000" "grid2:" "ring2:grid_min=1000"
RES=/tmp/ab5 OUT=$OUT/g5 RATE=5gbit WORLDS="16" SIZES=512K,1M,2M,4M TL_VARIANTS=" " \
    DEADLINE_S=270 bash benchmarks/h200/ab.sh "grid:" "ring:grid_min=1000" "grid2:" "ring2:grid_min=1000"
