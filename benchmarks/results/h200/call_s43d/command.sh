#!/usr/bin/env bash
# Forty-third session, call D (carry .debs; run from the repository root), code of 602b4cb
# plus old_mesh.py (git show 65d4815:mccl/transport/mesh.py, untracked): a loop of the
# late-rank case (its script lacked a __main__ guard, so the spawned ranks failed: no loop
# result) and the suite twice. The device tool returns at most 8 files: the suites came
# back only in the output tail (results.txt).
cat > /tmp/late.py <<'PY'
import sys; sys.path.insert(0, sys.argv[2])
from mccl.bench.spawn import run_ranks
from tests.test_faults import _later_than_the_timeout
bad = 0
for i in range(int(sys.argv[1])):
    res = run_ranks(_later_than_the_timeout, 3, 1000, timeout=60, pg_timeout_s=2)
    ok = all("op #2" in res[r] and "rank 1" in res[r] for r in (0, 2)) and "gave up on rank 1" in res[1]
    bad += not ok
    if not ok: print("BAD", res, flush=True)
print("runs", sys.argv[1], "bad", bad)
PY
rm -rf /tmp/old && mkdir /tmp/old && cp -r mccl tests /tmp/old/ && cp old_mesh.py /tmp/old/mccl/transport/mesh.py
for v in /tmp/old $PWD; do
  for h in $(seq 8); do timeout 60 sh -c 'while :; do :; done' & done
  for i in $(seq 8); do (cd $v && timeout 150 python3 /tmp/late.py 4 $v > $OUT/late_$(basename $v)_$i.log 2>&1) & done
  wait
  echo "== $v"; cat $OUT/late_$(basename $v)_*.log | grep -E "^runs|^BAD" | cut -c1-400
done
mkdir -p $OUT/r1 $OUT/r2 && RES=/tmp/r1 OUT=$OUT/r1 DEADLINE_S=200 bash benchmarks/h200/run_all.sh env suite > /dev/null 2>&1; RES=/tmp/r2 OUT=$OUT/r2 DEADLINE_S=200 bash benchmarks/h200/run_all.sh suite > /dev/null 2>&1; grep -h -E "^FAILED|passed" /tmp/r1/suite.log /tmp/r2/suite.log | tail -6
