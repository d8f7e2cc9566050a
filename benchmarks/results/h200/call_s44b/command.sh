#!/usr/bin/env bash
# Forty-fourth session, call B (carry .debs; run from the repository root), the session's final
# library (the fault fixes of call A, plus: os.fork children disown the parent's groups, an idle
# rank reads past a later collective's large frames for a posted receive, a failed CPU send's
# Work fails in the turn of the job that breaks the group): CUDA and CPU hand-off tests, then
# the whole suite (8 workers).
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=400 bash benchmarks/h200/run_all.sh env tests suite
