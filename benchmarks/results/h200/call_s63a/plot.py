"""Call A's handoff_cost runs as one PNG (run from this folder: python plot.py): the device
half of a 1 MB all-gather alone (no network), median microseconds per op by path, this
library (rec) against a copy whose caller-stream hand-off skips record_stream (norec), two
alternated passes each, 1 and 4 ranks sharing one H100."""
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PATHS = ("staged", "direct", "side", "caller")
RUNS = ("rec_1", "norec_1", "rec_2", "norec_2")
COLOR = {"rec_1": "tab:green", "rec_2": "tab:olive", "norec_1": "tab:red", "norec_2": "tab:pink"}

fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharey="row")
for col, world in enumerate(("1", "4")):
    for row, (what, value) in enumerate((
            ("total: median us per op", lambda p: p["total_median_us"]),
            ("prepare phase: median us", lambda p: p["prepare"]["median_us"]))):
        ax, width = axes[row][col], 0.2
        for i, run in enumerate(RUNS):
            paths = json.load(open(f"hc_{run}.json"))["worlds"][world]
            ax.bar([p + (i - 1.5) * width for p in range(len(PATHS))],
                   [value(paths[k]) for k in PATHS], width, color=COLOR[run], label=run)
        ax.set_xticks(range(len(PATHS)), PATHS)
        ax.set_title(f"{world} rank(s), {what}", fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        axes[row][0].set_ylabel("us")
axes[0][0].legend(fontsize=8)
fig.suptitle("call s63a (H100, torch 2.11): record_stream on the caller's stream (rec) "
             "against none (norec); only 'direct' runs it")
fig.tight_layout()
fig.savefig("record_stream.png", dpi=100)
