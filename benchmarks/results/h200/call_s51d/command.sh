#!/usr/bin/env bash
# Fifty-first session, call D (carry .debs; run from the repository root; a fresh H100 machine,
# kind nvidia-h100-x1): the cluster stage's CUDA all-reduces through an MPS daemon (the new
# clustermps stage; this run predates its copy of the daemon's logs), then the CUDA and CPU
# hand-off tests and the whole suite on torch 2.11.
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=400 \
    bash benchmarks/h200/run_all.sh env clustermps tests suite
