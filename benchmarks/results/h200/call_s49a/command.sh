#!/usr/bin/env bash
# Forty-ninth session, call A (carry .debs; run from the repository root; ran on an H100
# machine of the H200 kind, 16 cores, torch 2.11, hosts on the machine's BBR): the A/B the
# forty-eighth session could not run. "early" is the library as it stands (data sockets put on
# CUBIC before connect / listen); "late" (cc_late=1) swaps once connected, as before 35555fc.
# Two runs of each, alternated, gloo beside them, 10 Gbit, 4 and 8 hosts, 16-256 MB.
# Tables: ab.md (benchmarks/h200/ab_report.py DIR --png DIR/ab.png > DIR/ab.md).
set -u
mkdir -p $OUT; SIZES=16M,64M,256M TL_RUNS=none DEADLINE_S=280 RES=/tmp/ab3 OUT=$OUT \
    bash benchmarks/h200/ab.sh "early:" "late:cc_late=1" "early2:" "late2:cc_late=1"
grep -E "^\[|mccl  n=|gloo  n=" $OUT/summary.txt | sed 's/  busbw.*(/ (/; s/ of ceiling.*//'
