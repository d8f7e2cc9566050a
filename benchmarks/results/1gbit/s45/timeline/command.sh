#!/usr/bin/env bash
# Forty-fifth session, library of ed766ab (every data socket on the machine's BBR): five
# back-to-back 256 MB all-reduces on 4 emulated 1 Gbit hosts, each backend, with every rank's
# send socket sampled every 5 ms (TCP_INFO). The per-rank traces (600 KB each) are not kept;
# the summaries were re-made with --analyze after probe_rtt_spans and op_ms_per_rank_op were
# added to the summary. Run from the repository root.
set -eu
for b in mccl gloo; do
    .venv/bin/python benchmarks/timeline.py --hosts 4 --rate 1gbit --op all_reduce --size 256M \
        --reps 5 --backend $b --out /tmp/tl45/$b
    .venv/bin/python benchmarks/timeline.py --analyze --out /tmp/tl45/$b
    cp /tmp/tl45/$b/summary.json benchmarks/results/1gbit/s45/timeline/${b}_summary.json
done
