#!/usr/bin/env bash
# The H200 batch (issues #5 and #7, device part), one script, stages chosen on the command line:
#
#   bash benchmarks/h200/run_all.sh [STAGE ...]     # default: every stage, in this order
#
#   env       what the machine is (GPU, torch, cores, NCCL/NVLS variables kept as set)
#   tests     CUDA hand-off tests and the op x dtype matrix on CUDA tensors, then the CPU
#             hand-off tests (staging, MPS fakes) on this torch
#   ddp       DDP on CUDA tensors, 4 ranks sharing the GPU: mccl vs gloo throughput + parameters
#   overlap   bucketed synthetic step on CUDA (454 MB ViT grads), hidden % for mccl/staging/gloo
#   overlap1g the same on 4 emulated 1 Gbit hosts, gradients scaled to 45 MB (CUDA, then CPU)
#   oppath    one op's fixed cost by stage (benchmarks/oppath.py), 4 loopback ranks, 1 MB: CPU
#             all_reduce/all_gather/reduce_scatter (+ 1 rank), CUDA all_reduce blocking and
#             async with the CUDA hand-off's variants interleaved
#   doctor    python -m mccl doctor (capabilities + 2-process self-test on cuda tensors)
#   overlapcpu  the same overlap measurement on CPU tensors (2 ranks, 454 MB, 16 cores)
#   cluster   10 Gbit emulated cluster, 4 and 8 hosts: all_reduce/all_gather/reduce_scatter
#             1M..256M, mccl vs gloo, CPU tensors; then the same on CUDA tensors
#             (CLUSTER_DEVICES="cuda" runs only the CUDA rows)
#   clustermps  the cluster stage's CUDA all-reduces with the ranks' GPU work through an MPS
#             daemon (benchmarks/h200/mps.sh) instead of time-sliced contexts
#   cluster1g the cluster stage's CPU ops at 1 Gbit (issue #4's targets), 4 and 8 hosts, and
#             small all-reduces on 4
#   scale1g   more hosts than 8 (the published system ran 4-24 Macs): 1 Gbit links, where 16 cores
#             drive 24 hosts; all_reduce on 2/4/8/16 of 16 hosts, then all_reduce/all_gather/
#             reduce_scatter on 24, mccl vs gloo, CPU tensors (SCALE_HOSTS overrides "16 24")
#   scalefast more hosts at faster links, where the machine's cores may not keep up (its load is
#             sampled from /proc/stat into cpu_load.log to tell): all_reduce 1M..64M on 4/8/16
#             of 16 hosts at 5 Gbit, then 4/8/12 of 12 at 10 Gbit (SCALE_FAST_RUNS overrides:
#             "rate:hosts:worlds[:tag] ...", the tag naming a repeat's files)
#   otherops  the same cluster, 4 and 8 hosts: broadcast, all_to_all, sendrecv 1M..256M, mccl vs
#             gloo, CPU tensors
#   vit       DDP step of a ~115 M-parameter ViT on CUDA tensors, 4 emulated 10 Gbit hosts
#             (VIT_VARIANTS: mccl A/B variants beside gloo, see stage_vit)
#   suite     the whole test suite on this torch (compatibility with torch 2.11)
#
# Results: JSON/PNG/logs in $RES (default /tmp/mccl-h200), bundled into $OUT/h200_results.tar.gz
# with summary.txt beside it (the device tool returns at most 8 files). Every stage has its own
# time limit and the whole run a deadline ($DEADLINE_S, default 570 s), so one stuck stage
# cannot cost the others. The exact command of each stage is in summary.txt.
# The emulated cluster needs iproute2: if `ip` is missing, scripts/iproute2_env.sh unpacks the
# .deb files carried in .debs/ (fetched here by scripts/fetch_iproute2.sh) into /tmp.
set -u
cd "$(dirname "$0")/../.."
REPO="$PWD"
RES="${RES:-/tmp/mccl-h200}"
OUTDIR="${OUT:-$REPO/benchmarks/results/h200}"
DEADLINE_S="${DEADLINE_S:-570}"
PY="${PYTHON:-python3}"
T0=$(date +%s)
mkdir -p "$RES" "$OUTDIR"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
SUMMARY="$RES/summary.txt"

say() { echo "[$(date +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*" | tee -a "$SUMMARY"; }

