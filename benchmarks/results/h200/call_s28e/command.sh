#!/usr/bin/env bash
# Twenty-eighth session, call E (carry .debs; run from the repository root): rank 0's
# timeline of the last ViT DDP step (bucket ops submitted / started / ended on mccl; forward
# and backward marks on both), to see where mccl's 8 % faster bare all-reduce goes in the step
# (call D: 0.995x gloo's images/s).
OUT=$OUT DEADLINE_S=300 VIT_VARIANTS="mccl: gloo:" VIT_TRACE=1 \
  bash benchmarks/h200/run_all.sh vit
