#!/usr/bin/env bash
# Twenty-sixth session, call D: reduce-scatter's cached pool against the spares alone, two
# pairs, 8 and 4 emulated 10 Gbit hosts on the machine's BBR; then issue #7's cluster stage
# on CUBIC hosts (call C's ran on a disturbed machine).
mkdir -p $OUT/ab $OUT/cubic
WORLDS="8 4" OPS=reduce_scatter SIZES=16M,64M,256M TL_VARIANTS=" " DEADLINE_S=200 \
  OUT=$OUT/ab RES=/tmp/ab bash benchmarks/h200/ab.sh new: old:rs_pool=0 new2: old2:rs_pool=0
TCP_CC=cubic OUT=$OUT/cubic RES=/tmp/r_cub DEADLINE_S=200 bash benchmarks/h200/run_all.sh cluster
