#!/usr/bin/env bash
# Forty-first session, call A (carry .debs; run from the repository root): the library as it
# stands (the fortieth session's p2p fix, transport split into address/machine modules) on
# torch 2.11: the CUDA and CPU hand-off tests; broadcast, all-to-all and send/recv on the
# 10 Gbit cluster (4 and 8 hosts; the other-ops table of the README dates from the
# twenty-second session); then issue #4's 1 Gbit stage (all-reduce, all-gather,
# reduce-scatter 1M..256M on 4 and 8 hosts, small all-reduces on 4), last run in the
# twenty-fifth session.
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=575 bash benchmarks/h200/run_all.sh env tests otherops cluster1g
