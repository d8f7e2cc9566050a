#!/usr/bin/env bash
# Fifty-sixth session, call A (carry .debs; run from the repository root): the first GPU run
# of the staged all-gather / reduce-scatter that copy piece by piece (fifty-fifth session,
# a7a5fbd..f3133fe): its CUDA test, the cluster stage's CUDA rows (all_reduce, all_gather,
# reduce_scatter, 1M..256M, 4 and 8 hosts, gloo in the same run), then an A/B of the new
# path against whole copies (MCCL_AB=flat_ranges=0) at 16M..256M on 8 hosts.
set -u
mkdir -p $OUT/r $OUT/ab
timeout 90 python3 -m pytest -q -p no:cacheprovider -rs tests/test_device_cuda.py -k ranged \
    >$OUT/r/test_ranged.log 2>&1; echo "ranged test rc=$?" >>$OUT/r/test_ranged.log
RES=/tmp/r OUT=$OUT/r DEADLINE_S=290 CLUSTER_DEVICES=cuda \
    bash benchmarks/h200/run_all.sh env cluster
OPS=all_gather,reduce_scatter DEVICE=cuda SIZES=16M,64M,256M WORLDS=8 TL_RUNS=none \
    DEADLINE_S=185 RES=/tmp/ab OUT=$OUT/ab bash benchmarks/h200/ab.sh "new:" "old:flat_ranges=0"
