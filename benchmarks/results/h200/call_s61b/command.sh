#!/usr/bin/env bash
# Sixty-first session, call B (carry .debs): at b9cc6aa plus call A's one-line test fix (the
# cross-stream case read its s2 result on the default stream without waiting for s2).
set -u
R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader >$R/gpu.txt 2>&1
ok=0
for i in 1 2 3 4 5; do
  timeout 60 python3 -m pytest -q tests/test_device_cuda.py -k callers_stream \
      >>$R/repeat.log 2>&1 && ok=$((ok + 1))
done
echo "caller's-stream test alone: $ok of 5 runs passed" >>$R/repeat.log
if [ $ok = 5 ]; then
  timeout 150 python3 -m pytest -q tests/test_device_cuda.py tests/test_device_staging.py \
      >$R/tests_cuda.log 2>&1; echo "rc=$?" >>$R/tests_cuda.log
  DEVICE=cuda WORLDS="4 8" OPS=all_gather,reduce_scatter,all_reduce SIZES=1M \
      TL_RUNS=none RES=$R/ab OUT=$R DEADLINE_S=230 \
      bash benchmarks/h200/ab.sh new: old:caller_stream=0 new2: old2:caller_stream=0
fi
tar -czf $OUT/all.tar.gz -C $R .
cat $R/gpu.txt; grep -E "passed|failed|of 5" $R/repeat.log; [ -f $R/tests_cuda.log ] && tail -3 $R/tests_cuda.log
[ -f $R/ab/summary.txt ] && grep -hv "time(us)\|# algbw" $R/ab/summary.txt
exit 0
