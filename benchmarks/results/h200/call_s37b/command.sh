#!/usr/bin/env bash
# Thirty-seventh session, call B (carry .debs; run from the repository root, after call A on
# the same machine unpacked iproute2 into /tmp/iproute2): where a 1 MB reduce-scatter on 4
# emulated 10 Gbit hosts spends its time beside an all-gather and an all-reduce of 1 MB
# (blocking ops back to back, then one rank's per-chunk timeline), three runs: base, the
# reduce-scatter's small-buffer pool off, base again.
export PATH=/tmp/iproute2:$PATH PYTHONPATH=$PWD
[ -x /tmp/iproute2/ip ] || bash scripts/iproute2_env.sh >/dev/null 2>&1
timeout 300 python3 benchmarks/h200/exp_rs_timeline.py $OUT/exp_rs.json base nopool base
