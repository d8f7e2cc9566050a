#!/usr/bin/env bash
# Forty-ninth session, call E (carry .debs; same warm machine): a 64 KiB chunk floor
# (min_chunk=65536, the library's is 128 KiB) against the default at 1-2 MB on 8 hosts, all
# three ops, two runs each, for the 1 MB reduce-scatter. Not kept: no gain at 1 MB, 97 % at 2 MB.
set -u
mkdir -p $OUT; WORLDS=8 OPS=all_reduce,all_gather,reduce_scatter SIZES=1M,2M TL_RUNS=none \
    DEADLINE_S=150 RES=/tmp/ab5 OUT=$OUT \
    bash benchmarks/h200/ab.sh "base:" "c64:min_chunk=65536" "base2:" "c64b:min_chunk=65536"
