"""All-reduce % of the ceiling against the emulated links' tbf bucket, mccl beside gloo.

    python benchmarks/bucket_sweep.py --run 1250K=DIR --run 512K=DIR ... --json OUT.json \
        --png OUT.png

Each DIR is one `BURST=... benchmarks/h200/ab.sh base:` result folder (``gloo-n<N>.json`` and
``base-n<N>.json`` bench outputs); a bucket may be given twice (repeat runs are averaged in the
plot and all kept in the JSON). Why it matters: a tbf bucket lets a link that idled send what
it missed at veth speed afterwards, which a switch port cannot do, so the bucket decides how
much of a backend's idle time on the wire the emulation forgives.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mccl.bench.report import format_size, parse_size  # noqa: E402

BACKEND_FILES = {"mccl": "base-n{n}.json", "gloo": "gloo-n{n}.json"}


def collect(runs: list[tuple[int, Path]]) -> list[dict]:
    """One row per (bucket, run folder, backend, world, size): the bench's % of the ceiling."""
    rows = []
    for bucket, folder in runs:
        for backend, pattern in BACKEND_FILES.items():
            for path in sorted(folder.glob(pattern.format(n="*"))):
                doc = json.loads(path.read_text())
                for r in doc["rows"]:
                    if r.get("op") == "all_reduce" and r.get("pct_ceiling") is not None:
                        rows.append({"bucket": bucket, "run": str(folder), "backend": backend,
                                     "world": r["world_size"], "size": r["size"],
                                     "pct_ceiling": round(r["pct_ceiling"], 2),
                                     "ceiling_Bps": (doc.get("ceiling") or {}).get(
                                         "bytes_per_s")})
    return rows


def plot(rows: list[dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worlds = sorted({r["world"] for r in rows})
    sizes = sorted({r["size"] for r in rows})
    fig, axes = plt.subplots(1, len(worlds), figsize=(5.5 * len(worlds), 4.2), squeeze=False)
    for ax, n in zip(axes[0], worlds, strict=True):
        for i, size in enumerate(sizes):
            for backend, style in (("mccl", "-o"), ("gloo", "--s")):
                pts: dict[int, list[float]] = {}
                for r in rows:
                    if (r["world"], r["size"], r["backend"]) == (n, size, backend):
                        pts.setdefault(r["bucket"], []).append(r["pct_ceiling"])
                xs = sorted(pts)
                ax.plot([x / 1024 for x in xs], [statistics.mean(pts[x]) for x in xs], style,
                        color=f"C{i}", label=f"{backend} {format_size(size)}")
        ax.set_xscale("log")
        ax.set_xlabel("tbf bucket (KiB)")
        ax.set_ylabel("all_reduce busbw, % of single-stream ceiling")
        ax.set_title(f"{n} hosts, 10 Gbit links")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="append", required=True, metavar="BUCKET=DIR")
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--png", type=Path)
    args = ap.parse_args()
    runs = []
    for spec in args.run:
        bucket, _, folder = spec.partition("=")
        runs.append((parse_size(bucket), Path(folder)))
    rows = collect(runs)
    if not rows:
        print("no all_reduce rows found in the given folders", file=sys.stderr)
        return 1
    args.json.write_text(json.dumps({"command": sys.argv, "rows": rows}, indent=1))
    if args.png:
        plot(rows, args.png)
    for r in rows:
        print(f"{r['bucket'] >> 10:6d}K n={r['world']} {format_size(r['size']):>5s} "
              f"{r['backend']:4s} {r['pct_ceiling']:6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
