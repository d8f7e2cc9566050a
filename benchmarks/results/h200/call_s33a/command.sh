#!/usr/bin/env bash
# Thirty-third session, call A (carry .debs; run from the repository root): issue #7's
# cluster stage (the machine's BBR, receive steering) on this session's library (numpy views
# of tensors made from their address, p2p arrival order, bounded store calls at set-up).
OUT=$OUT DEADLINE_S=560 bash benchmarks/h200/run_all.sh env cluster
