#!/usr/bin/env bash
# Thirty-second session, call B (carry .debs; run from the repository root): per-chunk
# timelines (benchmarks/timeline.py, 12 back-to-back ops each) on 8 emulated 10 Gbit hosts
# (BBR, steered) of a 4 MB reduce_scatter, a 4 MB all_gather, then the reduce_scatter again,
# to see why call A read reduce_scatter at 87-88 % there against all_gather's 99-100 %.
# Only each run's summary.json is kept (the per-rank event files are 1.9 MB in all).
set -u
. scripts/iproute2_env.sh .debs >/dev/null 2>&1
mkdir -p /tmp/tl
for r in reduce_scatter:4M all_gather:4M reduce_scatter:4M; do
    op=${r%%:*}; s=${r#*:}; d=/tmp/tl/tl-$op-$s-$RANDOM
    timeout 150 python3 benchmarks/timeline.py --hosts 8 --rate 10gbit --op $op --size $s \
        --reps 12 --out $d > $d.log 2>&1
done
tar -czf $OUT/tl.tar.gz -C /tmp/tl .
