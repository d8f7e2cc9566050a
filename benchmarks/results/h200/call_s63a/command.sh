#!/usr/bin/env bash
# Sixty-third session, call A (carry .debs; run from the repository root): the sixty-second
# session's call_s62a/command.sh (never run: no machine came), the library as it stands, plus
# step 2b: the CUDA tests on a copy whose side stream forgets after_caller once it has waited
# for it (998bf7e's change, taken out in cc22dcd because no GPU run could check it).
# 1. the CUDA tests (the caller's-stream test's two held-up cases now share a helper);
# 2. the 10 Gbit stage: CPU and CUDA tensors, all_reduce/all_gather/reduce_scatter,
#    1-256 MB, 4 and 8 emulated hosts, mccl and gloo in the same run, then the ViT DDP
#    step on 4 hosts, mccl then gloo (run_all.sh env cluster vit);
# 3. while time is left, the device half of a 1 MB op alone (benchmarks/handoff_cost.py, no
#    network), this tree against a copy whose caller-stream hand-off skips record_stream
#    (what that call costs), alternated; then the caller's-stream test twice more.
set -u
T0=$(date +%s); TOTAL_S=${TOTAL_S:-560}  # the whole call's time; later parts shrink to fit
R=/tmp/r63a; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader >$R/gpu.txt 2>&1
timeout 150 python3 -m pytest -q tests/test_device_cuda.py tests/test_device_staging.py \
    >$R/tests_cuda.log 2>&1; echo "rc=$?" >>$R/tests_cuda.log
LEFT=$(( TOTAL_S - ($(date +%s) - T0) - 160 ))  # 100 s of it kept for step 2b
RES=$R/stage OUT=/tmp/r63a_bundle DEADLINE_S=$LEFT bash benchmarks/h200/run_all.sh env cluster vit
rm -rf /tmp/clear63; cp -r . /tmp/clear63
sed -i 's/^\(        *\)side.wait_event(last)$/&\n\1self.after_caller = None/' \
    /tmp/clear63/mccl/device/cuda.py
diff mccl/device/cuda.py /tmp/clear63/mccl/device/cuda.py >$R/clear_diff.txt
(cd /tmp/clear63 && timeout 100 python3 -m pytest -q tests/test_device_cuda.py) \
    >$R/tests_cuda_clear.log 2>&1; echo "rc=$?" >>$R/tests_cuda_clear.log
rm -rf /tmp/norec63; cp -r . /tmp/norec63
sed -i 's/t.record_stream(current)/pass/' /tmp/norec63/mccl/device/cuda.py
grep -c "record_stream(current)" /tmp/norec63/mccl/device/cuda.py >$R/norec_check.txt
for pass in 1 2; do
  for tree in . /tmp/norec63; do
    name=$([ "$tree" = . ] && echo rec || echo norec)
    [ $(( $(date +%s) - T0 )) -gt $(( TOTAL_S - 45 )) ] && break 2
    (cd $tree && timeout 40 python3 benchmarks/handoff_cost.py --worlds 1,4 --op all_gather \
        --size 1M --reps 100 --json $R/hc_${name}_$pass.json) >>$R/handoff_cost_${name}.txt 2>&1
  done
done
for i in 1 2; do
  [ $(( $(date +%s) - T0 )) -gt $(( TOTAL_S - 40 )) ] && break
  timeout 30 python3 -m pytest -q tests/test_device_cuda.py -k callers_stream \
      >>$R/callers_stream_again.log 2>&1; echo "rc=$?" >>$R/callers_stream_again.log
done
tar -czf $OUT/all.tar.gz -C $R --exclude='*.tar.gz' .
cat $R/gpu.txt; tail -2 $R/tests_cuda.log; cat $R/clear_diff.txt; tail -2 $R/tests_cuda_clear.log; grep -E "rc=|passed|failed" $R/callers_stream_again.log
grep -E "RUN|DONE|SKIP" $R/stage/summary.txt | cut -c1-120
grep -h "direct\|staged" $R/handoff_cost_*.txt
exit 0
