#!/usr/bin/env bash
# Thirty-ninth session, call A (carry .debs; run from the repository root): the library of
# this session (posted receives indexed by source and tag, parked ops' memory through a span
# index, no probe to a peer whose bytes are unread, unread bytes dropped before a close,
# rank / world-size checks at init, mismatch reports carrying the sender's op) on torch 2.11:
# the CUDA and CPU hand-off tests, then broadcast, all-to-all and send/recv on the 10 Gbit
# cluster (4 and 8 hosts), where send/recv goes through the posted-receive path.
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=500 bash benchmarks/h200/run_all.sh env tests otherops
