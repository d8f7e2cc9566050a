#!/usr/bin/env bash
# Thirtieth session, call B (carry .debs; run from the repository root): the grid all-reduce
# with its second rule (a grid only where rows pipeline and it halves the ring's steps; the
# final rule asks for 3.5-fold, so to repeat this, set grid.MIN_STEPS_RATIO = 2)
# against the ring (grid_min=1000), three runs of each, interleaved, gloo once per world:
# 5 Gbit on 16 hosts (1 and 2 MB), 10 Gbit on 12 hosts and on 8 (512 KB-2 MB; where the
# rule picks the ring, both variants run the same code: a control of the spread).
set -u
RES=/tmp/ab5 OUT=$OUT/g5 RATE=5gbit WORLDS="16" SIZES=1M,2M TL_VARIANTS=" " DEADLINE_S=190 \
    bash benchmarks/h200/ab.sh "grid:" "ring:grid_min=1000" "grid2:" "ring2:grid_min=1000" \
    "grid3:" "ring3:grid_min=1000"
RES=/tmp/ab10 OUT=$OUT/g10 RATE=10gbit WORLDS="12 8" SIZES=512K,1M,2M TL_VARIANTS=" " \
    DEADLINE_S=360 bash benchmarks/h200/ab.sh "grid:" "ring:grid_min=1000" "grid2:" \
    "ring2:grid_min=1000" "grid3:" "ring3:grid_min=1000"
# Afterwards, on the development machine (no device): the model with the grid's step counts,
# fitted to the 4- and 8-host rows of the twenty-ninth session's 10 Gbit run
# (scale_10gbit_n4and8_s29b.json: call_s29b/scale_10gbit_n12.json, rows of world <= 8):
#   python -m mccl.bench.model benchmarks/results/h200/call_s30b/scale_10gbit_n4and8_s29b.json \
#       --hosts 12,16,24,200 --png benchmarks/results/h200/call_s30b/model_10g_4and8_grid.png \
#       > benchmarks/results/h200/call_s30b/model_10g_4and8_grid.txt
