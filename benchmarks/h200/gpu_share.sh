#!/usr/bin/env bash
# How much of the CUDA all-reduce's gap to the 10 Gbit ceiling comes from ranks sharing one
# GPU? On a machine with several GPUs, the same bench (mccl and gloo, CUDA tensors, emulated
# 10 Gbit hosts) twice per world size: ranks spread over every GPU (the bench's default,
# rank % GPUs) and all on GPU 0 (CUDA_VISIBLE_DEVICES=0), alternating, ROUNDS times.
#
#   bash benchmarks/h200/gpu_share.sh        # results and logs in $RES, summary.txt beside
#   python benchmarks/h200/ab_report.py $RES --png gpu_share.png > gpu_share.md
#
# WORLDS (default "4 8"), SIZES (default 1M,16M,64M,256M), ROUNDS (default 1), DEADLINE_S.
set -u
cd "$(dirname "$0")/../.."
REPO="$PWD"
RES="${RES:-/tmp/mccl-gpu-share}"
DEADLINE_S="${DEADLINE_S:-400}"
SIZES="${SIZES:-1M,16M,64M,256M}"
WORLDS="${WORLDS:-4 8}"
ROUNDS="${ROUNDS:-1}"
PY="${PYTHON:-python3}"
T0=$(date +%s)
mkdir -p "$RES"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# shellcheck source=/dev/null
. "$REPO/scripts/iproute2_env.sh" "$REPO/.debs" >"$RES/iproute2.log" 2>&1  # no-op if ip exists
GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
echo "gpus $GPUS, cores $(nproc)" >>"$RES/summary.txt"
for round in $(seq "$ROUNDS"); do
    for n in $WORLDS; do
        for placement in spread one; do
            left=$(( DEADLINE_S - ($(date +%s) - T0) ))
            [ "$left" -lt 40 ] && { echo "SKIP $placement n=$n r$round" >>"$RES/summary.txt"; continue; }
            [ "$left" -gt 150 ] && left=150
            name="${placement}_r${round}-n${n}"
            visible=""
            [ "$placement" = one ] && visible=0
            echo "[+$(( $(date +%s) - T0 ))s] $name (CUDA_VISIBLE_DEVICES=${visible:-all})" \
                >>"$RES/summary.txt"
            env ${visible:+CUDA_VISIBLE_DEVICES=$visible} timeout --kill-after=10 "$left" \
                "$PY" -m mccl.bench --cluster --hosts "$n" --world-sizes "$n" --rate 10gbit \
                --device cuda --ops all_reduce --sizes "$SIZES" --warmup 2 --time-budget 1 \
                --iters 10 --ceiling-seconds 2 --json "$RES/$name.json" >"$RES/$name.log" 2>&1
            grep -E "^ +[0-9]+[KMG]? " "$RES/$name.log" | sed "s/^/    /" >>"$RES/summary.txt"
        done
    done
done
