#!/usr/bin/env bash
# Fifty-first session, call A (carry .debs; run from the repository root; an H100 machine of
# the H200 kind, 16 cores, torch 2.11): CUDA all-reduce with 8 and 4 ranks sharing the one
# GPU, each rank its own time-sliced CUDA context ("one") against all through an MPS control
# daemon ("mps"), alternated, two rounds, gloo in every bench (benchmarks/h200/gpu_share.sh;
# only its printed summary came back: share_summary.txt). Then the CPU 1 and 4 MB ops on 8
# hosts with the library as it stands, twice, gloo beside (ab/).
set -u
mkdir -p $OUT; (command -v nvidia-cuda-mps-control; nvidia-smi --query-gpu=name,compute_mode \
    --format=csv) > $OUT/env.txt 2>&1
WORLDS="8 4" ROUNDS=2 PLACEMENTS="one mps" SIZES=1M,4M,16M,64M DEADLINE_S=380 RES=$OUT/share \
    bash benchmarks/h200/gpu_share.sh
python3 benchmarks/h200/ab_report.py $OUT/share --png $OUT/share/gpu_share.png \
    > $OUT/share/gpu_share.md 2>&1
mkdir -p $OUT/ab; WORLDS=8 OPS=reduce_scatter,all_reduce,all_gather SIZES=1M,4M TL_RUNS=none \
    DEADLINE_S=120 RES=/tmp/abh OUT=$OUT/ab bash benchmarks/h200/ab.sh "base:" "base2:"
cp /tmp/abh/*.json /tmp/abh/*.log /tmp/abh/summary.txt $OUT/ab/
