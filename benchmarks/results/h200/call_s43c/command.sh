#!/usr/bin/env bash
# Forty-third session, call C (carry .debs; run from the repository root), code of 65d4815
# (cluster prefixes per xdist worker; before the probe fix of 602b4cb): the suite twice.
set -u
mkdir -p $OUT/r1 $OUT/r2 && RES=/tmp/r1 OUT=$OUT/r1 DEADLINE_S=280 bash benchmarks/h200/run_all.sh env suite > $OUT/run1.log 2>&1; RES=/tmp/r2 OUT=$OUT/r2 DEADLINE_S=280 bash benchmarks/h200/run_all.sh suite > $OUT/run2.log 2>&1
