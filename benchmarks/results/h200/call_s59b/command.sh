#!/usr/bin/env bash
# Ran at commit 5d71ca5 (git checkout 5d71ca5 to repeat it: MCCL_AB=flat_seg_min exists
# only there; the commit after it reverted the change).
# Fifty-ninth session, call B (carry .debs; run from the repository root).
# 1. The CUDA tests, with the rule call A chose: a staged flat all-gather copies its output
#    back segment by segment from 128 KB segments even where the ring does not cut them
#    (collectives.FLAT_SEGMENT_MIN_BYTES); the reduce-scatter's input is copied whole again
#    below 4 MB (call A: by segment it read 5-10 points lower at 1 MB on 4 hosts).
# 2. A/B on 4 and 8 emulated 10 Gbit hosts sharing the GPU, CUDA tensors, 1, 4 and 8 MB (the
#    sizes where segments are not cut), gloo in the same run: new (the defaults) against
#    old (MCCL_AB=flat_seg_min=4194304, the library before this session), alternated
#    twice, and spin (MCCL_AB=ready_spin=1: the producer's marker spun on, not slept on).
set -u
R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader >$R/gpu.txt 2>&1
python3 -c 'import torch; print(torch.__version__)' >>$R/gpu.txt 2>&1
timeout 150 python3 -m pytest -q -p no:cacheprovider -rs tests/test_device_cuda.py \
    tests/test_device_staging.py >$R/tests_cuda.log 2>&1; echo "rc=$?" >>$R/tests_cuda.log
DEVICE=cuda WORLDS="4 8" OPS=all_gather,reduce_scatter,all_reduce SIZES=1M,4M,8M \
    TL_RUNS=none RES=$R/ab OUT=$R DEADLINE_S=400 \
    bash benchmarks/h200/ab.sh new: old:flat_seg_min=4194304 spin:ready_spin=1 \
        new2: old2:flat_seg_min=4194304
tar -czf $OUT/all.tar.gz -C $R .
cat $R/gpu.txt; tail -4 $R/tests_cuda.log
grep -v "time(us)\|# algbw" $R/ab/summary.txt
