#!/usr/bin/env bash
# Fifty-third session, on the 2-core development machine (root): 8 emulated hosts at 3 Gbit,
# where the ranks run out of CPU (about 1.8 of the 2 cores busy), reduce-scatter against
# all-reduce, mccl only, with A/B variants of the reduce-scatter's partial-sum buffers
# (benchmarks/h200/ab/mccl_ab.py keys), in the order run: all3 (all three ops, 3 iterations),
# base, sp8, base2, sp82 (reduce-scatter and all-reduce), then pool8, base3, pool82, base4
# (reduce-scatter only). all3 was run by hand as
#   python -m mccl.bench --cluster --hosts 8 --world-sizes 8 --rate 3gbit
#       --ops all_reduce,all_gather,reduce_scatter --sizes 16M,64M --backends mccl --iters 3
#       --warmup 1 --time-budget 2
# and its files renamed ab_all3.*; the others are as below (/tmp/ab_NAME.* copied here).
set -u
cd "$(dirname "$0")/../../../.."
run() {  # NAME MCCL_AB OPS
    PYTHONPATH=benchmarks/h200/ab MCCL_AB="$2" timeout 300 .venv/bin/python -m mccl.bench \
        --cluster --hosts 8 --world-sizes 8 --rate 3gbit --ops "$3" --sizes 16M,64M \
        --backends mccl --iters 5 --warmup 1 --time-budget 3 \
        --json "/tmp/ab_$1.json" --png "/tmp/ab_$1.png" > "/tmp/ab_$1.log" 2>&1
}
run base "" reduce_scatter,all_reduce
run sp8 rs_spares=8 reduce_scatter,all_reduce
run base2 "" reduce_scatter,all_reduce
run sp82 rs_spares=8 reduce_scatter,all_reduce
for v in pool8 base3 pool82 base4; do
    case $v in pool8*) ab="rs_pool=64,rs_pool_bytes=8388608" ;; *) ab="" ;; esac
    run $v "$ab" reduce_scatter
done
