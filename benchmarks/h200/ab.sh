#!/usr/bin/env bash
# Design A/B on the 10 Gbit emulated cluster: the same all-reduce bench once per variant of
# mccl's named constants (benchmarks/h200/ab/sitecustomize.py sets them from MCCL_AB), gloo
# once per world size, then per-chunk timelines (benchmarks/timeline.py). One device call
# (OPS, SIZES, WORLDS, DEVICE pick the bench, DEVICE also the timelines' tensors; BENCH_ARGS
# adds bench options such as "--queue 4"; RATE the links' rate (default 10gbit); BURST the
# links' tbf bucket in bytes; TCP_CC every host's TCP congestion control (default: the
# machine's); STEER=on RPS on every link (bench --rx-steering); TL_RUNS, TL_VARIANTS,
# TL_GLOO=1, TL_HOSTS (default 4) the timelines; TL_RUNS=none skips them):
#
#   bash benchmarks/h200/ab.sh "name:key=v,key=v" ...     (results in $OUT/ab_results.tar.gz)
set -u
cd "$(dirname "$0")/../.."
REPO="$PWD"
RES="${RES:-/tmp/mccl-ab}"
OUTDIR="${OUT:-/tmp}"
DEADLINE_S="${DEADLINE_S:-500}"
SIZES="${SIZES:-1M,4M,16M,64M,256M}"
OPS="${OPS:-all_reduce}"
DEVICE="${DEVICE:-cpu}"
WORLDS="${WORLDS:-4 8}"
PY="${PYTHON:-python3}"
T0=$(date +%s)
mkdir -p "$RES" "$OUTDIR"
# shellcheck source=/dev/null
. "$REPO/scripts/iproute2_env.sh" "$REPO/.debs" >"$RES/iproute2.log" 2>&1  # no-op if ip exists
python3 -c 'import sitecustomize, sys; print("existing sitecustomize:", sitecustomize.__file__)' \
    >"$RES/sitecustomize_check.txt" 2>&1
left() { echo $(( DEADLINE_S - ($(date +%s) - T0) )); }
bench() {  # NAME WORLD BACKEND AB
    local name=$1 n=$2 backend=$3 ab=$4 lim
    lim=$(left); [ "$lim" -gt 120 ] && lim=120
    [ "$lim" -lt 20 ] && { echo "SKIP $name" >>"$RES/summary.txt"; return; }
    echo "[+$(( $(date +%s) - T0 ))s] $name n=$n $backend MCCL_AB=$ab" >>"$RES/summary.txt"
    MCCL_AB="$ab" PYTHONPATH="$REPO/benchmarks/h200/ab${PYTHONPATH:+:$PYTHONPATH}" \
        timeout --kill-after=10 "$lim" "$PY" -m mccl.bench --cluster --hosts "$n" \
        --world-sizes "$n" --rate "${RATE:-10gbit}" --backends "$backend" --ops "$OPS" \
        --device "$DEVICE" --sizes "$SIZES" --warmup 2 --time-budget 1 --iters 10 --ceiling-seconds 2 \
        ${BURST:+--burst $BURST} ${TCP_CC:+--cc $TCP_CC} ${STEER:+--rx-steering $STEER} ${BENCH_ARGS:-} --json "$RES/$name-n$n.json" >"$RES/$name-n$n.log" 2>&1
    grep -E "busbw" "$RES/$name-n$n.log" | sed "s/^/    /" >>"$RES/summary.txt"
}
for n in $WORLDS; do
    bench gloo "$n" gloo ""
    for v in "$@"; do bench "${v%%:*}" "$n" mccl "${v#*:}"; done
done
# Timelines: TL_VARIANTS "name:spec ..." (default: the defaults only) x TL_RUNS "op:size ..."
# on TL_HOSTS hosts (default 4); TL_GLOO=1 traces gloo too (its sockets' TCP_INFO), once
# per run, after the first variant's.
first_v=${TL_VARIANTS:-base:}; first_v=${first_v%% *}
[ "${TL_RUNS:-}" = none ] && TL_VARIANTS=" "  # no timelines
for v in ${TL_VARIANTS:-base:}; do
    for run in ${TL_RUNS:-all_reduce:1M all_reduce:64M}; do
      backends=mccl
      [ "${TL_GLOO:-0}" = 1 ] && [ "$v" = "$first_v" ] && backends="mccl gloo"
      for b in $backends; do
        op=${run%%:*} s=${run#*:}
        lim=$(left); [ "$lim" -gt 90 ] && lim=90
        [ "$lim" -lt 20 ] && break 3
        name="${v%%:*}"; [ "$b" = gloo ] && name=gloo
        out="$RES/timeline-$name-$op-$s"
        MCCL_AB="${v#*:}" PYTHONPATH="$REPO/benchmarks/h200/ab${PYTHONPATH:+:$PYTHONPATH}" \
            timeout --kill-after=10 "$lim" "$PY" benchmarks/timeline.py --hosts "${TL_HOSTS:-4}" \
            --rate "${RATE:-10gbit}" --op "$op" --size "$s" --reps 12 --backend "$b" --out "$out" \
            --device "$DEVICE" \
            ${BURST:+--burst $BURST} ${TCP_CC:+--cc $TCP_CC} ${STEER:+--rx-steering $STEER} \
            >"$out.log" 2>&1
        echo "timeline $name $op $s:" >>"$RES/summary.txt"
        "$PY" - "$out/summary.json" >>"$RES/summary.txt" 2>&1 <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
keys = ("period_ms_median", "ideal_ms", "before_first_send_us_median",
        "after_last_recv_us_median", "mid_op_receive_rate_pct_of_ceiling_median",
        "dry_writes_median", "dry_gap_ms_median")
print("   ", " ".join(f"{k}={d[k]:.2f}" for k in keys))
print("    link excess ms per op:", {k: v for k, v in d["link_excess_ms_per_op"].items()})
print("    retransmits:", d["retransmits_during_trace"])
print("    send sockets:", d.get("send_socket_during_trace"))
print("    tcp:", d.get("tcp_ext_all_ranks_during_trace"))
print("    drops: qdisc", d.get("qdisc_drops_during_run"), "links", d.get("link_drops_during_run"),
      "softnet", d.get("softnet_drops_during_run"),
      "netdev_max_backlog", d.get("netdev_max_backlog"))
PYEOF
      done
    done
done
tar -czf "$OUTDIR/ab_results.tar.gz" -C "$RES" . && cp "$RES/summary.txt" "$OUTDIR/summary.txt"
