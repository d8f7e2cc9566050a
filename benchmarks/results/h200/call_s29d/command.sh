#!/usr/bin/env bash
# Twenty-ninth session, call D (carry .debs; run from the repository root): the final
# library on torch 2.11, the whole suite (with the set-up's watch on the connections made
# already, PeerGoneError).
OUT=$OUT DEADLINE_S=240 bash benchmarks/h200/run_all.sh env suite
