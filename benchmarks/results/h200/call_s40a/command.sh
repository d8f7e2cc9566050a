#!/usr/bin/env bash
# Fortieth session, call A (carry .debs; run from the repository root, with the library of
# 82e19cf unpacked into ab_base/mccl, untracked): 8-host send/recv at 4-16 MB read 66-82 % in
# call s39b, where it ran first in its job, and 95-100 % in s39c. A rank whose comm thread
# serves a posted receive stashed (copied out, then in again) the next large message of its
# peer when that sender ran a step ahead; now such a message stays in the socket until its
# receive is posted. A/B of base (82e19cf) against cur, alternated three times, send/recv
# alone, mccl only; then cur with gloo after broadcast and all-to-all, as in call s39a.
set -u
REPO=$PWD
. scripts/iproute2_env.sh "$REPO/.debs" >/dev/null 2>&1
R=$OUT/r
mkdir -p $R
for round in 1 2 3; do
  for v in base cur; do
    dir=$REPO; [ $v = base ] && dir=$REPO/ab_base
    ( cd "$dir" && PYTHONPATH="$dir" timeout 100 python3 -m mccl.bench --cluster --hosts 8 \
        --world-sizes 8 --rate 10gbit --sizes 1M,4M,16M,64M --warmup 2 --time-budget 1 \
        --iters 20 --ops sendrecv --backends mccl --json $R/${v}_$round.json \
        > $R/${v}_$round.log 2>&1 )
    echo "== $v round $round"; grep -E "^ +(1|4|16|64)M " $R/${v}_$round.log
  done
done
timeout 240 python3 -m mccl.bench --cluster --hosts 8 --world-sizes 8 --rate 10gbit \
    --sizes 1M,4M,16M,64M --warmup 2 --time-budget 1 --iters 10 \
    --ops broadcast,all_to_all,sendrecv --json $R/cur_otherops.json > $R/cur_otherops.log 2>&1
echo "== cur, after broadcast and all_to_all, with gloo"; grep -E "^#|^ +(1|4|16|64)M " $R/cur_otherops.log
cd $OUT && tar czf s40a.tgz r && rm -rf r
