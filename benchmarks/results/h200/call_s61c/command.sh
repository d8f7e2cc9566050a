#!/usr/bin/env bash
# Sixty-first session, call C (carry .debs; run from the repository root), the library with
# the caller's-stream copies of blocking CUDA ops back in (calls s61a/s61b tested them at
# 1 MB only): the same A/B from 4 MB to 256 MB, where a large op's copies go piece by piece
# (on the caller's stream now), on 4 and 8 emulated 10 Gbit hosts sharing the GPU, CUDA
# tensors, gloo in the same run; new (defaults) against old (MCCL_AB=caller_stream=0),
# in the order new, old, new2. First the CUDA tests, at this
# commit (call s61b's code, plus record_stream of an inline op's tensors on the caller's stream).
set -u
R=/tmp/r61c; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader >$R/gpu.txt 2>&1
timeout 150 python3 -m pytest -q tests/test_device_cuda.py tests/test_device_staging.py \
    >$R/tests_cuda.log 2>&1; echo "rc=$?" >>$R/tests_cuda.log
# can the new freed-memory case fail? the same test on a copy without that record_stream
rm -rf /tmp/norec; cp -r . /tmp/norec
sed -i 's/t.record_stream(current)/pass/' /tmp/norec/mccl/device/cuda.py
grep -c "record_stream(current)" /tmp/norec/mccl/device/cuda.py >$R/norec.log
(cd /tmp/norec && timeout 60 python3 -m pytest -q tests/test_device_cuda.py -k callers_stream) \
    >>$R/norec.log 2>&1; echo "rc=$?" >>$R/norec.log
DEVICE=cuda WORLDS="4 8" OPS=all_gather,reduce_scatter,all_reduce SIZES=4M,16M,64M,256M \
    TL_RUNS=none RES=$R/ab OUT=$R DEADLINE_S=240 \
    bash benchmarks/h200/ab.sh new: old:caller_stream=0 new2:
tar -czf $OUT/all.tar.gz -C $R .
cat $R/gpu.txt; tail -2 $R/tests_cuda.log; grep -E 'rc=|passed|failed|handed' $R/norec.log; grep -hv "time(us)\|# algbw" $R/ab/summary.txt
exit 0
