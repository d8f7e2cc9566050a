#!/usr/bin/env bash
# Thirty-ninth session, call B (carry .debs; run from the repository root, with the library
# of bf753c3 unpacked into ab_base/mccl, untracked): call A's 8-host send/recv read 67 % at
# 4 MB where call s22a read 99.6 %. A/B of this session's library (cur) against the last
# session's (base), alternated three times on one 10 Gbit 8-host cluster per run, mccl only.
set -u
REPO=$PWD
. scripts/iproute2_env.sh "$REPO/.debs" >/dev/null 2>&1
for round in 1 2 3; do
  for v in base cur; do
    dir=$REPO; [ $v = base ] && dir=$REPO/ab_base
    ( cd "$dir" && PYTHONPATH="$dir" timeout 120 python3 -m mccl.bench --cluster --hosts 8 \
        --world-sizes 8 --rate 10gbit --sizes 1M,4M,16M --warmup 2 --time-budget 1 --iters 10 \
        --ops sendrecv,all_to_all --backends mccl --json $OUT/${v}_$round.json \
        > $OUT/${v}_$round.log 2>&1 )
    echo "== $v round $round"; grep -E "^ +(1|4|16)M " $OUT/${v}_$round.log
  done
done
