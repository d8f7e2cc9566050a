#!/usr/bin/env bash
# Twenty-seventh session, call D: the whole suite on torch 2.11 again, after the link-local
# test got its own cluster prefix (in call C it met the torchrun test's cluster under the
# suite's 8 parallel workers).
OUT=$OUT DEADLINE_S=300 bash benchmarks/h200/run_all.sh env suite
