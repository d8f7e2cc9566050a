#!/usr/bin/env bash
# Forty-eighth session, on the 2-core development machine (root, BBR host, iproute2): the
# order of the data sockets' congestion-control swap, before connecting (the default) against
# after (cc_late=1, the library before this session), mccl twice each, gloo beside them.
set -u
cd "$(dirname "$0")/../../../.."
PYTHON=.venv/bin/python RATE=1gbit WORLDS=4 SIZES=16M,64M TL_RUNS=none DEADLINE_S=400 \
    RES=/tmp/abl OUT=/tmp/abl_out bash benchmarks/h200/ab.sh \
    "early:" "late:cc_late=1" "early2:" "late2:cc_late=1"
PYTHON=.venv/bin/python RATE=2gbit WORLDS=2 SIZES=64M TL_RUNS=none DEADLINE_S=300 \
    RES=/tmp/abl2 OUT=/tmp/abl2_out bash benchmarks/h200/ab.sh \
    "early:" "late:cc_late=1" "early2:" "late2:cc_late=1"
