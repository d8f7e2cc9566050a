"""The call B A/B as one PNG: each variant's rows relabelled as its own "backend" (run from
this folder: python ../plot.py)."""
import json

from mccl.bench.report import write_png

rows, ceiling = [], None
for name in ("gloo", "new", "old", "new2"):
    for n in (4, 8):
        d = json.load(open(f"{name}-n{n}.json"))
        ceiling = ceiling or d["ceiling"]["bytes_per_s"]
        rows += [dict(r, backend=name) for r in d["rows"]]
write_png("ab.png", rows, ceiling, "call s57b: CUDA, 10 Gbit emulated hosts, new vs old vs gloo")
