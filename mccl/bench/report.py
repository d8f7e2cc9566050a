"""Benchmark output: size parsing/formatting, the nccl-tests style table, JSON and PNG.

Why separate from the runner: reports are re-generated from saved JSON (model, plots) and
must not need torch or a network.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import re
import socket
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SCHEMA = "mccl-bench/1"
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
               "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}
PNG_DPI = 120
PNG_SIZE_IN = (11.0, 8.5)
#: A cell whose slowest timed sample took this many times its fastest is flagged '~': some
#: samples stalled (a TCP retransmission timeout, a descheduled rank), so its median may
#: not be a rate (the H200's 8-host 4 MB reduce-scatter once read 3.0 to 13.8 ms).
STALL_SPREAD = 2.0


def parse_size(text: str | int) -> int:
    """'8', '8B', '1K', '64M', '1G' -> bytes (binary multiples, as nccl-tests)."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"bad size {text!r}: use e.g. 8, 1K, 16M, 1G")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def size_range(lo: int, hi: int, factor: float = 2.0, max_sizes: int | None = None
               ) -> list[int]:
    """Geometric sizes lo, lo*factor, ... <= hi (nccl-tests -b/-e/-f), each once.

    ``max_sizes``: refuse (ValueError) a range with more steps than this, counted before
    any is made, so a factor barely above 1 fails at once instead of listing millions."""
    if lo <= 0 or hi < lo or factor <= 1.0:
        raise ValueError("need 0 < min <= max and factor > 1")
    steps = math.floor(math.log(hi / lo) / math.log(factor) + 1e-9) + 1
    if max_sizes is not None and steps > max_sizes:
        raise ValueError(f"{format_size(lo)}..{format_size(hi)} by a factor of {factor:g} is "
                         f"{steps:,} sizes, over the limit of {max_sizes}; use a larger factor")
    out, s = [], float(lo)
    for _ in range(steps + 1):  # + 1: float rounding may leave one more at exactly hi
        if s > hi * (1 + 1e-9):
            break
        out.append(int(round(s)))
        s *= factor
    return list(dict.fromkeys(out))  # small sizes by a small factor round to the same bytes


def format_size(n: float) -> str:
    """Bytes -> short binary form ('64M', '1.5K', '8B'); a size just under a power of two
    keeps enough digits not to read as one (65520 -> '63.98K', not '64.0K')."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            v = n / scale
            if v == int(v):
                return f"{v:.0f}{unit}"
            for digits in (1, 2, 3):
                text = f"{v:.{digits}f}"
                if float(text) != round(v):  # does not read as a whole number
                    return f"{text}{unit}"
            break
    return f"{int(n)}B"


def plural(count: int, word: str) -> str:
    """'1 host', '2 hosts'."""
    return f"{count} {word}" + ("" if count == 1 else "s")


def machine_info() -> dict[str, Any]:
    """Enough about the box to interpret numbers later."""
    info: dict[str, Any] = {
        "hostname": socket.gethostname(), "platform": platform.platform(),
        "machine": platform.machine(), "processor": platform.processor(),
        "cpu_count": os.cpu_count(), "python": sys.version.split()[0],
    }
    try:
        import numpy
        import torch

        info.update(torch=torch.__version__, numpy=numpy.__version__)
    except ImportError:
        pass
    if sys.platform.startswith("linux"):
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
            info["kernel"] = platform.release()
        except OSError:
            pass
        if cc := default_cc():  # it shapes how a flow rides out reordering and loss
            info["tcp_congestion_control"] = cc
    return info


#: This machine's (or, read inside one, a network namespace's) TCP congestion control.
CC_PATH = "/proc/sys/net/ipv4/tcp_congestion_control"


def read_proc(path: str) -> str:
    """A /proc file's text, stripped; "" where it cannot be read (not Linux)."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def default_cc() -> str:
    """This machine's TCP congestion control ("" where it cannot be read)."""
    return read_proc(CC_PATH)


def pct_of(value_gbs: float | None, ceiling_bps: float | None) -> float | None:
    if value_gbs is None or not ceiling_bps:
        return None
    return 100.0 * value_gbs * 1e9 / ceiling_bps


