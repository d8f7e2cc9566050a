#!/usr/bin/env bash
# Twenty-fifth session, call A: CUBIC hosts at 10 Gbit, 4 hosts: is TCP_NOTSENT_LOWAT
# (kernel default, as gloo) behind mccl's unsteady all-reduce? With per-link TCP_INFO
# timelines of mccl (both settings) and gloo. (Run with CC=cubic, the variable ab.sh read
# then; it is TCP_CC now.)
TCP_CC=cubic WORLDS=4 SIZES=16M,64M,256M DEADLINE_S=540 TL_VARIANTS="base: lowat:notsent=-1" \
    TL_RUNS="all_reduce:64M" TL_GLOO=1 bash benchmarks/h200/ab.sh "base:" "lowat:notsent=-1" \
    "base2:" "lowat2:notsent=-1"
