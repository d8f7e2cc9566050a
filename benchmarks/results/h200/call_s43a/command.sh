#!/usr/bin/env bash
# Forty-third session, call A (carry .debs; run from the repository root), code of 2d071d4:
# the forty-second session's changes (a CPU send after the group broke is refused at once;
# run_ranks tells a dead rank from a hung one) on torch 2.11: CUDA and CPU hand-off tests,
# the doctor's self-test on CUDA tensors, and the whole suite (8 workers). The forty-second
# session's own call of these stages (s42a) was lost with its checkout.
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=560 bash benchmarks/h200/run_all.sh env tests doctor suite
