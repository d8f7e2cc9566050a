#!/usr/bin/env bash
# Forty-fifth session, 2-core development machine: the commands of ../command.sh (4 hosts,
# all-reduce / all-gather / reduce-scatter 8 B-256 MB; 8 hosts, all-reduce 1-256 MB) with the
# library that moves mccl's data sockets off BBR (tcp.CONGESTION_CONTROL_SWAPS: CUBIC);
# the hosts, gloo and the ceiling stream stay on the machine's BBR. Run from this folder.
set -eu
py=../../../../../.venv/bin/python
$py -m mccl.bench --cluster --hosts 4 --rate 1gbit --world-sizes 4 \
    --ops all_reduce,all_gather,reduce_scatter --sizes 8,1K,64K,1M,4M,16M,64M,256M \
    --time-budget 4 --json n4.json --png n4.png > n4.log 2>&1
$py -m mccl.bench --cluster --hosts 8 --rate 1gbit --world-sizes 8 \
    --ops all_reduce --sizes 1M,16M,64M,256M \
    --time-budget 4 --json n8.json --png n8.png > n8.log 2>&1
# The two commands below were appended while the script ran, and bash ran them at its end;
# a second script then ran them again, starting while the first run's repeat may still have
# been finishing (up to a minute of overlap). Kept: unshaped_n4.* from the second run (the
# first was overwritten), n4_repeat1.* from the first, n4_repeat2.* from the second; both
# repeats read alike (README of ..). ../unshaped_ab/ repeats the unshaped comparison cleanly.
$py -m mccl.bench --cluster --hosts 4 --rate none --world-sizes 4 \
    --ops all_reduce,all_gather,reduce_scatter --sizes 64M,256M \
    --time-budget 3 --json unshaped_n4.json --png unshaped_n4.png > unshaped_n4.log 2>&1
for n in 1 2; do
    $py -m mccl.bench --cluster --hosts 4 --rate 1gbit --world-sizes 4 \
        --ops all_reduce --sizes 8,64K,1M,4M,16M,64M,256M \
        --time-budget 4 --json n4_repeat$n.json --png n4_repeat$n.png > n4_repeat$n.log 2>&1
done
