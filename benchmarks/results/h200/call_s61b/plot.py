"""Call B's bench as one PNG (run from this folder: python plot.py): % of the 10 Gbit
ceiling per run at 1 MB, CUDA tensors, on 4 and 8 emulated hosts sharing one H100: blocking
ops copying on the caller's stream (new, the defaults) against the side stream (old,
MCCL_AB=caller_stream=0), alternated twice, with gloo from the same run."""
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OPS = ("all_gather", "reduce_scatter", "all_reduce")
RUNS = (("gloo", "tab:gray"), ("new", "tab:green"), ("old", "tab:red"),
        ("new2", "tab:green"), ("old2", "tab:red"))

fig, ax = plt.subplots(figsize=(11, 5))
x, ticks = 0, []
for n in (4, 8):
    for op in OPS:
        for name, color in RUNS:
            rows = json.load(open(f"ab/{name}-n{n}.json"))["rows"]
            pct = next(r["pct_ceiling"] for r in rows if r["op"] == op)
            first = (n, op) == (4, OPS[0]) and not name.endswith("2")
            ax.bar(x, pct, color=color, label=name if first else None)
            ax.text(x, pct + 1, f"{pct:.0f}", ha="center", fontsize=6)
            x += 1
        ticks.append((x - 3, f"{op.split('_')[1]}\n{n} hosts"))
        x += 1
ax.set_xticks([t for t, _ in ticks], [s for _, s in ticks], fontsize=8)
ax.set_ylabel("% of the 10 Gbit TCP ceiling (bench busbw)")
ax.set_title("call s61b (H100, torch 2.11), 1 MB, CUDA tensors: runs in order "
             "gloo / new / old / new2 / old2")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig("caller_stream.png", dpi=110)
