#!/usr/bin/env bash
# Fifty-first session, call B (carry .debs; run from the repository root; the same warm
# machine as call A): call A's GPU-sharing comparison again on 8 hosts, three rounds, every
# file kept (share/; table gpu_share.md, plot gpu_share.png; mps_log/ the MPS daemon's logs,
# which hold both calls: the 8 ranks of every "mps" bench connect as clients).
set -u
mkdir -p $OUT; WORLDS="8" ROUNDS=3 PLACEMENTS="one mps" SIZES=1M,4M,16M,64M DEADLINE_S=300 \
    RES=/tmp/share2 bash benchmarks/h200/gpu_share.sh
python3 benchmarks/h200/ab_report.py /tmp/share2 --png /tmp/share2/gpu_share.png \
    > /tmp/share2/gpu_share.md 2>&1
tar czf $OUT/share2.tar.gz -C /tmp share2   # unpacked here as share/
