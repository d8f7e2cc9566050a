#!/usr/bin/env bash
# Fifty-seventh session, call A (carry .debs; run from the repository root): the CUDA tests
# (the half-type staged reduce-scatter's first GPU run), then where a 1 MB CUDA op's time
# goes on 4 emulated 10 Gbit hosts: benchmarks/oppath.py per op, with a barrier per op and
# back to back (--stream, as the bench times them), and per-chunk timelines (--device cuda).
set -u
R=/tmp/r; mkdir -p $R
timeout 200 python3 -m pytest -q tests/test_device_cuda.py tests/test_device_staging.py \
    >$R/tests_cuda.log 2>&1; echo "rc=$?" >>$R/tests_cuda.log
. scripts/iproute2_env.sh .debs >$R/iproute2.log 2>&1
for dev in cuda cpu; do
  for op in all_gather all_reduce reduce_scatter; do
    for m in "" "--stream"; do
      [ $dev = cpu ] && [ -z "$m" ] && continue
      timeout 100 python3 benchmarks/oppath.py --hosts 4 --rate 10gbit --device $dev \
          --op $op --size 1M --reps 100 $m >>$R/oppath.txt 2>&1
    done
  done
done
DEVICE=cuda WORLDS=4 OPS=all_gather,all_reduce,reduce_scatter SIZES=1M,4M \
    TL_RUNS="all_gather:1M all_reduce:1M" RES=/tmp/ab OUT=$R DEADLINE_S=220 \
    bash benchmarks/h200/ab.sh base:
tar -czf $OUT/all.tar.gz -C $R .
cat $R/tests_cuda.log | tail -5; cat $R/oppath.txt; cat $R/summary.txt