# run NAME LIMIT_S CMD...: log to $RES/NAME.log, never past the deadline
run() {
    local name=$1 limit=$2 left rc
    shift 2
    left=$(( DEADLINE_S - ($(date +%s) - T0) - 15 ))
    if [ "$left" -lt 30 ]; then say "SKIP $name (deadline)"; return 0; fi
    [ "$limit" -gt "$left" ] && limit=$left
    say "RUN  $name (limit ${limit}s): $*"
    timeout --kill-after=15 "$limit" "$@" >"$RES/$name.log" 2>&1
    rc=$?
    say "DONE $name rc=$rc"
    tail -n 25 "$RES/$name.log" | sed "s/^/    $name| /" | tee -a "$SUMMARY" >/dev/null
    return 0
}

# The emulated cluster needs iproute2; unpack the carried .debs once if `ip` is missing
# (iproute2_env.sh does nothing where ip and tc exist or MCCL_IP is already set).
need_ip() {
    # shellcheck source=/dev/null
    . "$REPO/scripts/iproute2_env.sh" "$REPO/.debs" >>"$SUMMARY" 2>&1 \
        || say "iproute2_env failed (cluster stages will report it)"
}

stage_env() {
    {
        nvidia-smi -L 2>&1
        nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv 2>&1
        "$PY" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
        echo "cores $(nproc)"; uname -a
        # Machines of one kind differ in core speed (fifty-third session: one cost both
        # backends 1.3-1.7x the CPU time per op of the run before): the model and a short
        # single-core probe let two runs' machines be compared.
        grep -m1 'model name' /proc/cpuinfo
        "$PY" - <<'PROBE'
import time
import numpy as np
a = np.ones(1 << 23, np.float32)
b = a.copy()
t = time.perf_counter()
for _ in range(20):
    np.add(a, b, out=b)
add_ms = (time.perf_counter() - t) / 20 * 1e3
t = time.perf_counter()
sum(range(3_000_000))
loop_ms = (time.perf_counter() - t) * 1e3
print(f"core probe: numpy add of 32 MB {add_ms:.2f} ms, python sum(range(3e6)) {loop_ms:.1f} ms")
PROBE
        env | grep -E '^(NCCL|TORCH_SYMM|NVSHMEM)' | sort
        # The device tool copies the working tree but not always a fresh .git, so a commit line
        # can be stale; this digest of the library's sources identifies the code that ran
        # (compare with the same command in a checkout).
        echo "mccl sources sha256 $(cd "$REPO" && find mccl -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)"
    } >"$RES/env.txt" 2>&1
    say "env: $(head -n 1 "$RES/env.txt"); $(sed -n 3p "$RES/env.txt")"
}

stage_tests() {
    run tests_cuda 300 "$PY" -m pytest -q -p no:cacheprovider -rs tests/test_device_cuda.py \
        tests/test_matrix.py::test_matrix_on_cuda_tensors
    run tests_cpu_handoff 150 "$PY" -m pytest -q -p no:cacheprovider -n 4 \
        tests/test_device_staging.py tests/test_device_mps.py tests/test_early_start.py
}

stage_ddp() {
    run ddp_cuda 240 "$PY" benchmarks/ddp_cuda.py --world 4 --layers 12 --steps 8 --warmup 2 \
        --json "$RES/ddp_cuda.json"
}

stage_overlap() {
    run overlap_cuda 300 "$PY" benchmarks/overlap.py --device cuda --world 4 --scale 1.0 \
        --steps 6 --warmup 1 --json "$RES/overlap_cuda.json" --png "$RES/overlap_cuda.png"
}

stage_overlap1g() {
    # The same step on 4 emulated hosts with 1 Gbit links (issue #5's setting): the gradients
    # scaled by 0.1 (45 MB), so a 1 Gbit all-reduce takes what the full 454 MB take at 10 GbE;
    # compute calibrated to overlap.py's default ratio (the published system's, estimated).
    need_ip
    local d
    for d in ${OVERLAP_DEVICES:-cuda cpu}; do
        run "overlap1g_$d" 200 "$PY" benchmarks/overlap.py --device "$d" --world 4 \
            --scale 0.1 --cluster --rate 1gbit --steps 6 --warmup 1 \
            --json "$RES/overlap1g_$d.json" --png "$RES/overlap1g_$d.png"
    done
}

