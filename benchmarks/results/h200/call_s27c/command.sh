#!/usr/bin/env bash
# Twenty-seventh session, call C: issue #7's cluster stage (the machine's BBR, receive
# steering) on this session's library (data path unchanged since the twenty-sixth session;
# the rendezvous follows the master's address family now), then the CUDA and CPU hand-off
# tests and the whole suite on torch 2.11 (with this session's IPv6 tests).
OUT=$OUT DEADLINE_S=580 bash benchmarks/h200/run_all.sh env cluster tests suite
