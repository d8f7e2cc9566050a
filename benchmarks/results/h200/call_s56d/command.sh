#!/usr/bin/env bash
# Fifty-sixth session, call D (carry .debs; run from the repository root): the cluster
# stage's CUDA rows again with the library as it stands (both of a staged flat all-gather's /
# reduce-scatter's tensors copied piece by piece), a second sample beside call B's A/B.
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=200 CLUSTER_DEVICES=cuda \
    bash benchmarks/h200/run_all.sh env cluster
