#!/usr/bin/env bash
# Twenty-ninth session, call A (carry .debs; run from the repository root): the library on
# torch 2.11 (the whole suite, with the rendezvous's refused-dial detection), then more hosts
# than ever before: 1 Gbit emulated links, all_reduce on 2/4/8/16 of 16 hosts, then
# all_reduce/all_gather/reduce_scatter on 24 hosts, mccl vs gloo, CPU tensors.
OUT=$OUT DEADLINE_S=560 bash benchmarks/h200/run_all.sh env suite scale1g
