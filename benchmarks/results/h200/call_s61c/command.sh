#!/usr/bin/env bash
# Sixty-first session, call C (carry .debs; run from the repository root), the library with
# the caller's-stream copies of blocking CUDA ops back in (calls s61a/s61b tested them at
# 1 MB only): the same A/B from 4 MB to 256 MB, where a large op's copies go piece by piece
# (on the caller's stream now), on 4 and 8 emulated 10 Gbit hosts sharing the GPU, CUDA
# tensors, gloo in the same run; new (defaults) against old (MCCL_AB=caller_stream=0),
# in the order new, old, new2, old2. First the CUDA tests once more, at this commit.
set -u
R=/tmp/r61c; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader >$R/gpu.txt 2>&1
timeout 150 python3 -m pytest -q tests/test_device_cuda.py tests/test_device_staging.py \
    >$R/tests_cuda.log 2>&1; echo "rc=$?" >>$R/tests_cuda.log
DEVICE=cuda WORLDS="4 8" OPS=all_gather,reduce_scatter,all_reduce SIZES=4M,16M,64M,256M \
    TL_RUNS=none RES=$R/ab OUT=$R DEADLINE_S=300 \
    bash benchmarks/h200/ab.sh new: old:caller_stream=0 new2: old2:caller_stream=0
tar -czf $OUT/all.tar.gz -C $R .
cat $R/gpu.txt; tail -2 $R/tests_cuda.log; grep -hv "time(us)\|# algbw" $R/ab/summary.txt
exit 0
