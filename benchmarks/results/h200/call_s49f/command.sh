#!/usr/bin/env bash
# Forty-ninth session, call F (carry .debs; run from the repository root; same warm H100
# machine as calls A-E): per-chunk timelines (benchmarks/timeline.py) of 1 MB ops on 8
# emulated 10 Gbit hosts, back to back, to see what the reduce-scatter does beyond the
# all-gather of the same size. This folder holds the second of two such calls (reduce_scatter
# and all_gather, every rank's events); the first also traced all_reduce, but only its
# printed summary came back (notes.md).
set -u
. scripts/iproute2_env.sh .debs >/dev/null 2>&1
mkdir -p $OUT /tmp/tl
for op in reduce_scatter all_gather; do
    timeout --kill-after=10 80 python3 benchmarks/timeline.py --hosts 8 --rate 10gbit --op $op \
        --size 1M --reps 12 --backend mccl --out /tmp/tl/tl-$op-1M > /tmp/tl/tl-$op-1M.log 2>&1
done
tar -czf $OUT/tl.tar.gz -C /tmp/tl .
