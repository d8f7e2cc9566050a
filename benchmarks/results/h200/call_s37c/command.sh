#!/usr/bin/env bash
# Thirty-seventh session, call C (run from the repository root): the final library of the
# session (set-up failures: error frames on the connections before they close,
# StoreFailedError; subgroup roots with their global rank) on torch 2.11: CUDA and CPU
# hand-off tests, the suite. No cluster stage: the data path is the one call A measured.
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=500 bash benchmarks/h200/run_all.sh env tests suite