stage_oppath() {
    local op
    for op in all_reduce all_gather reduce_scatter; do
        run "oppath_cpu_$op" 60 "$PY" benchmarks/oppath.py --world 4 --op "$op" --size 1M \
            --json "$RES/oppath_cpu_$op.json"
    done
    run oppath_cpu_all_reduce_async 60 "$PY" benchmarks/oppath.py --world 4 --size 1M --async \
        --json "$RES/oppath_cpu_all_reduce_async.json"
    run oppath_cpu_all_reduce_n1 60 "$PY" benchmarks/oppath.py --world 1 --size 1M \
        --json "$RES/oppath_cpu_all_reduce_n1.json"
    # CUDA: the hand-off against its earlier behaviour (comm thread, CPU wait on the
    # producer's marker), interleaved in one run
    local v="new:;old:inline_cuda=0,gpu_wait=0"
    run oppath_cuda_all_reduce 120 "$PY" benchmarks/oppath.py --world 4 --size 1M --device cuda \
        --reps 400 --variants "$v" --json "$RES/oppath_cuda_all_reduce.json"
    run oppath_cuda_all_reduce_async 120 "$PY" benchmarks/oppath.py --world 4 --size 1M \
        --device cuda --async --reps 400 --variants "$v;cpu_wait:gpu_wait=0" \
        --json "$RES/oppath_cuda_all_reduce_async.json"
}

stage_doctor() {
    run doctor 150 "$PY" -m mccl doctor --json "$RES/doctor.json"
}

stage_overlapcpu() {
    run overlap_cpu 150 "$PY" benchmarks/overlap.py --device cpu --world 2 --scale 1.0 \
        --steps 5 --json "$RES/overlap_cpu.json" --png "$RES/overlap_cpu.png"
}

# cluster_bench NAME HOSTS LIMIT_S BENCH_ARGS...: mccl vs gloo at 1M..256M on emulated hosts
# (links of $RATE, default 10gbit; every host on the congestion control $TCP_CC if set, else
# the machine's), one rank per host; results in $RES/NAME.{log,json,png}.
# Later BENCH_ARGS override the defaults (argparse keeps the last).
cluster_bench() {
    local name=$1 n=$2 limit=$3
    shift 3
    run "$name" "$limit" "$PY" -m mccl.bench --cluster --hosts "$n" --world-sizes "$n" \
        --rate "${RATE:-10gbit}" --min 1M --max 256M --factor 4 --warmup 2 --time-budget 1 \
        --iters 10 ${TCP_CC:+--cc "$TCP_CC"} "$@" --json "$RES/$name.json" --png "$RES/$name.png"
}

stage_cluster() {
    # CLUSTER_DEVICES (default "cpu cuda") picks the tensors' devices.
    need_ip
    local n d
    for d in ${CLUSTER_DEVICES:-cpu cuda}; do
        for n in 4 8; do
            cluster_bench "cluster10g_${d}_n$n" "$n" 200 --device "$d" \
                --ops all_reduce,all_gather,reduce_scatter
        done
    done
}

stage_clustermps() {
    # The cluster stage's CUDA all-reduces with the ranks' GPU work through an MPS daemon
    # (benchmarks/h200/mps.sh): the ranks that share the one GPU run side by side instead of
    # in turns, nearer a GPU per host (fifty-first session: 1 MB on 8 hosts 87-93 % against
    # 77-78 time-sliced). gloo's ranks share it the same way.
    need_ip
    local n mps="$REPO/benchmarks/h200/mps.sh"
    bash "$mps" start >>"$RES/mps.log" 2>&1 || { say "SKIP clustermps: see mps.log"; return 0; }
    for n in 4 8; do
        ( export $(bash "$mps" env)
          cluster_bench "cluster10g_cuda_mps_n$n" "$n" 150 --device cuda --ops all_reduce )
    done
    bash "$mps" stop "$RES/mps_log"
}

stage_cluster1g() {
    # Issue #4's targets at 1 Gbit on a machine whose cores are not the bottleneck (the 2-core
    # development machine runs 4 ranks on 2 cores): all_reduce/all_gather/reduce_scatter at
    # 1M..256M on 4 and 8 hosts, then small all-reduces (latency) on 4
    need_ip
    local n
    for n in 4 8; do
        RATE=1gbit cluster_bench "cluster1g_cpu_n$n" "$n" 240 \
            --ops all_reduce,all_gather,reduce_scatter --warmup 1 --time-budget 2 --iters 5
    done
    RATE=1gbit cluster_bench cluster1g_latency_n4 4 90 --sizes 8,64,1K,8K,64K --iters 50
}

stage_scale1g() {
    # Beyond 8 hosts, at 1 Gbit (at 10 Gbit 8 hosts take the machine's 16 cores): a ring's
    # 2(n-1) steps each add a hop's latency, which the alpha-beta model (mccl.bench.model)
    # extrapolates from 2-8 hosts; these points check it
    need_ip
    local n worlds ops
    for n in ${SCALE_HOSTS:-16 24}; do
        if [ "$n" = 16 ]; then worlds=2,4,8,16; ops=all_reduce
        else worlds=$n; ops=all_reduce,all_gather,reduce_scatter; fi
        # (240 s ended the 16-host run in gloo's last cell, twenty-ninth session)
        RATE=1gbit cluster_bench "scale1g_n$n" "$n" 300 --world-sizes "$worlds" --ops "$ops" \
            --sizes 1M,4M,16M,64M,256M --warmup 1 --time-budget 2 --iters 5
    done
}

