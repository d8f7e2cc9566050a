#!/usr/bin/env bash
# Ran at 5d71ca5 with one difference: ReduceScatter also copied its input out by segment
# (its min_bytes was FLAT_SEGMENT_MIN_BYTES, and _flat_ranges ranged it by segment); see the
# H200 results README. MCCL_AB=flat_seg_min exists only at 5d71ca5.
# Fifty-ninth session, call A (carry .debs; run from the repository root).
# 1. The CUDA tests, with staged flat all-gathers and reduce-scatters now copying their large
#    tensor segment by segment from 128 KB segments even where the ring does not cut them
#    (collectives.FLAT_SEGMENT_MIN_BYTES): the all-gather's copy back of each segment as it
#    arrives, the reduce-scatter's copy out of each before it is first read.
# 2. A/B on 4 and 8 emulated 10 Gbit hosts sharing the GPU, CUDA tensors, 1 and 4 MB, gloo
#    in the same run: new (the defaults) against old (MCCL_AB=flat_seg_min=4194304: ranges
#    only where segments are cut, the library before this session), alternated twice, and
#    one (MCCL_AB=cuda_ranks=1: only rank 0 benches CUDA tensors, as if each host had a GPU
#    of its own; every rank it moves leaves a line in cuda_ranks_marks.txt).
set -u
R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader >$R/gpu.txt 2>&1
python3 -c 'import torch; print(torch.__version__)' >>$R/gpu.txt 2>&1
timeout 150 python3 -m pytest -q -p no:cacheprovider -rs tests/test_device_cuda.py \
    tests/test_device_staging.py >$R/tests_cuda.log 2>&1; echo "rc=$?" >>$R/tests_cuda.log
DEVICE=cuda WORLDS="4 8" OPS=all_gather,reduce_scatter,all_reduce SIZES=1M,4M \
    TL_RUNS=none RES=$R/ab OUT=$R DEADLINE_S=360 MCCL_AB_MARKS=$R/cuda_ranks_marks.txt \
    bash benchmarks/h200/ab.sh new: old:flat_seg_min=4194304 one:cuda_ranks=1 \
        new2: old2:flat_seg_min=4194304
cut -d' ' -f1-5 $R/cuda_ranks_marks.txt 2>/dev/null | sort | uniq -c >$R/cuda_ranks_count.txt
tar -czf $OUT/all.tar.gz -C $R .
cat $R/gpu.txt; tail -4 $R/tests_cuda.log; cat $R/cuda_ranks_count.txt
grep -v "time(us)\|# algbw" $R/ab/summary.txt
