"""Call A's hand-off costs as one PNG: per op and world size, each variant's median phases
stacked (run from this folder: python plot.py)."""
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OPS = ("all_gather", "reduce_scatter", "all_reduce")
VARIANTS = ("staged", "side", "caller", "cpu")
PHASES = ("prepare", "acquire", "ring", "release", "gate", "sync")

fig, axes = plt.subplots(1, len(OPS), figsize=(15, 5), sharey=True)
for ax, op in zip(axes, OPS, strict=True):
    worlds = json.load(open(f"handoff_cost_{op}_1M.json"))["worlds"]
    labels, bottoms = [], None
    bars = [(w, v) for w in worlds for v in VARIANTS]
    labels = [f"{v}\nn={w}" for w, v in bars]
    bottom = [0.0] * len(bars)
    for phase in PHASES:
        vals = [worlds[w][v][phase]["median_us"] for w, v in bars]
        ax.bar(range(len(bars)), vals, bottom=bottom, label=phase)
        bottom = [b + x for b, x in zip(bottom, vals, strict=True)]
    ax.plot(range(len(bars)), [worlds[w][v]["slowest_rank_median_us"] for w, v in bars],
            "k_", markersize=14, label="slowest rank (median)")
    ax.set_xticks(range(len(bars)), labels, fontsize=7)
    ax.set_title(f"{op}, 1 MB, no network")
axes[0].set_ylabel("microseconds per op (medians)")
axes[0].legend(fontsize=8)
fig.suptitle("call s58a (H100, torch 2.11): a staged CUDA op's device half, 1/4/8 ranks on one GPU")
fig.tight_layout()
fig.savefig("handoff_cost.png", dpi=110)
