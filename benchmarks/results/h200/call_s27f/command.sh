#!/usr/bin/env bash
# Twenty-seventh session, call F (carry .debs; run from the repository root): a chunk floor
# of 64 KiB (mc64, mc64b: min_chunk=65536) against the library's 128 KiB (base, base2), so a
# 1-2 MB op's 128-256 KiB segments on 8 hosts are cut into two or more chunks that pipeline
# within a step. The eleventh session found 64 KiB chunks limited by the forwarding thread
# (about 80 us per chunk); this retries it on today's code. 8 emulated 10 Gbit hosts.
WORLDS="8" OPS=all_reduce,reduce_scatter,all_gather SIZES=1M,2M,4M TL_VARIANTS=" " \
  DEADLINE_S=170 bash benchmarks/h200/ab.sh base: mc64:min_chunk=65536 base2: mc64b:min_chunk=65536
