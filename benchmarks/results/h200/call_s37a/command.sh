#!/usr/bin/env bash
# Thirty-seventh session, call A (carry .debs; run from the repository root): the library of
# this session (a rank that gives up on set-up leaves its reason before closing its
# connections; all_to_all, gather and scatter send and receive empty parts too; subgroup roots
# named as global ranks) on torch 2.11: CUDA and CPU hand-off tests, the 10 Gbit cluster stage
# (4 and 8 hosts, BBR, steering; CPU then CUDA tensors), the suite.
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=570 bash benchmarks/h200/run_all.sh env tests cluster suite
