#!/usr/bin/env bash
# Fifty-eighth session, call A (carry .debs; run from the repository root): why 1 MB CUDA
# all-gathers and reduce-scatters fall short of issue #7's target on emulated hosts that
# share one GPU.
# 1. What a staged CUDA op's copies cost on their own, no network, with 1, 4 and 8 ranks
#    sharing the GPU (benchmarks/handoff_cost.py: mccl's hand-off, the same CUDA calls bare
#    on a side stream, the copies alone on the caller's stream, the host copy only).
# 2. The bench on 4 and 8 emulated 10 Gbit hosts, CUDA tensors, gloo in the same run, with
#    every rank on the GPU (base) and with only rank 0 on it (one: MCCL_AB=cuda_ranks=1,
#    the others bench host tensors), alternated twice: how much of the gap is the ranks'
#    copies queueing on the one GPU, which hosts with a GPU each would not share.
set -u
R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader >$R/handoff_cost.txt 2>&1
for op in all_gather reduce_scatter all_reduce; do
  timeout 100 python3 benchmarks/handoff_cost.py --worlds 1,4,8 --op $op --size 1M \
      --reps 120 --json $R/handoff_cost_${op}_1M.json >>$R/handoff_cost.txt 2>&1
done
DEVICE=cuda WORLDS="4 8" OPS=all_gather,reduce_scatter,all_reduce SIZES=1M \
    TL_RUNS=none RES=$R/ab OUT=$R DEADLINE_S=250 \
    bash benchmarks/h200/ab.sh base: one:cuda_ranks=1 base2: one2:cuda_ranks=1
tar -czf $OUT/all.tar.gz -C $R .
cat $R/handoff_cost.txt; cat $R/ab/summary.txt
