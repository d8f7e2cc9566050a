#!/usr/bin/env bash
# Twenty-ninth session, call C (carry .debs; run from the repository root): call B's 12 hosts
# at 10 Gbit again, all_reduce, mccl vs gloo, two runs on BBR hosts (the machine's congestion
# control) and two on CUBIC hosts (macOS's default), to tell whether mccl's 2-4.7 points
# behind gloo there from 4 MB repeat.
SCALE_FAST_RUNS="10gbit:12:12:a 10gbit:12:12:b" OUT=$OUT/bbr RES=/tmp/s29c-bbr \
  DEADLINE_S=200 bash benchmarks/h200/run_all.sh scalefast
TCP_CC=cubic SCALE_FAST_RUNS="10gbit:12:12:a 10gbit:12:12:b" OUT=$OUT/cubic \
  RES=/tmp/s29c-cubic DEADLINE_S=200 bash benchmarks/h200/run_all.sh scalefast
