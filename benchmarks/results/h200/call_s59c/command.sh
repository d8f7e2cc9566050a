#!/usr/bin/env bash
# Ran at commit 5d71ca5 (git checkout 5d71ca5 to repeat it: MCCL_AB=flat_seg_min exists
# only there; the commit after it reverted the change).
# Fifty-ninth session, call C (carry .debs; run from the repository root).
# 1. The CUDA tests (call B's run of them failed: the ranged all-gather / reduce-scatter
#    test had lost its hook that lowers PIPELINE_MIN_BYTES, which the tensors not copied by
#    segment still use; restored).
# 2. Call A and call B disagreed on the all-gather's copy back by segment (A: ahead by 3-7
#    points at 1 MB on 4 hosts and 3-4 at 4 MB on 8; B, a noisy machine: behind at 1 MB, and
#    its 8-host cells swung by up to 50 points). Three alternated pairs, all-gather (the one
#    op the change touches) and all-reduce (a yardstick of the machine), 1 and 4 MB, 4 and 8
#    hosts sharing the GPU: new (the defaults) against old (MCCL_AB=flat_seg_min=4194304).
set -u
R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader >$R/gpu.txt 2>&1
python3 -c 'import torch; print(torch.__version__)' >>$R/gpu.txt 2>&1
timeout 120 python3 -m pytest -q -p no:cacheprovider -rs tests/test_device_cuda.py \
    >$R/tests_cuda.log 2>&1; echo "rc=$?" >>$R/tests_cuda.log
DEVICE=cuda WORLDS="4 8" OPS=all_gather,all_reduce SIZES=1M,4M \
    TL_RUNS=none RES=$R/ab OUT=$R DEADLINE_S=330 \
    bash benchmarks/h200/ab.sh new: old:flat_seg_min=4194304 new2: old2:flat_seg_min=4194304 \
        new3: old3:flat_seg_min=4194304
tar -czf $OUT/all.tar.gz -C $R .
cat $R/gpu.txt; tail -4 $R/tests_cuda.log
grep -v "time(us)\|# algbw" $R/ab/summary.txt
