#!/usr/bin/env bash
# Thirtieth session, call D (carry .debs; run from the repository root): the grid
# all-gather and reduce-scatter (flat forms: a row phase of single-chunk steps and a column
# phase of row blocks) against the ring (grid_min=1000), two runs of each, interleaved, gloo
# once: 16 hosts at 5 Gbit, then 8 hosts at 10 Gbit; sizes are the gathered output and the
# full input (1 MB: a grid on both, 2 MB: a grid on 16 hosts, the ring in both on 8).
set -u
RES=/tmp/ab5 OUT=$OUT/g5 RATE=5gbit WORLDS="16" OPS=all_gather,reduce_scatter SIZES=1M,2M \
    TL_VARIANTS=" " DEADLINE_S=230 bash benchmarks/h200/ab.sh "grid:" "ring:grid_min=1000" \
    "grid2:" "ring2:grid_min=1000"
RES=/tmp/ab10 OUT=$OUT/g10 RATE=10gbit WORLDS="8" OPS=all_gather,reduce_scatter SIZES=1M,2M \
    TL_VARIANTS=" " DEADLINE_S=200 bash benchmarks/h200/ab.sh "grid:" "ring:grid_min=1000" \
    "grid2:" "ring2:grid_min=1000"
