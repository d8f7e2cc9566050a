#!/usr/bin/env bash
# Forty-fifth session, the library of 4a24430 (data sockets off BBR): a repeat of
# ../cubic/command.sh's first two commands, nothing else running. Run from this folder.
set -eu
py=../../../../../.venv/bin/python
$py -m mccl.bench --cluster --hosts 4 --rate 1gbit --world-sizes 4 \
    --ops all_reduce,all_gather,reduce_scatter --sizes 8,1K,64K,1M,4M,16M,64M,256M \
    --time-budget 4 --json n4.json --png n4.png > n4.log 2>&1
$py -m mccl.bench --cluster --hosts 8 --rate 1gbit --world-sizes 8 \
    --ops all_reduce,all_gather,reduce_scatter --sizes 1M,16M,64M,256M \
    --time-budget 4 --json n8.json --png n8.png > n8.log 2>&1
