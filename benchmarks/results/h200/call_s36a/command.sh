#!/usr/bin/env bash
# Thirty-sixth session, call A (carry .debs; run from the repository root): the library of
# this session (thread ranks share the count of default groups; set-up errors are also
# DistNetworkErrors; no data-path change) on torch 2.11: CUDA and CPU hand-off tests, the
# 10 Gbit cluster stage (4 and 8 hosts, BBR, steering; CPU then CUDA tensors), the suite.
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=570 bash benchmarks/h200/run_all.sh env tests cluster suite
