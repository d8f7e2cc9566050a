#!/usr/bin/env bash
# Fifty-sixth session, call B (carry .debs; run from the repository root).
# 1. The CUDA test of the staged all-gather / reduce-scatter, now with both of an op's tensors
#    copied piece by piece (the one holding this rank's segment too: the all-gather's input,
#    the reduce-scatter's output).
# 2. A/B on the 10 Gbit cluster, CUDA tensors, 4 then 8 hosts: "new" (both tensors by piece)
#    against "s55" (MCCL_AB=own_ranges=0: that tensor whole, as in call A), gloo in the run.
# 3. Why 1 MB CUDA all-gathers and reduce-scatters reach 48-61 % of the link in call A while
#    the all-reduce reaches 74-88 %: whether torch 2.11's flat wrappers tell the group the op
#    blocks (asyncOp), one op's fixed cost by stage (benchmarks/oppath.py, 4 loopback ranks),
#    and the cluster's CUDA rows with the ranks' GPU work through an MPS daemon (nearer a GPU
#    per host than 4-8 time-sliced contexts).
set -u
R=$OUT/r; mkdir -p $R
timeout 100 python3 -m pytest -q -p no:cacheprovider -rs tests/test_device_cuda.py -k ranged \
    >$R/test_ranged.log 2>&1; echo "ranged test rc=$?" >>$R/test_ranged.log
for n in 4 8; do
    OPS=all_reduce,all_gather,reduce_scatter DEVICE=cuda SIZES=1M,16M,64M,256M WORLDS=$n \
        TL_RUNS=none DEADLINE_S=120 RES=/tmp/ab$n OUT=$OUT/ab$n \
        bash benchmarks/h200/ab.sh "new:" "s55:own_ranges=0"
done
python3 - >$R/wrappers.txt 2>&1 <<'PY'
import inspect, torch, torch.distributed.distributed_c10d as c
print("torch", torch.__version__)
for f in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce"):
    src = inspect.getsource(getattr(c, f))
    print(f, [l.strip() for l in src.splitlines() if "asyncOp" in l or "Options()" in l
              or "group." in l or "_single(" in l])
PY
for op in all_reduce all_gather reduce_scatter; do
    timeout 45 python3 benchmarks/oppath.py --world 4 --op $op --size 1M --device cuda \
        --reps 200 --json $R/oppath_cuda_$op.json >$R/oppath_cuda_$op.log 2>&1
    echo "oppath $op rc=$?" >>$R/oppath_cuda_$op.log
done
. scripts/iproute2_env.sh .debs >$R/iproute2.log 2>&1
bash benchmarks/h200/mps.sh start >$R/mps.log 2>&1 && export $(bash benchmarks/h200/mps.sh env)
for n in 4 8; do
    timeout 60 python3 -m mccl.bench --cluster --hosts $n --world-sizes $n --rate 10gbit \
        --sizes 1M,4M --warmup 2 --time-budget 1 --iters 10 --device cuda \
        --ops all_reduce,all_gather,reduce_scatter --json $R/cluster10g_cuda_mps_n$n.json \
        >$R/cluster10g_cuda_mps_n$n.log 2>&1
    echo "rc=$?" >>$R/cluster10g_cuda_mps_n$n.log
done
bash benchmarks/h200/mps.sh stop $R/mps_log >>$R/mps.log 2>&1