def annotate(rows: Iterable[dict[str, Any]], ceiling_bps: float | None) -> None:
    """Add pct_ceiling (busbw as % of the single-stream ceiling) to each row in place."""
    for row in rows:
        row["pct_ceiling"] = pct_of(row.get("busbw_gbs"), ceiling_bps)


def _groups(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, int, str], list[dict[str, Any]]]:
    out: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault((row["op"], row["world_size"], row["dtype"]), []).append(row)
    return out


def format_table(rows: Sequence[dict[str, Any]], ceiling_bps: float | None,
                 backends: Sequence[str]) -> str:
    """One block per (op, world size): size/count/type, then per backend time/algbw/busbw/%,
    then the mccl/gloo busbw ratio when both ran."""
    lines = []
    ratio = "mccl" in backends and "gloo" in backends
    for (op, world, dtype), grp in _groups(rows).items():
        present = [b for b in backends if any(r["backend"] == b for r in grp)]
        queue = max(r.get("queue", 1) for r in grp)
        lines.append(f"# {op}  world_size={world}  dtype={dtype}"
                     + (f"  queue={queue} (times per op)" if queue > 1 else "")
                     + (f"  ceiling={ceiling_bps / 1e9:.3f} GB/s" if ceiling_bps else ""))
        head = f"{'size':>8} {'count':>11} {'type':>8}"
        sub = f"{'':>8} {'':>11} {'':>8}"
        for b in present:
            head += f" | {b:^34}"
            sub += f" | {'time(us)':>10} {'algbw':>7} {'busbw':>7} {'%ceil':>6}"
        if ratio and len(present) == 2:
            head += " | mccl/gloo"
            sub += " |   busbw x"
        lines += [head, sub]
        by_size: dict[int, dict[str, dict[str, Any]]] = {}
        for r in grp:
            by_size.setdefault(r["size"], {})[r["backend"]] = r
        for size in sorted(by_size):
            cells = by_size[size]
            any_row = next(iter(cells.values()))
            line = f"{format_size(size):>8} {any_row['count']:>11} {dtype:>8}"
            for b in present:
                r = cells.get(b)
                if r is None:
                    line += f" | {'-':>10} {'-':>7} {'-':>7} {'-':>6}"
                    continue
                pct = pct_of(r["busbw_gbs"], ceiling_bps)
                line += (f" | {r['time_us']:>10.1f} {r['algbw_gbs']:>7.3f} "
                         f"{r['busbw_gbs']:>7.3f} {(f'{pct:.1f}' if pct is not None else '-'):>6}")
                if r.get("check") is False:
                    line += "!"
                if stalled(r):
                    line += "~"
            if ratio and len(present) == 2:
                m, g = cells.get("mccl"), cells.get("gloo")
                if m and g and g["busbw_gbs"] > 0:
                    line += f" | {m['busbw_gbs'] / g['busbw_gbs']:>9.2f}"
                else:
                    line += f" | {'-':>9}"
            lines.append(line)
        lines.append("")
    lines.append("# algbw/busbw in GB/s (1e9 B/s); busbw = algbw x nccl-tests bus factor; "
                 "%ceil = busbw / single-stream TCP ceiling; '!' = result check failed; "
                 f"'~' = slowest sample over {STALL_SPREAD:g}x the fastest (a stall)")
    return "\n".join(lines)


def stalled(row: dict[str, Any]) -> bool:
    """Did some timed samples of this row stall (see ``STALL_SPREAD``)?"""
    lo, hi = row.get("min_us"), row.get("max_us")
    return bool(lo and hi and hi > STALL_SPREAD * lo)


def _tmp_sibling(path: Path) -> Path:
    return path.with_suffix(path.suffix + ".tmp")


