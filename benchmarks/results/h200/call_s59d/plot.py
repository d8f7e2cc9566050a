"""Calls s59a-d as one PNG: every run of the all-gather's copy back by segment ("new")
against whole ("old", MCCL_AB=flat_seg_min=4194304) in the cells the change touched, % of
the link's ceiling (run from this folder: python plot.py)."""
import glob
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

#: (call folder, label, hosts, op, size): the cells where "new" and "old" differ. Call A's
#: "new" also copied the reduce-scatter's input out by segment (dropped after it).
CELLS = [("call_s59a", "A, H100", 4, "all_gather", 1 << 20),
         ("call_s59a", "A, H100", 4, "reduce_scatter", 1 << 20),
         ("call_s59a", "A, H100", 8, "all_gather", 4 << 20),
         ("call_s59b", "B, H100", 4, "all_gather", 1 << 20),
         ("call_s59b", "B, H100", 8, "all_gather", 4 << 20),
         ("call_s59c", "C, H100", 4, "all_gather", 1 << 20),
         ("call_s59c", "C, H100", 8, "all_gather", 4 << 20),
         ("call_s59d", "D, H200", 4, "all_gather", 1 << 20),
         ("call_s59d", "D, H200", 8, "all_gather", 4 << 20)]


def runs(folder: str, hosts: int, op: str, size: int) -> dict[str, list[float]]:
    """% of ceiling of every new*/old* run of that cell."""
    got: dict[str, list[float]] = {"new": [], "old": []}
    for path in sorted(glob.glob(f"../{folder}/ab*/*-n{hosts}.json")):
        variant = os.path.basename(path).split("-n")[0].rstrip("0123456789")
        if variant not in got:
            continue
        for row in json.load(open(path))["rows"]:
            if row["op"] == op and row["size"] == size:
                got[variant].append(row["pct_ceiling"])
    return got


fig, ax = plt.subplots(figsize=(13, 5))
labels = []
for i, (folder, call, hosts, op, size) in enumerate(CELLS):
    got = runs(folder, hosts, op, size)
    for dx, (variant, color) in ((-0.12, ("new", "tab:blue")), (0.12, ("old", "tab:orange"))):
        vals = got[variant]
        ax.plot([i + dx] * len(vals), vals, "o", color=color, alpha=0.8,
                label=variant if i == 0 else None)
    labels.append(f"{call}\n{hosts} hosts\n{op.replace('_', '-')} {size >> 20} MB")
ax.set_xticks(range(len(CELLS)), labels, fontsize=7)
ax.set_ylabel("% of the TCP ceiling (mccl, CUDA tensors)")
ax.set_ylim(0, 105)
ax.legend(title="staged copy back", loc="lower left")
ax.set_title("fifty-ninth session: by segment (new) vs whole (old), emulated 10 Gbit hosts "
             "sharing one GPU, each dot one bench run")
fig.tight_layout()
fig.savefig("segment_copy_back.png", dpi=110)
