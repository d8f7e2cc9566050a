#!/usr/bin/env bash
# Twenty-eighth session, call A (carry .debs; run from the repository root).
# 1) The whole suite on torch 2.11, which the twenty-seventh session could not run after its
#    MCCL_SOCKET_IFNAME IPv6 commits (63f501b, 1bf7e08, 56ff11d).
# 2) Its call F again, on a machine that was disturbed then: a chunk floor of 64 KiB
#    (min_chunk=65536) against the library's 128 KiB, three pairs, 8 and 4 emulated 10 Gbit
#    hosts, so a 1-2 MB op's 128-256 KiB segments pipeline within a ring step.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
OUT=$OUT DEADLINE_S=200 bash benchmarks/h200/run_all.sh suite
mv "$OUT/summary.txt" "$OUT/suite_summary.txt"; mv "$OUT/h200_results.tar.gz" "$OUT/suite_results.tar.gz"
WORLDS="8 4" OPS=all_reduce,reduce_scatter,all_gather SIZES=1M,2M,4M TL_VARIANTS=" " \
  DEADLINE_S=360 bash benchmarks/h200/ab.sh base: mc64:min_chunk=65536 base2: mc64b:min_chunk=65536 \
  base3: mc64c:min_chunk=65536
