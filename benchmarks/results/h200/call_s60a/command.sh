#!/usr/bin/env bash
# Ran at commit b9cc6aa (git checkout b9cc6aa to repeat it: MCCL_AB=caller_stream and the
# ``direct`` variant of handoff_cost.py exist only there; the commit after it reverted them).
# Sixtieth session, call A (carry .debs; run from the repository root): a blocking CUDA op
# run on the caller's thread now copies on the caller's stream (mccl/device/cuda.py).
# 1. The CUDA tests (the new test_blocking_ops_copy_on_the_callers_stream_in_issue_order
#    among them).
# 2. The device half alone, no network (benchmarks/handoff_cost.py): the new ``direct``
#    hand-off beside the side-stream one (``staged``), the bare calls and the copies alone,
#    1, 4 and 8 ranks sharing the GPU, 1 MB.
# 3. The bench on 4 and 8 emulated 10 Gbit hosts, CUDA tensors, gloo in the same run: new
#    (the defaults) against old (MCCL_AB=caller_stream=0: the side stream, as before),
#    alternated twice, 1 MB.
set -u
R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader >$R/gpu.txt 2>&1
timeout 150 python3 -m pytest -q tests/test_device_cuda.py tests/test_device_staging.py \
    >$R/tests_cuda.log 2>&1; echo "rc=$?" >>$R/tests_cuda.log
cp $R/gpu.txt $R/handoff_cost.txt
for op in all_gather reduce_scatter all_reduce; do
  timeout 60 python3 benchmarks/handoff_cost.py --worlds 1,4,8 --op $op --size 1M \
      --reps 100 --json $R/handoff_cost_${op}_1M.json >>$R/handoff_cost.txt 2>&1
done
DEVICE=cuda WORLDS="4 8" OPS=all_gather,reduce_scatter,all_reduce SIZES=1M \
    TL_RUNS=none RES=$R/ab OUT=$R DEADLINE_S=210 \
    bash benchmarks/h200/ab.sh new: old:caller_stream=0 new2: old2:caller_stream=0
tar -czf $OUT/all.tar.gz -C $R .
tail -3 $R/tests_cuda.log; grep -v "^ *$" $R/handoff_cost.txt | grep -v " cpu "
grep -hv "time(us)\|# algbw" $R/ab/summary.txt
