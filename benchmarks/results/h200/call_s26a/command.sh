#!/usr/bin/env bash
# Twenty-sixth session, call A: reduce-scatter's partial sums in a small pool of cached slots
# (new, new2: the library's default) against the segment-sized spares alone (old, old2:
# rs_pool=0), 8 emulated 10 Gbit hosts (the machine's BBR, receive steering), with all-reduce
# beside it; then per-chunk timelines of a 64 MB reduce-scatter on 4 hosts for both.
WORLDS="8" OPS=reduce_scatter,all_reduce SIZES=16M,64M,256M BENCH_ARGS="--check" \
  TL_VARIANTS="new: old:rs_pool=0" TL_RUNS="reduce_scatter:64M" DEADLINE_S=540 \
  bash benchmarks/h200/ab.sh new: old:rs_pool=0 new2: old2:rs_pool=0
