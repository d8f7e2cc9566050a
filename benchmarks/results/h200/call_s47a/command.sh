#!/usr/bin/env bash
# Forty-seventh session, call A (carry .debs; run from the repository root): the first H200 run
# since the forty-fifth session moved mccl's data sockets off BBR onto CUBIC (the hosts stay on
# the machine's BBR): CUDA and CPU hand-off tests, the 10 Gbit cluster stage (issue #7's
# targets: CPU tensors all_reduce/all_gather/reduce_scatter and CUDA tensors all_reduce, 4 and
# 8 hosts, mccl vs gloo in the same run), then the ViT DDP step on 4 hosts, mccl and gloo
# alternating over two rounds.
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=560 VIT_VARIANTS="mccl: gloo: mccl2: gloo2:" \
  bash benchmarks/h200/run_all.sh env tests cluster vit
