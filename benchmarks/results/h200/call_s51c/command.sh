#!/usr/bin/env bash
# Fifty-first session, call C (carry .debs; run from the repository root; a fresh H100
# machine, kind nvidia-h100-x1): the ViT DDP step (run_all.sh's vit stage: 114.9 M
# parameters, CUDA tensors, batch 32 per rank, 4 emulated 10 Gbit hosts sharing the GPU),
# mccl then gloo, with each rank in its own time-sliced CUDA context (plain1, plain2) and
# through an MPS control daemon (mps1, mps2; benchmarks/h200/mps.sh), alternated.
set -u
mkdir -p $OUT /tmp/vit; M=benchmarks/h200/mps.sh
for r in 1 2; do
    RES=/tmp/vit/plain$r OUT=/tmp/vit/out DEADLINE_S=130 VIT_VARIANTS="mccl: gloo:" \
        bash benchmarks/h200/run_all.sh vit >/dev/null 2>&1
    bash $M start && env $(bash $M env) RES=/tmp/vit/mps$r OUT=/tmp/vit/out DEADLINE_S=130 \
        VIT_VARIANTS="mccl: gloo:" bash benchmarks/h200/run_all.sh vit >/dev/null 2>&1
    bash $M stop
done
cp -r /tmp/mccl-mps/log /tmp/vit/mps_log; rm -rf /tmp/vit/out; tar czf $OUT/vit.tar.gz -C /tmp vit