# cpu_sampler: the machine's busy share every 2 s (from /proc/stat: all but idle and iowait,
# softirq included, where the emulated links' packets are handled) into $RES/cpu_load.log
cpu_sampler() {
    "$PY" -c '
import os, time
def read():
    v = [int(x) for x in open("/proc/stat").readline().split()[1:9]]
    return sum(v), v[3] + v[4]
t0, i0 = read()
while True:
    time.sleep(2)
    t1, i1 = read()
    busy = (t1 - t0 - (i1 - i0)) / max(1, t1 - t0)
    print(time.strftime("%H:%M:%S"), f"busy {busy * os.cpu_count():.1f} of {os.cpu_count()} cores",
          flush=True)
    t0, i0 = t1, i1
' >>"$RES/cpu_load.log" 2>&1 &
    SAMPLER=$!
}

stage_scalefast() {
    need_ip
    local spec rate n worlds tag
    cpu_sampler
    for spec in ${SCALE_FAST_RUNS:-5gbit:16:4,8,16 10gbit:12:4,8,12}; do
        IFS=: read -r rate n worlds tag <<<"$spec"
        say "cpu_load.log: $(tail -1 "$RES/cpu_load.log" 2>/dev/null) (before $rate x$n)"
        RATE=$rate cluster_bench "scale_${rate}_n$n${tag:+_$tag}" "$n" 200 --world-sizes "$worlds" \
            --ops all_reduce --sizes 1M,4M,16M,64M --warmup 1 --time-budget 2 --iters 10
    done
    kill "$SAMPLER" 2>/dev/null
}

stage_otherops() {
    need_ip
    local n
    for n in 4 8; do
        cluster_bench "otherops10g_cpu_n$n" "$n" 200 --ops broadcast,all_to_all,sendrecv
    done
}

stage_vit() {
    # DDP step of a ~115 M-parameter ViT on CUDA tensors, 4 emulated 10 Gbit hosts (the ranks
    # share the one GPU): step time, no-sync compute, bare comm, hidden %. VIT_VARIANTS
    # "name:spec ..." (default "mccl: gloo:"): a name starting with gloo runs gloo, any other
    # mccl with MCCL_AB=spec (benchmarks/h200/ab/mccl_ab.py), in the order given. VIT_ARGS:
    # more arguments for benchmarks/vit_ddp_step.py (e.g. "--steps 12"); VIT_TRACE=1: each
    # run also writes rank 0's timeline of its last DDP step (vit10g_NAME.trace.json).
    need_ip
    local v name backend
    for v in ${VIT_VARIANTS:-mccl: gloo:}; do
        name=${v%%:*} backend=mccl
        case $name in gloo*) backend=gloo ;; esac
        run "vit10g_$name" 200 env MCCL_AB="${v#*:}" \
            PYTHONPATH="$REPO/benchmarks/h200/ab:$PYTHONPATH" \
            "$PY" -m mccl.bench.train --cluster --rate 10gbit --world-size 4 \
            --backend "$backend" --script benchmarks/vit_ddp_step.py -- --device cuda \
            --batch 32 ${VIT_ARGS:-} --json "$RES/vit10g_$name.json" \
            ${VIT_TRACE:+--trace "$RES/vit10g_$name.trace.json"}
    done
}

stage_suite() {
    need_ip  # the tests on emulated hosts skip without iproute2
    # -v and --durations: the log names every test that finished and the slowest ones, so a
    # test still running when the limit fires is the one missing from it
    run suite 240 "$PY" -m pytest -v -p no:cacheprovider -n 8 --durations=25 tests
}

STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(env tests ddp overlap doctor overlapcpu cluster vit suite)
say "run_all.sh ${STAGES[*]} (repo $REPO, results $RES, deadline ${DEADLINE_S}s)"
for s in "${STAGES[@]}"; do
    if declare -F "stage_$s" >/dev/null; then "stage_$s"; else say "unknown stage $s"; fi
done
say "all stages done"
tar -czf "$OUTDIR/h200_results.tar.gz" -C "$RES" . && cp "$SUMMARY" "$OUTDIR/summary.txt"
