#!/usr/bin/env bash
# An MPS control daemon for GPU-sharing measurements: CUDA processes started with the
# environment `mps.sh env` prints run their work on GPU 0 through one MPS server, side by side,
# instead of each in its own context that the GPU time-slices (as emulated hosts sharing one
# GPU otherwise do). Pipe and log folders under $MPS_DIR (default /tmp/mccl-mps); the daemon
# changes no GPU setting and is quit by `stop`, which also copies the daemon's logs (they name
# every client that connected: proof the ranks went through it) to LOGS_TO if given.
#
#   bash benchmarks/h200/mps.sh start|stop [LOGS_TO]|env
set -u
MPS_DIR="${MPS_DIR:-/tmp/mccl-mps}"
case "${1:-}" in
    start)
        command -v nvidia-cuda-mps-control >/dev/null \
            || { echo "mps.sh: no nvidia-cuda-mps-control" >&2; exit 1; }
        mkdir -p "$MPS_DIR/pipe" "$MPS_DIR/log"
        CUDA_VISIBLE_DEVICES=0 CUDA_MPS_PIPE_DIRECTORY="$MPS_DIR/pipe" \
            CUDA_MPS_LOG_DIRECTORY="$MPS_DIR/log" nvidia-cuda-mps-control -d ;;
    stop)
        command -v nvidia-cuda-mps-control >/dev/null || exit 0
        echo quit | CUDA_MPS_PIPE_DIRECTORY="$MPS_DIR/pipe" nvidia-cuda-mps-control \
            >/dev/null 2>&1
        sleep 1
        if [ -n "${2:-}" ] && [ -d "$MPS_DIR/log" ]; then
            mkdir -p "$2" && cp -r "$MPS_DIR/log/." "$2"
        fi ;;
    env)
        echo "CUDA_VISIBLE_DEVICES=0 CUDA_MPS_PIPE_DIRECTORY=$MPS_DIR/pipe" \
            "CUDA_MPS_LOG_DIRECTORY=$MPS_DIR/log" ;;
    *)
        echo "usage: mps.sh start|stop [LOGS_TO]|env" >&2; exit 2 ;;
esac
