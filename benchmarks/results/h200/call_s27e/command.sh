#!/usr/bin/env bash
# Twenty-seventh session, call E: the whole suite on torch 2.11 with iproute2 unpacked (the
# suite stage now does that itself; in call D its 11 tests on emulated hosts skipped).
OUT=$OUT DEADLINE_S=300 bash benchmarks/h200/run_all.sh suite
