#!/usr/bin/env bash
# Twenty-fifth session, call C: issue #7's cluster stage with receive steering (the bench's
# default on shaped links since e37defb), on the machine's BBR and on CUBIC hosts.
mkdir -p $OUT/bbr $OUT/cubic
OUT=$OUT/bbr RES=/tmp/r_bbr DEADLINE_S=275 bash benchmarks/h200/run_all.sh env cluster
TCP_CC=cubic OUT=$OUT/cubic RES=/tmp/r_cub DEADLINE_S=270 bash benchmarks/h200/run_all.sh cluster
