#!/usr/bin/env bash
# Ran at commit 5d71ca5 (git checkout 5d71ca5 to repeat it: MCCL_AB=flat_seg_min exists
# only there; the commit after it reverted the change).
# Fifty-ninth session, call D (carry .debs; run from the repository root): more pairs of the
# all-gather's copy back by segment (new, the defaults) against whole below 4 MB (old,
# MCCL_AB=flat_seg_min=4194304), alternated four times, CUDA tensors on emulated 10 Gbit
# hosts sharing the GPU, gloo in the same run: 1 MB on 4 hosts, 4 MB on 8 (where each
# changes; calls B and C ran on machines whose same-variant runs differed by up to 25 points).
set -u
R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader >$R/gpu.txt 2>&1
V="new: old:flat_seg_min=4194304 new2: old2:flat_seg_min=4194304 new3: old3:flat_seg_min=4194304 new4: old4:flat_seg_min=4194304"
DEVICE=cuda WORLDS=4 OPS=all_gather SIZES=1M TL_RUNS=none RES=$R/ab4 OUT=$R DEADLINE_S=170 \
    bash benchmarks/h200/ab.sh $V
DEVICE=cuda WORLDS=8 OPS=all_gather SIZES=4M TL_RUNS=none RES=$R/ab8 OUT=$R DEADLINE_S=170 \
    bash benchmarks/h200/ab.sh $V
tar -czf $OUT/all.tar.gz -C $R .
cat $R/gpu.txt; grep -v "time(us)\|# algbw" $R/ab4/summary.txt $R/ab8/summary.txt
