#!/usr/bin/env bash
# Forty-seventh session, call C (carry .debs; run from the repository root, after call B on the
# same warm machine): the 1 Gbit stage (issue #4's targets) on the H200 machine, its first run
# since the data sockets left BBR for CUBIC.
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=470 bash benchmarks/h200/run_all.sh env cluster1g
