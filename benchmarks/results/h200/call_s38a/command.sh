#!/usr/bin/env bash
# Thirty-eighth session, call A (carry .debs; run from the repository root): the library of
# this session (host all-reduce and reduce-scatter read their tensors through numpy views
# only, no GIL-releasing torch view calls on the op's path; complex tensors signed as their
# real parts) on torch 2.11: CUDA and CPU hand-off tests, the 10 Gbit cluster stage (4 and 8
# hosts, BBR, steering; CPU then CUDA tensors), then the 1 MB timeline experiment with the old
# torch view calls put back (torchviews) against base, alternated three times.
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=430 bash benchmarks/h200/run_all.sh env tests cluster
export PATH=/tmp/iproute2:$PATH PYTHONPATH=$PWD
[ -x /tmp/iproute2/ip ] || bash scripts/iproute2_env.sh >/dev/null 2>&1
timeout 150 python3 benchmarks/h200/exp_rs_timeline.py $OUT/exp_views.json base torchviews base torchviews base torchviews > $OUT/exp_views.txt 2>&1
cat $OUT/exp_views.txt
