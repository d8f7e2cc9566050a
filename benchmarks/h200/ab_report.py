"""Table and plot of an A/B run (benchmarks/h200/ab.sh): % of the ceiling per size, one line
per variant, one panel per op and world size (``--field cpu_cores``: the cores each rank
kept busy instead, where the bench recorded them).

    python benchmarks/h200/ab_report.py DIR --png ab.png > ab.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mccl.bench.report import format_size  # noqa: E402

#: (op, variant, world) -> size in bytes -> % of the ceiling (or the field asked for)
Data = dict[tuple[str, str, int], dict[int, float]]
FIELDS = ("pct_ceiling", "cpu_cores", "cpu_us")


def load(folder: Path, field: str = "pct_ceiling") -> Data:
    """Rows of the NAME-nN.json bench files, kept apart by op (a run may bench several) and
    by backend: a file that benched gloo beside mccl gives gloo's rows as "gloo NAME"."""
    out: Data = {}
    for path in sorted(folder.glob("*-n*.json")):
        name, world = path.stem.rsplit("-n", 1)
        doc = json.loads(path.read_text())
        for r in doc["rows"]:
            backend = r.get("backend", "mccl")
            label = name if backend in ("mccl", name) else f"{backend} {name}"
            if r.get(field) is not None:
                out.setdefault((r["op"], label, int(world)), {})[r["size"]] = r[field]
    return out


def table(data: Data, decimals: int = 1) -> str:
    sizes = sorted({s for v in data.values() for s in v})
    head = "| op | variant | ranks | " + " | ".join(format_size(s) for s in sizes) + " |"
    lines = [head, "|" + "---|" * (len(sizes) + 3)]
    for (op, name, world), pct in sorted(data.items(), key=lambda kv: (kv[0][0], kv[0][2],
                                                                       kv[0][1])):
        cells = " | ".join(f"{pct[s]:.{decimals}f}" if s in pct else "" for s in sizes)
        lines.append(f"| {op} | {name} | {world} | {cells} |")
    return "\n".join(lines)


def plot(data: Data, png: Path, field: str = "pct_ceiling") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = sorted({op for op, _, _ in data})
    worlds = sorted({w for _, _, w in data})
    fig, axes = plt.subplots(len(ops), len(worlds), figsize=(6 * len(worlds), 4 * len(ops)),
                             squeeze=False)
    for row, op in zip(axes, ops, strict=True):
        for ax, world in zip(row, worlds, strict=True):
            ticks: set[int] = set()
            for (o, name, w), pct in sorted(data.items()):
                if (o, w) == (op, world):
                    xs = sorted(pct)
                    ticks.update(xs)
                    style = ("k--" if name == "gloo" else "--x" if name.startswith("gloo")
                             else "-o")
                    ax.plot(xs, [pct[x] for x in xs], style, label=name)
            if field == "pct_ceiling":
                ax.axhline(100, color="grey", lw=0.5)
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(ticks), [format_size(t) for t in sorted(ticks)])
            ax.set_xlabel(f"{op} size")
            ax.set_ylabel({"pct_ceiling": "busbw, % of single-stream ceiling",
                           "cpu_cores": "cores busy per rank",
                           "cpu_us": "CPU us per op per rank"}[field])
            ax.set_title(f"{op}, {world} hosts")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--png", type=Path)
    ap.add_argument("--field", choices=FIELDS, default="pct_ceiling")
    args = ap.parse_args()
    data = load(args.folder, args.field)
    if not data:
        print(f"no NAME-nN.json bench files in {args.folder}", file=sys.stderr)
        return 1
    print(table(data, 2 if args.field == "cpu_cores" else 1))
    if args.png:
        plot(data, args.png, args.field)
    return 0


if __name__ == "__main__":
    sys.exit(main())
