#!/usr/bin/env bash
# Forty-ninth session, call B (carry .debs; run from the repository root; same warm H100
# machine as call A): the 10 Gbit cluster stage with the library as it stands (CPU tensors
# all_reduce/all_gather/reduce_scatter and CUDA tensors all_reduce, 4 and 8 hosts, mccl and
# gloo in the same run), then the ViT DDP step on 4 hosts, mccl then gloo (one round).
set -u
mkdir -p $OUT/r; RES=/tmp/r OUT=$OUT/r DEADLINE_S=450 bash benchmarks/h200/run_all.sh env cluster vit
