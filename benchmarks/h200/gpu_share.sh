#!/usr/bin/env bash
# How much of the CUDA all-reduce's gap to the 10 Gbit ceiling comes from ranks sharing one
# GPU? The same bench (mccl and gloo, CUDA tensors, emulated 10 Gbit hosts) once per
# placement of the ranks, alternating, ROUNDS times:
#   spread  over every GPU (the bench's default, rank % GPUs)
#   one     all on GPU 0 (CUDA_VISIBLE_DEVICES=0), each rank its own CUDA context, which the
#           GPU time-slices
#   mps     all on GPU 0 through an MPS control daemon started for that run and quit after it
#           (benchmarks/h200/mps.sh), so the ranks' work shares the GPU at once instead of
#           in turns; skipped where nvidia-cuda-mps-control is missing
#
#   bash benchmarks/h200/gpu_share.sh        # results and logs in $RES, summary.txt beside
#   python benchmarks/h200/ab_report.py $RES --png gpu_share.png > gpu_share.md
#
# WORLDS (default "4 8"), SIZES (default 1M,16M,64M,256M), ROUNDS (default 1), PLACEMENTS
# (default "spread one"), DEADLINE_S.
set -u
cd "$(dirname "$0")/../.."
REPO="$PWD"
RES="${RES:-/tmp/mccl-gpu-share}"
DEADLINE_S="${DEADLINE_S:-400}"
SIZES="${SIZES:-1M,16M,64M,256M}"
WORLDS="${WORLDS:-4 8}"
ROUNDS="${ROUNDS:-1}"
PLACEMENTS="${PLACEMENTS:-spread one}"
PY="${PYTHON:-python3}"
T0=$(date +%s)
mkdir -p "$RES"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# shellcheck source=/dev/null
. "$REPO/scripts/iproute2_env.sh" "$REPO/.debs" >"$RES/iproute2.log" 2>&1  # no-op if ip exists
GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
MPS="$REPO/benchmarks/h200/mps.sh"
trap 'bash "$MPS" stop "$RES/mps_log"' EXIT
echo "gpus $GPUS, cores $(nproc)" >>"$RES/summary.txt"
for round in $(seq "$ROUNDS"); do
    for n in $WORLDS; do
        for placement in $PLACEMENTS; do
            left=$(( DEADLINE_S - ($(date +%s) - T0) ))
            [ "$left" -lt 40 ] && { echo "SKIP $placement n=$n r$round" >>"$RES/summary.txt"; continue; }
            [ "$left" -gt 150 ] && left=150
            name="${placement}_r${round}-n${n}"
            visible="" mpsenv=""
            [ "$placement" != spread ] && visible=0
            if [ "$placement" = mps ]; then
                bash "$MPS" start >>"$RES/mps.log" 2>&1 \
                    || { echo "SKIP mps: see mps.log" >>"$RES/summary.txt"; continue; }
                mpsenv=$(bash "$MPS" env)
            fi
            echo "[+$(( $(date +%s) - T0 ))s] $name (CUDA_VISIBLE_DEVICES=${visible:-all})" \
                >>"$RES/summary.txt"
            env ${visible:+CUDA_VISIBLE_DEVICES=$visible} $mpsenv timeout --kill-after=10 "$left" \
                "$PY" -m mccl.bench --cluster --hosts "$n" --world-sizes "$n" --rate 10gbit \
                --device cuda --ops all_reduce --sizes "$SIZES" --warmup 2 --time-budget 1 \
                --iters 10 --ceiling-seconds 2 --json "$RES/$name.json" >"$RES/$name.log" 2>&1
            grep -E "^ +[0-9]+[KMG]? " "$RES/$name.log" | sed "s/^/    /" >>"$RES/summary.txt"
            [ "$placement" = mps ] && bash "$MPS" stop
        done
    done
done
