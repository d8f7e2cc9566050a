#!/usr/bin/env bash
# Forty-fourth session, call A (carry .debs; run from the repository root), code of the
# session's fault fixes (stash bound, a failed CPU send breaks the group, abort's error frame):
# CUDA and CPU hand-off tests, the doctor, then the 10 Gbit cluster stage as a regression check.
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=560 bash benchmarks/h200/run_all.sh env tests doctor cluster
