"""Table and plot of an A/B run (benchmarks/h200/ab.sh): % of the ceiling per size, one line
per variant, one panel per world size.

    python benchmarks/h200/ab_report.py DIR --png ab.png > ab.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load(folder: Path) -> dict[tuple[str, int], dict[int, float]]:
    """(variant, world) -> size -> % of ceiling, from the NAME-nN.json bench files."""
    out: dict[tuple[str, int], dict[int, float]] = {}
    for path in sorted(folder.glob("*-n*.json")):
        name, world = path.stem.rsplit("-n", 1)
        doc = json.loads(path.read_text())
        out[(name, int(world))] = {r["size"]: r["pct_ceiling"] for r in doc["rows"]
                                   if r.get("pct_ceiling") is not None}
    return out


def table(data: dict[tuple[str, int], dict[int, float]]) -> str:
    sizes = sorted({s for v in data.values() for s in v})
    head = "| variant | ranks | " + " | ".join(f"{s >> 20} MB" for s in sizes) + " |"
    lines = [head, "|" + "---|" * (len(sizes) + 2)]
    for (name, world), pct in sorted(data.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        cells = " | ".join(f"{pct[s]:.1f}" if s in pct else "" for s in sizes)
        lines.append(f"| {name} | {world} | {cells} |")
    return "\n".join(lines)


def plot(data: dict[tuple[str, int], dict[int, float]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worlds = sorted({w for _, w in data})
    fig, axes = plt.subplots(1, len(worlds), figsize=(6 * len(worlds), 4), squeeze=False)
    for ax, world in zip(axes[0], worlds, strict=True):
        for (name, w), pct in sorted(data.items()):
            if w == world:
                xs = sorted(pct)
                style = "k--" if name == "gloo" else "-o"
                ax.plot([x >> 20 for x in xs], [pct[x] for x in xs], style, label=name)
        ax.axhline(100, color="grey", lw=0.5)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("all_reduce size (MB)")
        ax.set_ylabel("busbw, % of single-stream ceiling")
        ax.set_title(f"{world} hosts, 10 Gbit/s")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--png", type=Path)
    args = ap.parse_args()
    data = load(args.folder)
    if not data:
        print(f"no NAME-nN.json bench files in {args.folder}", file=sys.stderr)
        return 1
    print(table(data))
    if args.png:
        plot(data, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
