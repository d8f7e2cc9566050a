#!/usr/bin/env bash
# Forty-ninth session, call C (carry .debs; right after call B on the same warm machine): the
# 10 Gbit cluster stage again (run B of the README's table).
set -u
mkdir -p $OUT/r; RES=/tmp/r2 OUT=$OUT/r DEADLINE_S=300 bash benchmarks/h200/run_all.sh env cluster
