#!/usr/bin/env bash
# Twenty-sixth session, call C, CUBIC hosts (receive steering): reduce-scatter's cached pool
# (new, new2: 2 MiB, the default) against the spares alone (old, old2: rs_pool=0) and pools of
# 4 and 1 MiB, 8 emulated 10 Gbit hosts, all-reduce beside it; then issue #7's cluster stage.
mkdir -p $OUT/ab $OUT/cubic
TCP_CC=cubic WORLDS="8" OPS=reduce_scatter,all_reduce SIZES=16M,64M,256M TL_VARIANTS=" " \
  DEADLINE_S=260 OUT=$OUT/ab RES=/tmp/ab bash benchmarks/h200/ab.sh new: old:rs_pool=0 \
  p4m:rs_pool_bytes=4194304 p1m:rs_pool_bytes=1048576 new2: old2:rs_pool=0
TCP_CC=cubic OUT=$OUT/cubic RES=/tmp/r_cub DEADLINE_S=300 bash benchmarks/h200/run_all.sh cluster
