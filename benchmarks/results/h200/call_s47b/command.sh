#!/usr/bin/env bash
# Forty-seventh session, call B (carry .debs; run from the repository root, right after call A on
# the same warm machine): a repeat of the 10 Gbit cluster stage, as single cells swing between
# runs of the same code.
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=420 bash benchmarks/h200/run_all.sh env cluster
