#!/usr/bin/env bash
# Forty-third session, call E (carry .debs; run from the repository root), code of 602b4cb
# plus old_mesh.py (`git show 65d4815:mccl/transport/mesh.py > old_mesh.py`, untracked, so
# the device tool carries it): the late-rank case of tests/test_faults.py (3 ranks, group
# timeout 2 s, 1000 elements) 4 times in each of 8 processes at once, beside 8 busy loops,
# first with the mesh before the probe fix (/tmp/old), then with it. Only the "main" logs
# came back (at most 8 files); the old ones' lines are in results.txt, from the output tail.
cat > /tmp/late.py <<'PY'
import sys; sys.path.insert(0, sys.argv[2])
from mccl.bench.spawn import run_ranks
from tests.test_faults import _later_than_the_timeout
if __name__ == "__main__":
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
  for h in $(seq 8); do timeout 50 sh -c 'while :; do :; done' & done
  for i in $(seq 8); do (cd $v && timeout 120 python3 /tmp/late.py 4 $v > $OUT/late_$(basename $v)_$i.log 2>&1) & done
  wait
  echo "== $v"; cat $OUT/late_$(basename $v)_*.log | grep -E "^runs|^BAD|Error" | cut -c1-600
done
