#!/usr/bin/env bash
# Twenty-fifth session, call D: why does reduce-scatter trail all-reduce (whose first half is
# a reduce-scatter) at 10 Gbit? Per-chunk timelines on CUBIC hosts with receive steering.
set -u
cd "$(dirname "$0")/../../../.."
. scripts/iproute2_env.sh .debs >/dev/null 2>&1
tl() {  # name hosts op size
    timeout 100 python3 benchmarks/timeline.py --hosts $2 --rate 10gbit --cc cubic --op $3 \
        --size $4 --reps 10 --out /tmp/tl-$1 > /tmp/tl-$1.log 2>&1
    echo "== $1 rc=$?"
    python3 - /tmp/tl-$1/summary.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("period_ms_median", "ideal_ms", "before_first_send_us_median",
          "after_last_recv_us_median", "mid_op_receive_rate_pct_of_ceiling_median",
          "dry_writes_median", "dry_gap_ms_median"):
    print(f"  {k}={d.get(k)}")
print("  excess:", {k: [round(x, 1) for x in v] for k, v in d["link_excess_ms_per_op"].items()})
print("  retrans:", d["retransmits_during_trace"])
PY
}
tl rs8_64 8 reduce_scatter 64M
tl ar8_64 8 all_reduce 64M
tl rs4_256 4 reduce_scatter 256M
tl ag8_64 8 all_gather 64M
cd /tmp && tar czf $OUT/tl.tgz tl-*
