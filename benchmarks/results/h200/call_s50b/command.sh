#!/usr/bin/env bash
# Fiftieth session, call B (carry .debs; run from the repository root; same machine as call A,
# same code as call A, not in the repository): per-chunk timelines of a 1 MB reduce-scatter
# on 8 emulated 10 Gbit hosts, meant as overlap ("new") against no overlap
# ("old": rs_overlap=0). Both ran the overlapped code: the A/B hook failed to import mccl in
# the timeline's processes ("Error in sitecustomize ... No module named 'mccl'" in
# timeline-old-reduce_scatter-1M.log), fixed in 91e201f. WORLDS="" fell back to ab.sh's
# default "4 8", so gloo's all-reduce bench ran on 4 and 8 hosts first. The ranks' event files
# are in timelines.tar.gz.
set -u
WORLDS="" TL_RUNS="reduce_scatter:1M" TL_HOSTS=8 TL_VARIANTS="new: old:rs_overlap=0" \
    DEADLINE_S=200 RES=/tmp/abt OUT=$OUT bash benchmarks/h200/ab.sh
