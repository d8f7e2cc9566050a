#!/usr/bin/env bash
# Twenty-eighth session, call C (carry .debs; run from the repository root).
# 1) The whole suite on torch 2.11 with this session's changes (open-file limit, dial order,
#    listen backlog, a backend per device, the bench's CPU columns).
# 2) Call B's CUDA all-reduce on 8 hosts read slow for both backends at every size; the same
#    bench twice more, to tell a disturbed machine from a change (the data path is unchanged).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
OUT=$OUT DEADLINE_S=200 bash benchmarks/h200/run_all.sh suite
mv "$OUT/summary.txt" "$OUT/suite_summary.txt"; mv "$OUT/h200_results.tar.gz" "$OUT/suite_results.tar.gz"
# shellcheck source=/dev/null
. scripts/iproute2_env.sh .debs >/dev/null 2>&1
for i in 1 2; do
  timeout 150 python3 -m mccl.bench --cluster --hosts 8 --world-sizes 8 --rate 10gbit --min 1M \
    --max 256M --factor 4 --warmup 2 --time-budget 1 --iters 10 --device cuda --ops all_reduce \
    --json "$OUT/cuda_n8_run$i.json" > "$OUT/cuda_n8_run$i.log" 2>&1
done
