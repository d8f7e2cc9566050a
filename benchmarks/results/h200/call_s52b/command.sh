#!/usr/bin/env bash
# Fifty-second session, call B (carry .debs; run from the repository root): the 10 Gbit stage
# again and the ViT DDP step (CUDA tensors, 4 hosts), the library of 39cc830, so the README's
# table has two runs of the library as it stands.
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=400 \
    bash benchmarks/h200/run_all.sh env cluster vit
