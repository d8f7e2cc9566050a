#!/usr/bin/env bash
# Thirty-first session, 2-core development machine (root, iproute2): 4 emulated hosts on
# 1 Gbit tbf links (BBR, the machine's default), blocking ops, then queued ops (four async
# ops per timed call, waited together, as DDP's buckets), mccl and gloo in each run.
# Run from this folder.
set -eu
for mode in blocking queue4; do
    args=""; [ "$mode" = queue4 ] && args="--queue 4"
    ../../../../.venv/bin/python -m mccl.bench --cluster --hosts 4 --rate 1gbit --world-sizes 4 \
        --ops all_reduce,all_gather,reduce_scatter --sizes 1M,4M,16M $args \
        --json "$mode.json" --png "$mode.png" -q > "$mode.log" 2>&1
done
