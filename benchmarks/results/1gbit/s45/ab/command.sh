#!/usr/bin/env bash
# Forty-fifth session, library of 91f4c99's data path (before the congestion-control swap):
# mccl alone, 4 hosts on 1 Gbit BBR links, all-reduce at 4 / 64 / 256 MB, five iterations
# each, two rounds alternating the machine's BBR on mccl's data sockets (base_N) and CUBIC on
# them (cc3_N: MCCL_AB=cc=3, benchmarks/h200/ab/mccl_ab.py). Run from the repository root.
set -u
for round in 1 2; do
for v in base cc3; do
  if [ $v = cc3 ]; then ab="cc=3"; else ab=""; fi
  MCCL_AB=$ab PYTHONPATH=benchmarks/h200/ab timeout 400 .venv/bin/python -m mccl.bench \
    --cluster --hosts 4 --world-sizes 4 --rate 1gbit --backends mccl --ops all_reduce \
    --sizes 4M,64M,256M --iters 5 --time-budget 30 --ceiling-seconds 2 \
    --json benchmarks/results/1gbit/s45/ab/${v}_$round.json -q \
    > benchmarks/results/1gbit/s45/ab/${v}_$round.log 2>&1
done; done
