#!/usr/bin/env bash
# Thirtieth session, call E (carry .debs; run from the repository root): the final library's
# test suite on torch 2.11 (the H200 machine's), with the grid collectives.
OUT=$OUT DEADLINE_S=400 bash benchmarks/h200/run_all.sh env suite
