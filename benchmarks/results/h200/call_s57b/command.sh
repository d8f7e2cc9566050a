#!/usr/bin/env bash
# Fifty-seventh session, call B. On the device's copy only (the library keeps the old rule),
# it applies proposed.patch: a staged all-gather's output / reduce-scatter's
# input copied by segment from 512 KiB (staging.WRITE_/READ_PIPELINE_MIN_BYTES). Then (carry
# .debs; run from the repository root) the CUDA tests; a 1 MB CUDA all-gather's fixed cost by
# stage (benchmarks/oppath.py --stream), new rule and old; the A/B on 4 and 8 emulated
# 10 Gbit hosts: new, old (whole copies below 4 MiB and where no segment is cut), new again
# (noise), gloo in the same run.
set -u
R=/tmp/r; mkdir -p $R
git apply benchmarks/results/h200/call_s57b/proposed.patch || patch -p1 \
    <benchmarks/results/h200/call_s57b/proposed.patch || exit 1
timeout 150 python3 -m pytest -q tests/test_device_cuda.py tests/test_device_staging.py \
    >$R/tests_cuda.log 2>&1; echo "rc=$?" >>$R/tests_cuda.log
. scripts/iproute2_env.sh .debs >$R/iproute2.log 2>&1
OLD="write_min=4194304,read_min=4194304,flat_cut=1"
for v in "new:" "old:$OLD"; do
  for op in all_gather; do
    echo "== ${v%%:*} $op" >>$R/oppath.txt
    MCCL_AB="${v#*:}" PYTHONPATH=benchmarks/h200/ab timeout 60 python3 benchmarks/oppath.py \
        --hosts 4 --rate 10gbit --device cuda --op $op --size 1M --reps 150 --stream 2>&1 \
        | grep -v socket.cpp >>$R/oppath.txt
  done
done
DEVICE=cuda WORLDS="4 8" OPS=all_gather,reduce_scatter SIZES=1M,4M,16M TL_RUNS=none \
    RES=/tmp/ab OUT=$R DEADLINE_S=290 \
    bash benchmarks/h200/ab.sh "new:" "old:$OLD" "new2:"
cp /tmp/ab/summary.txt $R/summary.txt
tar -czf $OUT/all.tar.gz -C $R .
tail -3 $R/tests_cuda.log; cat $R/oppath.txt; grep -E "^\[|busbw" $R/summary.txt