def prepare_output(path: str | Path, flag: str) -> None:
    """Make sure a result file can be written at ``path`` before the run that fills it: the
    parent folders are made, and a probe file beside it is written and removed. Raises
    ValueError with one line naming ``flag`` (results measured for minutes and then lost to
    a typo in the path were the alternative)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag} {path}: is a directory; give a file name")
    for folder in path.parents:
        if folder.exists():
            if not folder.is_dir():
                raise ValueError(f"{flag} {path}: {folder} is a file, not a folder")
            break
    probe = _tmp_sibling(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"{flag} {path}: cannot write there ({exc.strerror or exc})") from None


def write_json(path: str | Path, doc: dict[str, Any]) -> None:
    """Write the result document (atomic rename so a crash never leaves half a file; the
    temporary file is removed if the write fails)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_sibling(path)
    try:
        tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        os.replace(tmp, path)
    finally:
        if tmp.is_file():
            tmp.unlink()


def load_json(path: str | Path) -> dict[str, Any]:
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a {SCHEMA} document")
    return doc


def new_document(argv: Sequence[str], config: dict[str, Any]) -> dict[str, Any]:
    """Skeleton of the JSON result (filled in as the run progresses)."""
    cmd = [sys.executable, "-m", "mccl.bench", *argv]
    return {"schema": SCHEMA, "command": " ".join(cmd), "argv": list(argv),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine_info(),
            "config": config, "network": None, "ceiling": None, "rows": [], "errors": [],
            "notes": [], "jobs": []}


def check_plot_path(path: str | Path, flag: str) -> None:
    """Refuse, before the run, a plot file whose extension matplotlib cannot write (the run
    went ahead and ended in a traceback). Without matplotlib there is nothing to check: the
    plot is skipped then, with a warning."""
    ext = Path(path).suffix.lower().lstrip(".")
    if not ext:
        return
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        return
    if ext not in FigureCanvasBase.get_supported_filetypes():
        raise ValueError(f"{flag} {path}: matplotlib cannot write .{ext} files (name a .png, "
                         ".svg or .pdf file)")


def plot_file(path: str | Path) -> Path:
    """The file matplotlib writes for ``path``: a name without an extension gets ``.png``
    (the tools said they wrote the name as given)."""
    path = Path(path)
    return path if path.suffix else path.with_name(path.name + ".png")


def write_png(path: str | Path, rows: Sequence[dict[str, Any]], ceiling_bps: float | None,
              title: str = "") -> Path | None:
    """busbw and time vs size (log2 x); one line per backend x op x world size.

    Returns the file written, or None (with one warning) if matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib not installed: skipping PNG %s (pip install matplotlib)", path)
        return None
    fig, (ax_bw, ax_t) = plt.subplots(2, 1, figsize=PNG_SIZE_IN, sharex=True)
    series: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in rows:
        series.setdefault((r["backend"], r["op"], r["world_size"]), []).append(r)
    styles = {"mccl": "-", "gloo": "--"}  # colour = op x world size, line style = backend
    keys = sorted({(op, world) for _, op, world in series})
    colours = {k: f"C{i % 10}" for i, k in enumerate(keys)}
    for (backend, op, world), pts in sorted(series.items()):
        pts = sorted(pts, key=lambda r: r["size"])
        xs = [r["size"] for r in pts]
        kw = dict(ls=styles.get(backend, ":"), color=colours[(op, world)], marker="o", ms=3,
                  label=f"{backend} {op} n={world}")
        ax_bw.plot(xs, [r["busbw_gbs"] for r in pts], **kw)
        ax_t.plot(xs, [r["time_us"] for r in pts], **kw)
    if ceiling_bps:
        ax_bw.axhline(ceiling_bps / 1e9, color="k", lw=1, alpha=0.6,
                      label=f"TCP ceiling {ceiling_bps / 1e9:.3f} GB/s")
    ax_bw.set_xscale("log", base=2)
    ax_bw.set_ylabel("busbw (GB/s)")
    ax_bw.grid(True, which="both", alpha=0.3)
    ax_bw.legend(fontsize=7, ncol=2)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time (us, median of slowest rank)")
    ax_t.set_xlabel("size (bytes)")
    ax_t.grid(True, which="both", alpha=0.3)
    ticks = sorted({r["size"] for r in rows})
    if ticks:
        ax_t.set_xticks(ticks)
        ax_t.set_xticklabels([format_size(s) for s in ticks], rotation=45, fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = plot_file(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=PNG_DPI)
    plt.close(fig)
    return out
