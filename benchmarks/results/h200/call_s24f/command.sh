#!/usr/bin/env bash
# Session 24 probe 2: explicit 8 MiB socket buffers vs kernel autotuning, CUBIC and BBR hosts, 10 Gbit.
set -u
export PYTHONUNBUFFERED=1
R=/tmp/s24b; mkdir -p $R
. scripts/iproute2_env.sh .debs > $R/ip.txt 2>&1
cat /proc/sys/net/core/rmem_max /proc/sys/net/core/wmem_max /proc/sys/net/ipv4/tcp_wmem /proc/sys/net/ipv4/tcp_rmem > $R/sysctl.txt
ab() { # tag hosts cc backends spec
  MCCL_AB="$5" PYTHONPATH=$PWD/benchmarks/h200/ab:$PWD timeout 110 python3 -m mccl.bench --cluster --ops all_reduce --warmup 1 --hosts $2 --world-sizes $2 --rate 10gbit --sizes 16M,64M,256M --time-budget 1 --iters 10 $3 --backends $4 --json $R/$1.json > $R/$1.log 2>&1
  echo "== $1 rc=$?"; grep -E "^ +[0-9]+M " $R/$1.log | awk '{print "   ", $1, $8, $13}'
}
AUTO=sockbuf=1099511627776
ab cub_n4_base 4 "--cc cubic" mccl,gloo ""
ab cub_n4_auto 4 "--cc cubic" mccl "$AUTO"
ab bbr_n4_auto 4 "" mccl "$AUTO"
ab bbr_n4_base 4 "" mccl ""
ab cub_n8_auto 8 "--cc cubic" mccl "$AUTO"
ab cub_n8_base 8 "--cc cubic" mccl ""
ab bbr_n8_auto 8 "" mccl "$AUTO"
cat $R/sysctl.txt
cd /tmp && tar czf $OUT/s24b.tgz s24b
