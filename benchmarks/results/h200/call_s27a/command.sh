#!/usr/bin/env bash
# Twenty-seventh session, call A (carry .debs; run from the repository root):
# 1. One op's fixed cost by stage on 8 emulated 10 Gbit hosts (benchmarks/oppath.py --hosts),
#    1 MB all_reduce / reduce_scatter / all_gather, each op after a barrier, against 8 ranks
#    on loopback; then the all_reduce again with rank 0 profiled.
# 2. Reduce-scatter's pool of cached slots (pool, pool2: the default) against rs_pool=0
#    (nopool, nopool2) at 1-4 MB, 8 and 4 hosts: should the pool switch off where a
#    segment fits in cache?
set -u
. scripts/iproute2_env.sh .debs >/dev/null 2>&1
R=/tmp/mccl-s27a; mkdir -p "$R" "${OUT:-/tmp}"
for op in all_reduce reduce_scatter all_gather; do
  timeout --kill-after=5 80 python3 benchmarks/oppath.py --hosts 8 --rate 10gbit --op $op \
    --size 1M --reps 200 --json "$R/oppath-hosts8-$op.json" >"$R/oppath-hosts8-$op.log" 2>&1
  timeout --kill-after=5 80 python3 benchmarks/oppath.py --world 8 --op $op \
    --size 1M --reps 200 --json "$R/oppath-loop8-$op.json" >"$R/oppath-loop8-$op.log" 2>&1
done
timeout --kill-after=5 80 python3 benchmarks/oppath.py --hosts 8 --rate 10gbit --op all_reduce \
  --size 1M --reps 200 --profile >"$R/oppath-hosts8-all_reduce-profile.log" 2>&1
grep -h "n=8\|latest" "$R"/oppath-*.log >"$R/oppath_summary.txt"
RES="$R/ab" WORLDS="8 4" OPS=reduce_scatter SIZES=1M,2M,4M TL_VARIANTS=" " DEADLINE_S=330 \
  bash benchmarks/h200/ab.sh pool: nopool:rs_pool=0 pool2: nopool2:rs_pool=0
tar -czf "${OUT:-/tmp}/s27a.tar.gz" -C "$R" .
cp "$R/oppath_summary.txt" "${OUT:-/tmp}/"
