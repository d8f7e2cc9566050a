"""Call A as one PNG (run from this folder: python plot.py): left, the device half of a 1 MB
op without the network (medians per op; the bar is the whole op, the tick the slowest rank),
side-stream hand-off (staged) against caller's-stream (direct), 1/4/8 ranks on one GPU;
right, the bench's % of the 10 Gbit ceiling per run, new (caller's stream) against old
(MCCL_AB=caller_stream=0), with gloo."""
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OPS = ("all_gather", "reduce_scatter", "all_reduce")


def label(ax, ticks, ylabel, title):
    ax.set_xticks([t for t, _ in ticks], [s for _, s in ticks], fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)


fig, (left, right) = plt.subplots(1, 2, figsize=(15, 5.5))
x, ticks = 0, []
for op in OPS:
    worlds = json.load(open(f"handoff_cost_{op}_1M.json"))["worlds"]
    for w in worlds:
        for v, color in (("staged", "tab:red"), ("direct", "tab:green"),
                         ("caller", "tab:gray")):
            cell = worlds[w][v]
            total = sum(cell[p]["median_us"] for p in
                        ("prepare", "acquire", "ring", "release", "gate", "sync"))
            left.bar(x, total, color=color, label=v if x < 3 else None)
            left.plot(x, cell["slowest_rank_median_us"], "k_", markersize=10)
            x += 1
        ticks.append((x - 2, f"{op.split('_')[1]}\nn={w}"))
        x += 1
label(left, ticks, "us per 1 MB op (median; tick: slowest rank)",
      "device half alone (handoff_cost.py)")

colors = {"new": "tab:green", "new2": "tab:green", "old": "tab:red", "old2": "tab:red",
          "gloo": "tab:gray"}
x, ticks = 0, []
for n in (4, 8):
    for op in OPS:
        for name in ("gloo", "new", "old", "new2", "old2"):
            rows = json.load(open(f"ab/{name}-n{n}.json"))["rows"]
            pct = next(r["pct_ceiling"] for r in rows if r["op"] == op)
            right.bar(x, pct, color=colors[name],
                      label=name.rstrip("2") if (n, op) == (4, OPS[0]) and "2" not in name
                      else None)
            x += 1
        ticks.append((x - 3, f"{op.split('_')[1]}\n{n} hosts"))
        x += 1
label(right, ticks, "% of the 10 Gbit TCP ceiling (bench busbw)",
      "bench, 1 MB, CUDA tensors, runs in order gloo/new/old/new2/old2")
fig.suptitle("call s60a (H100, torch 2.11): blocking CUDA ops copying on the caller's stream")
fig.tight_layout()
fig.savefig("caller_stream.png", dpi=110)
