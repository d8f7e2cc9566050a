#!/usr/bin/env bash
# Twenty-sixth session, call B: issue #7's cluster stage (the machine's BBR, receive steering)
# with reduce-scatter's cached pool (7d16a9b), then the CUDA and CPU hand-off tests and the
# whole suite on torch 2.11.
OUT=$OUT DEADLINE_S=580 bash benchmarks/h200/run_all.sh env cluster tests suite
