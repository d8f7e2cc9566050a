#!/usr/bin/env bash
# Fifty-fifth session, call A (carry .debs; run from the repository root): the first device run
# since the fifty-third session: the whole suite on torch 2.11 (the runner's crash-race fix and
# the abort/error-message changes of the fifty-fourth session had not run there), the 10 Gbit
# cluster stage and the ViT step, with the library of cfac1d9.
set -u
mkdir -p $OUT/r && RES=/tmp/r OUT=$OUT/r DEADLINE_S=570 \
    bash benchmarks/h200/run_all.sh env suite cluster vit
