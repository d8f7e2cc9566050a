#!/usr/bin/env bash
# Forty-eighth session, call A (carry .debs; run from the repository root; ran on an H100
# machine of the same kind, 16 cores, torch 2.11): mccl's data sockets on CUBIC (the default,
# swapped from the hosts' BBR once each connection was made, as the library then did) against
# BBR (cc=2), twice each, gloo beside them, 10 Gbit, 4 and 8 hosts on the machine's BBR;
# timelines of the 256 MB all-reduce on 4 hosts for both. Tables: ab.md (made by
# benchmarks/h200/ab_report.py DIR --png DIR/ab.png); the timelines' rank files were left out.
set -u
mkdir -p $OUT; SIZES=16M,64M,256M TL_VARIANTS="cubic: bbr:cc=2" TL_RUNS="all_reduce:256M" \
    DEADLINE_S=570 RES=/tmp/ab OUT=$OUT bash benchmarks/h200/ab.sh "cubic:" "bbr:cc=2" "cubic2:" "bbr2:cc=2"
cat $OUT/summary.txt
