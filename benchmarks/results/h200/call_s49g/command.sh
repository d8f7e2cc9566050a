#!/usr/bin/env bash
# Forty-ninth session, call G (carry .debs; run from the repository root): on a second, fresh
# H100 machine of the H200 kind (slower at 1 MB than the one of calls A-F, for gloo too), an
# op's first large send to a peer written by the op's own thread (the default) against
# queued to the sender thread like the others (start_write=0), 1 and 4 MB, all three ops, 8
# then 4 hosts, two alternated runs each, gloo beside them. Not kept: no gain.
set -u
mkdir -p $OUT; WORLDS="8 4" OPS=all_reduce,all_gather,reduce_scatter SIZES=1M,4M TL_RUNS=none \
    DEADLINE_S=185 RES=/tmp/ab6 OUT=$OUT \
    bash benchmarks/h200/ab.sh "base:" "q:start_write=0" "base2:" "q2:start_write=0"
