#!/usr/bin/env bash
# Ran at commit b9cc6aa (git checkout b9cc6aa; the commit after it reverted the
# caller's-stream copies of blocking CUDA ops). Sixty-first session, call A (carry .debs; run
# from the repository root): call s60b's plan, with repeats and the A/B again.
# 1. The CUDA tests (call s60a's failed cross-stream case now makes its tensor on s1 alone).
# 2. The caller's-stream test alone, four more times (a race shows up in some runs only).
# 3. Only if 1 and 2 all passed: the bench on 4 and 8 emulated 10 Gbit hosts, CUDA tensors,
#    1 MB, gloo in the same run: new (defaults) against old (MCCL_AB=caller_stream=0),
#    alternated twice.
set -u
R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader >$R/gpu.txt 2>&1
timeout 150 python3 -m pytest -q tests/test_device_cuda.py tests/test_device_staging.py \
    >$R/tests_cuda.log 2>&1; echo "rc=$?" >>$R/tests_cuda.log
ok=0
for i in 1 2 3 4; do
  timeout 60 python3 -m pytest -q tests/test_device_cuda.py -k callers_stream \
      >>$R/repeat.log 2>&1 && ok=$((ok + 1))
done
echo "caller's-stream test alone: $ok of 4 runs passed" >>$R/repeat.log
if grep -q "^rc=0" $R/tests_cuda.log && [ $ok = 4 ]; then
  DEVICE=cuda WORLDS="4 8" OPS=all_gather,reduce_scatter,all_reduce SIZES=1M \
      TL_RUNS=none RES=$R/ab OUT=$R DEADLINE_S=230 \
      bash benchmarks/h200/ab.sh new: old:caller_stream=0 new2: old2:caller_stream=0
fi
tar -czf $OUT/all.tar.gz -C $R .
cat $R/gpu.txt; tail -3 $R/tests_cuda.log; grep -E "passed|failed|of 4" $R/repeat.log
[ -f $R/ab/summary.txt ] && grep -hv "time(us)\|# algbw" $R/ab/summary.txt
exit 0
