#!/usr/bin/env bash
# Twenty-seventh session, call B (carry .debs; run from the repository root): every send of up
# to 256 KiB written at once by the op's thread when the socket is idle (wall, wall2:
# write_max=262144; the rest, if the socket does not take it all, goes to the sender thread)
# against the library's default, where only an op's first send to a peer is (base, base2).
# At 8 hosts every chunk is at most 256 KiB (the chunk cap), so "wall" writes every send that
# finds the socket idle. 8 and 4 emulated 10 Gbit hosts, the machine's BBR, receive steering.
WORLDS="8 4" OPS=all_reduce,reduce_scatter,all_gather SIZES=1M,4M,16M,64M BENCH_ARGS="--check" \
  TL_VARIANTS=" " DEADLINE_S=420 \
  bash benchmarks/h200/ab.sh base: wall:write_max=262144 base2: wall2:write_max=262144
