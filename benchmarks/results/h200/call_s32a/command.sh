#!/usr/bin/env bash
# Thirty-second session, call A (carry .debs; run from the repository root): the 10 Gbit
# cluster (BBR hosts, steered), 8 then 4 hosts, CPU tensors, all_reduce / all_gather /
# reduce_scatter at 1-16 MB, mccl and gloo: blocking ops (one op per timed call), then
# queued ops (--queue 4: four async ops issued back to back and waited together, as DDP
# issues its buckets), each mode with its own gloo run. Library as of 42bfc5e.
set -u
export OPS=all_reduce,all_gather,reduce_scatter SIZES=1M,4M,16M TL_VARIANTS=" " WORLDS="8 4"
for mode in blocking queue4; do
    a=""; [ $mode = queue4 ] && a="--queue 4"
    BENCH_ARGS="$a" RES=/tmp/ab-$mode OUT=$OUT/$mode DEADLINE_S=265 bash benchmarks/h200/ab.sh base:
done
