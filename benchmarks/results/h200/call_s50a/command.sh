#!/usr/bin/env bash
# Fiftieth session, call A (carry .debs; run from the repository root; an H100 machine of the
# H200 kind): an experiment not kept, so its code is not in the repository. The grid
# reduce-scatter (8 hosts: column phase, then the single-step row phase) with the row phase's
# first send issued from the column phase's last-step finish hook, overlapping the two phases,
# and the column phase's chunks sent in a rotated order (a `first` argument of
# ring.reduce_scatter) ("new", "new2"), against the same code with the overlap off
# (`rs_overlap=0`, an A/B key of that code: phases in sequence, rotation kept; "old", "old2")
# and the ring alone (`grid_min=1000`, "ring"); 1-4 MB reduce-scatter and all-reduce on 8
# emulated 10 Gbit hosts (BBR, steering), gloo beside them. Tables: ab.md, ab.png
# (python benchmarks/h200/ab_report.py DIR --png DIR/ab.png > DIR/ab.md).
set -u
mkdir -p $OUT; WORLDS=8 OPS=reduce_scatter,all_reduce SIZES=1M,2M,4M TL_RUNS=none \
    DEADLINE_S=300 RES=/tmp/abx OUT=$OUT \
    bash benchmarks/h200/ab.sh "new:" "old:rs_overlap=0" "new2:" "old2:rs_overlap=0" \
    "ring:grid_min=1000"
