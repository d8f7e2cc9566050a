#!/usr/bin/env bash
# Fifty-third session, call A (carry .debs; run from the repository root): the 10 Gbit stage
# (CPU all-reduce/all-gather/reduce-scatter and the CUDA all-reduce, 4 and 8 hosts, mccl vs
# gloo) and the ViT DDP step with the library of da82092 (a second run beside call_s52a's),
# the hand-off tests, then the phases of a 1 MB CUDA all-reduce on 4 and 8 hosts
# (benchmarks/cuda_phases.py: where the CUDA op loses time against the same op on CPU tensors).
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=470 \
    bash benchmarks/h200/run_all.sh env cluster vit tests
. scripts/iproute2_env.sh .debs > /dev/null
for n in 4 8; do
    timeout 45 python3 benchmarks/cuda_phases.py --hosts $n --rate 10gbit --size 1M --reps 40 \
        --json $OUT/r/phases_1M_n$n.json > $OUT/r/phases_1M_n$n.log 2>&1
done
