#!/usr/bin/env bash
# Forty-fifth session, 2-core development machine (root, iproute2), the library of ed766ab
# (the forty-fourth session's final): a fresh reading of the 1 Gbit targets of issue #4 on
# this machine's BBR, nothing else running. 4 hosts, all-reduce / all-gather /
# reduce-scatter from 8 B to 256 MB; 8 hosts, all-reduce; then unshaped links (CPU-bound).
# mccl and gloo in each run. Run from this folder.
set -eu
py=../../../../.venv/bin/python
$py -m mccl.bench --cluster --hosts 4 --rate 1gbit --world-sizes 4 \
    --ops all_reduce,all_gather,reduce_scatter --sizes 8,1K,64K,1M,4M,16M,64M,256M \
    --time-budget 4 --json n4.json --png n4.png > n4.log 2>&1
$py -m mccl.bench --cluster --hosts 8 --rate 1gbit --world-sizes 8 \
    --ops all_reduce --sizes 1M,16M,64M,256M \
    --time-budget 4 --json n8.json --png n8.png > n8.log 2>&1
$py -m mccl.bench --cluster --hosts 4 --rate none --world-sizes 4 \
    --ops all_reduce,all_gather,reduce_scatter --sizes 64M,256M \
    --time-budget 3 --json unshaped_n4.json --png unshaped_n4.png > unshaped_n4.log 2>&1
