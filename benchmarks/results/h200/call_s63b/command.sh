#!/usr/bin/env bash
# Sixty-third session, call B (carry .debs; run from the repository root): the library with
# the side stream forgetting after_caller once waited for (call A checked it on a copy), then
# a second run of the 10 Gbit cluster stage (CPU and CUDA tensors, 1-256 MB, 4 and 8 hosts,
# mccl and gloo in the same run), so that each cell of the README's table has two runs.
set -u
T0=$(date +%s); TOTAL_S=${TOTAL_S:-330}
R=/tmp/r63b; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader >$R/gpu.txt 2>&1
timeout 100 python3 -m pytest -q tests/test_device_cuda.py tests/test_device_staging.py \
    >$R/tests_cuda.log 2>&1; echo "rc=$?" >>$R/tests_cuda.log
LEFT=$(( TOTAL_S - ($(date +%s) - T0) - 15 ))
RES=$R/stage OUT=/tmp/r63b_bundle DEADLINE_S=$LEFT bash benchmarks/h200/run_all.sh cluster \
    >/dev/null 2>&1
tar -czf $OUT/all.tar.gz -C $R --exclude='*.tar.gz' .
cat $R/gpu.txt; tail -2 $R/tests_cuda.log
grep -E "RUN|DONE|SKIP" $R/stage/summary.txt | cut -c1-70
exit 0
