#!/usr/bin/env bash
# Thirty-ninth session, call C (carry .debs; run from the repository root): is call s39b's
# 8-host send/recv loss at 4-16 MB the library or the emulation? Call s22a (99.6 % at 4 MB)
# ran with the kernel's default congestion control; since then the cluster defaults to BBR
# with receive steering. This library, 8 hosts at 10 Gbit, mccl and gloo: BBR against cubic,
# alternated twice.
set -u
REPO=$PWD
. scripts/iproute2_env.sh "$REPO/.debs" >/dev/null 2>&1
for round in 1 2; do
  for cc in bbr cubic; do
    timeout 150 python3 -m mccl.bench --cluster --hosts 8 --world-sizes 8 --rate 10gbit \
        --cc $cc --sizes 1M,4M,16M,64M --warmup 2 --time-budget 1 --iters 10 --ops sendrecv \
        --json $OUT/${cc}_$round.json > $OUT/${cc}_$round.log 2>&1
    echo "== $cc round $round"; grep -E "^ +(1|4|16|64)M |ceiling \(" $OUT/${cc}_$round.log
  done
done
