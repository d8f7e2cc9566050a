#!/usr/bin/env bash
# Thirty-second session, call D (carry .debs; run from the repository root): call A again,
# the two passes in the other order (queued first), library of 69934e1.
set -u
export OPS=all_reduce,all_gather,reduce_scatter SIZES=1M,4M,16M TL_VARIANTS=" " WORLDS="8 4"
for mode in queue4 blocking; do
    a=""; [ $mode = queue4 ] && a="--queue 4"
    BENCH_ARGS="$a" RES=/tmp/ab-$mode OUT=$OUT/$mode DEADLINE_S=265 bash benchmarks/h200/ab.sh base:
done
