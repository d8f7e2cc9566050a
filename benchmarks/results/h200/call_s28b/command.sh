#!/usr/bin/env bash
# Twenty-eighth session, call B (carry .debs; run from the repository root): issue #7's
# cluster stage (the machine's BBR, receive steering) on this session's library (data path
# unchanged since the twenty-sixth session), now with each row's CPU per op and cores kept
# busy per rank, mccl and gloo alike.
OUT=$OUT DEADLINE_S=400 bash benchmarks/h200/run_all.sh env cluster
