#!/usr/bin/env bash
# Thirtieth session, call F (carry .debs; run from the repository root): the suite on torch
# 2.11 again, with the final library (grid.columns cached, the killed-rank grid test).
OUT=$OUT DEADLINE_S=200 bash benchmarks/h200/run_all.sh env suite
