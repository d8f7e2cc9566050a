#!/usr/bin/env bash
# Twenty-fifth session, call B (`call_s25b/`): does receive steering (RPS on every veth end, bench
# --rx-steering on) remove the reordering that makes CUBIC hosts unsteady at 10 Gbit?
# (The two BBR runs failed at once: the machine sets CC, the C compiler, which ab.sh then
# took for the congestion control; ab.sh now reads TCP_CC.)
# All-reduce 16-256 MB, 4 and 8 hosts, mccl twice and gloo once per setting.
set -u
cd "$(dirname "$0")/../../../.."
export PYTHONUNBUFFERED=1
ab() {  # tag deadline, then ab.sh's variants; TCP_CC/STEER/TL_* from the caller
    mkdir -p "$OUT/$1"
    OUT="$OUT/$1" RES="/tmp/s25-$1" WORLDS="4 8" SIZES=16M,64M,256M DEADLINE_S=$2 \
        bash benchmarks/h200/ab.sh "${@:3}"
    grep -E "^\[|busbw" "$OUT/$1/summary.txt" | grep -v "time(us)"
}
TCP_CC=cubic STEER=off TL_RUNS=" " ab cub_off 150 base: base2:
TCP_CC=cubic STEER=on TL_RUNS="all_reduce:64M" TL_GLOO=1 ab cub_on 200 base: base2:
STEER=on TL_RUNS=" " ab bbr_on 105 base:
STEER=off TL_RUNS=" " ab bbr_off 105 base:
