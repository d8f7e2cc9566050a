#!/usr/bin/env bash
# Forty-fifth session, the library of 45a1c09 (data sockets on BBR move to CUBIC): unshaped
# links, 4 hosts (the 2 cores are the bottleneck), all-reduce at 64 / 256 MB, mccl and gloo
# in each run, two rounds alternating the library's default (cubic_N: mccl's data sockets on
# CUBIC) with MCCL_AB=cc=2 (bbr_N: mccl's data sockets put back on BBR, as before 45a1c09).
# Run from the repository root.
set -eu
d=benchmarks/results/1gbit/s45/unshaped_ab
for round in 1 2; do
for v in cubic bbr; do
  if [ $v = bbr ]; then ab="cc=2"; else ab=""; fi
  MCCL_AB=$ab PYTHONPATH=benchmarks/h200/ab .venv/bin/python -m mccl.bench --cluster \
    --hosts 4 --world-sizes 4 --rate none --ops all_reduce --sizes 64M,256M --time-budget 3 \
    --json $d/${v}_$round.json --png $d/${v}_$round.png > $d/${v}_$round.log 2>&1
done; done
