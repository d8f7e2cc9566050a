"""Call C's bench as one PNG (run from this folder: python plot.py): % of the 10 Gbit
ceiling against size, 4 to 256 MB, CUDA tensors, 4 and 8 emulated hosts sharing one H100:
blocking ops copying on the caller's stream (new, new2: the defaults) against the side stream
(old: MCCL_AB=caller_stream=0), with gloo from the same run."""
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OPS = ("all_gather", "reduce_scatter", "all_reduce")
STYLE = {"new": ("tab:green", "-"), "new2": ("tab:olive", "-"), "old": ("tab:red", "--"),
         "gloo": ("tab:gray", ":")}

fig, axes = plt.subplots(2, 3, figsize=(14, 7.5), sharey=True)
for row, n in enumerate((4, 8)):
    for col, op in enumerate(OPS):
        ax = axes[row][col]
        for name, (color, line) in STYLE.items():
            rows = [r for r in json.load(open(f"ab/{name}-n{n}.json"))["rows"] if r["op"] == op]
            ax.plot([r["size"] >> 20 for r in rows], [r["pct_ceiling"] for r in rows],
                    line, marker="o", color=color, label=name)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{op}, {n} hosts", fontsize=10)
        ax.set_xlabel("MB")
        ax.grid(alpha=0.3)
    axes[row][0].set_ylabel("% of the 10 Gbit TCP ceiling")
axes[0][0].legend(fontsize=8)
fig.suptitle("call s61c (H100, torch 2.11), CUDA tensors: caller's-stream copies (new) "
             "against the side stream (old), gloo in the same run")
fig.tight_layout()
fig.savefig("caller_stream_large.png", dpi=100)
