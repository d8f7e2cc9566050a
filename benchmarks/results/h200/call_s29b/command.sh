#!/usr/bin/env bash
# Twenty-ninth session, call B (carry .debs; run from the repository root): more hosts at
# faster links, where a ring's per-hop latency shows at 1 MB: all_reduce 1M..64M on 4/8/16
# of 16 hosts at 5 Gbit, then on 4/8/12 of 12 hosts at 10 Gbit, mccl vs gloo, CPU tensors,
# with the machine's load sampled (cpu_load.log) to tell whether its 16 cores kept up.
OUT=$OUT DEADLINE_S=440 bash benchmarks/h200/run_all.sh env scalefast
