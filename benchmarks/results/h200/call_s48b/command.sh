#!/usr/bin/env bash
# Forty-eighth session, call B (carry .debs; right after call A on the same warm machine):
# the same A/B with every host on CUBIC (TCP_CC=cubic), as most Linux hosts and macOS run:
# mccl's default twice, its data sockets on BBR (cc=2), gloo beside them.
set -u
mkdir -p $OUT; TCP_CC=cubic SIZES=16M,64M,256M TL_RUNS=none DEADLINE_S=300 RES=/tmp/ab2 OUT=$OUT \
    bash benchmarks/h200/ab.sh "cubic:" "cubic2:" "bbr:cc=2"
grep -E "^\[|mccl  n=|gloo  n=" $OUT/summary.txt | sed 's/  busbw.*(/ (/; s/ of ceiling.*//'
