#!/usr/bin/env bash
# Twenty-fifth session, call E: reduce-scatter's partial sums through a 4 MiB pool of
# chunk slots (cache-hot, waits for a half's sends before refilling it) against 16 MiB and a
# slot for every partial sum (no reuse, cold, as the segment buffers before); CUBIC hosts with
# receive steering, 10 Gbit.
set -u
cd "$(dirname "$0")/../../../.."
TCP_CC=cubic OPS=reduce_scatter WORLDS="8 4" SIZES=16M,64M,256M DEADLINE_S=330 TL_RUNS=" " \
    bash benchmarks/h200/ab.sh base: old:rs_pool=1099511627776 p16:rs_pool=16777216 base2: \
    old2:rs_pool=1099511627776
grep -E "^\[|busbw" "$OUT/summary.txt" | grep -v "time(us)"
