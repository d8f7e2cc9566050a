"""Alpha-beta model of mccl's all-reduce (ring or grid), fitted and extrapolated.

Why: we can emulate a handful of hosts, but the question is how a ring behaves at 24 or 200
hosts on 10 GbE. A ring all-reduce of S bytes on n hosts takes 2(n-1) steps, each moving
S/n bytes over one link:

    T(n, S) = 2(n-1) * alpha + 2(n-1)/n * S / B

alpha = per-hop latency (software + network, per step), B = achieved per-link bandwidth.
Both are fitted by least squares on relative error (so 1 KB and 256 MB points both count)
from measured all_reduce rows at several world sizes. For another link speed, B is scaled by
the efficiency measured here (B / single-stream ceiling), alpha is kept.

Where mccl runs a mid-sized all-reduce as a grid of rows x cols ranks (``grid.columns``) it
moves the same bytes in 2(cols - 1) + 2(rows - 1) steps; the predictions show that time
beside the ring's, with the same alpha per step (fitted to the measured points as rings).

``python -m mccl.bench.model results.json [--png model.png]``
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mccl.algorithms import base, grid
from mccl.bench.cli import CliError, at_least, int_items
from mccl.bench.cli import report as report_error
from mccl.bench.cluster import tcp_payload_ceiling
from mccl.bench.ops import bus_factor
from mccl.bench.report import check_plot_path, format_size, load_json, parse_size, plot_file

log = logging.getLogger(__name__)

DEFAULT_TARGET_HOSTS = (24, 200)
DEFAULT_LINK_BITS = 10e9  # 10 GbE
DEFAULT_PREDICT_SIZES = tuple(1 << k for k in (20, 22, 24, 26, 28))  # 1M .. 256M
MIN_POINTS = 2


@dataclass(frozen=True)
class Fit:
    """Fitted ring parameters: seconds per hop, bytes/s per link, fit quality."""

    alpha_s: float
    bandwidth_bps: float
    rms_rel_err: float
    points: int

    def time_s(self, n: int, size: float) -> float:
        return ring_time(n, size, self.alpha_s, self.bandwidth_bps)

    def busbw(self, n: int, size: float) -> float:
        return ring_busbw(n, size, self.alpha_s, self.bandwidth_bps)


def ring_time(n: int, size: float, alpha_s: float, bandwidth_bps: float) -> float:
    """Ring all-reduce time for `size` bytes on n hosts."""
    return 2 * (n - 1) * alpha_s + 2 * (n - 1) / n * size / bandwidth_bps


def allreduce_busbw(n: int, size: float, time_s: float) -> float:
    """nccl-tests busbw (bytes/s) of an all-reduce of ``size`` bytes on ``n`` ranks that took
    ``time_s``: algbw x 2(n-1)/n."""
    return size / time_s * bus_factor("all_reduce", n)


def ring_busbw(n: int, size: float, alpha_s: float, bandwidth_bps: float) -> float:
    """The busbw the model predicts for the ring."""
    return allreduce_busbw(n, size, ring_time(n, size, alpha_s, bandwidth_bps))


def mccl_steps(n: int, size: float) -> tuple[int, int | None]:
    """(steps, row length) of the all-reduce mccl runs for ``size`` bytes of float32 on n
    hosts with cores to spare: a grid where ``grid.columns`` picks one (row length), else
    the ring (None)."""
    cols = grid.columns(int(size) // 4, n, 4, base.MAX_CHUNK_BYTES)
    if cols is None:
        return 2 * (n - 1), None
    return 2 * (cols - 1) + 2 * (n // cols - 1), cols


def mccl_time(n: int, size: float, alpha_s: float, bandwidth_bps: float) -> float:
    """``ring_time`` with mccl's step count (a grid's where it runs one): the same bytes."""
    return mccl_steps(n, size)[0] * alpha_s + 2 * (n - 1) / n * size / bandwidth_bps


def mccl_busbw(n: int, size: float, alpha_s: float, bandwidth_bps: float) -> float:
    """``ring_busbw`` for the all-reduce mccl runs (``mccl_time``)."""
    return allreduce_busbw(n, size, mccl_time(n, size, alpha_s, bandwidth_bps))


def half_bandwidth_size(n: int, alpha_s: float, bandwidth_bps: float) -> float:
    """Size at which busbw reaches half of B (latency term == bandwidth term): n*alpha*B."""
    return n * alpha_s * bandwidth_bps


def fit_alpha_beta(points: Sequence[tuple[int, float, float]]) -> Fit:
    """Least-squares fit of (alpha, 1/B) to (n, size_bytes, time_s) points, relative error.

    Negative estimates (noise) are clamped to a tiny positive value and the other refitted.
    """
    pts = [(n, s, t) for n, s, t in points if n >= 2 and s > 0 and t > 0]
    if len(pts) < MIN_POINTS:
        raise ValueError(f"need at least {MIN_POINTS} all_reduce points with n >= 2")
    n = np.array([p[0] for p in pts], dtype=np.float64)
    s = np.array([p[1] for p in pts], dtype=np.float64)
    t = np.array([p[2] for p in pts], dtype=np.float64)
    x = np.stack([2 * (n - 1), 2 * (n - 1) / n * s], axis=1) / t[:, None]
    if np.linalg.matrix_rank(x) < 2:  # one size on one world size: any split fits
        raise ValueError("the points cannot tell per-hop latency from bandwidth: give "
                         "all_reduce points at two or more sizes")
    y = np.ones_like(t)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    alpha, beta = float(coef[0]), float(coef[1])
    if beta <= 0:  # an infinite bandwidth would fit: nothing to predict a link from
        raise ValueError("the points show no bandwidth term (times do not grow with the "
                         "size): give all_reduce points large enough to be link-bound, "
                         "e.g. 1M and up")
    if alpha <= 0:
        alpha = 1e-9
        beta = float(np.linalg.lstsq(x[:, 1:], y - x[:, 0] * alpha, rcond=None)[0][0])
    model = x @ np.array([alpha, beta])
    rms = float(np.sqrt(np.mean((model - 1.0) ** 2)))
    return Fit(alpha_s=alpha, bandwidth_bps=1.0 / beta, rms_rel_err=rms, points=len(pts))


#: The fields of a bench row the model reads, and their types.
ROW_FIELDS = {"op": str, "backend": str, "world_size": int, "size": (int, float),
              "time_us": (int, float)}


def check_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The document's rows, each with the fields the model reads; ValueError naming the first
    row and field that is missing or of the wrong type."""
    rows = doc.get("rows", [])
    if not isinstance(rows, list):
        raise ValueError(f"'rows' is a {type(rows).__name__}, not a list of rows")
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise ValueError(f"row {i} is a {type(r).__name__}, not an object")
        for name, kind in ROW_FIELDS.items():
            v = r.get(name)
            if not isinstance(v, kind) or isinstance(v, bool):
                raise ValueError(f"row {i}: field {name!r} is "
                                 f"{'missing' if v is None else repr(v)}")
    return rows


def allreduce_points(doc: dict[str, Any], backend: str,
                     min_size: int = 0) -> list[tuple[int, float, float]]:
    """(n, size, time_s) of one backend's all_reduce rows in a bench JSON document."""
    return [(int(r["world_size"]), float(r["size"]), float(r["time_us"]) * 1e-6)
            for r in check_rows(doc)
            if r["op"] == "all_reduce" and r["backend"] == backend and r["size"] >= min_size]


def project(fit: Fit, ceiling_bps: float | None, link_bits: float,
            mtu: int = 1500) -> tuple[float, float]:
    """(bandwidth on the target link, efficiency used): B scaled by B/ceiling measured here."""
    eff = min(fit.bandwidth_bps / ceiling_bps, 1.0) if ceiling_bps else 1.0
    return eff * tcp_payload_ceiling(int(link_bits), mtu), eff


def report(doc: dict[str, Any], backend: str, fit: Fit, hosts: Sequence[int],
           link_bits: float, sizes: Sequence[int], min_size: int = 0) -> str:
    """Measured-vs-model table, then predictions for the target host counts."""
    ceiling = (doc.get("ceiling") or {}).get("bytes_per_s")
    out = [f"alpha-beta fit of {backend} all_reduce ({fit.points} points): "
           f"alpha = {fit.alpha_s * 1e6:.1f} us/hop, B = {fit.bandwidth_bps / 1e9:.4f} GB/s"
           + (f" ({100 * fit.bandwidth_bps / ceiling:.1f}% of the measured ceiling "
              f"{ceiling / 1e9:.4f} GB/s)" if ceiling else "")
           + f", rms rel. error {100 * fit.rms_rel_err:.1f}%", "",
           f"{'n':>4} {'size':>7} {'measured us':>12} {'model us':>12} {'meas busbw':>11} "
           f"{'model busbw':>12} {'err%':>6}"]
    for n, s, t in sorted(allreduce_points(doc, backend, min_size)):
        mt = fit.time_s(n, s)
        meas_bw = allreduce_busbw(n, s, t)
        out.append(f"{n:>4} {format_size(s):>7} {t * 1e6:>12.1f} {mt * 1e6:>12.1f} "
                   f"{meas_bw / 1e9:>11.4f} {fit.busbw(n, s) / 1e9:>12.4f} "
                   f"{100 * (mt - t) / t:>+6.1f}")
    bw, eff = project(fit, ceiling, link_bits)
    out += ["", f"prediction on {link_bits / 1e9:g} GbE links: B = {bw / 1e9:.4f} GB/s "
            f"(TCP payload max x efficiency {eff:.3f} measured here), "
            f"alpha = {fit.alpha_s * 1e6:.1f} us/hop",
            f"{'hosts':>5} {'size':>7} {'time ms':>10} {'busbw GB/s':>11} {'% of B':>7}"
            f"  {'mccl runs':>12} {'time ms':>8} {'% of B':>7}"]
    for n in hosts:
        for s in sizes:
            t = ring_time(n, s, fit.alpha_s, bw)
            b = ring_busbw(n, s, fit.alpha_s, bw)
            cols = mccl_steps(n, s)[1]
            shape = f"grid {n // cols}x{cols}" if cols else "the ring"
            tm = mccl_time(n, s, fit.alpha_s, bw)
            bm = mccl_busbw(n, s, fit.alpha_s, bw)
            out.append(f"{n:>5} {format_size(s):>7} {t * 1e3:>10.2f} {b / 1e9:>11.4f} "
                       f"{100 * b / bw:>6.1f}%  {shape:>12} {tm * 1e3:>8.2f} "
                       f"{100 * bm / bw:>6.1f}%")
        out.append(f"{n:>5} half of B needs {format_size(half_bandwidth_size(n, fit.alpha_s, bw))}"
                   f"; 90% needs {format_size(9 * half_bandwidth_size(n, fit.alpha_s, bw))}")
    out.append("(assumes alpha does not grow with n and the ring stays link-bound, i.e. CPU "
               "keeps up at the target link speed)")
    return "\n".join(out)


def write_png(path: str, doc: dict[str, Any], backend: str, fit: Fit, hosts: Sequence[int],
              link_bits: float) -> Path | None:
    """Measured busbw points, model curves for measured n, and the target-host predictions;
    returns the file written (None without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib not installed: skipping PNG %s", path)
        return None
    pts = allreduce_points(doc, backend)
    ceiling = (doc.get("ceiling") or {}).get("bytes_per_s")
    fig, (ax_m, ax_p) = plt.subplots(1, 2, figsize=(13, 5))
    sizes = np.logspace(3, 29, 200, base=2.0)
    for i, n in enumerate(sorted({p[0] for p in pts})):
        mine = sorted(p for p in pts if p[0] == n)
        ax_m.plot([p[1] for p in mine], [allreduce_busbw(n, p[1], p[2]) / 1e9 for p in mine],
                  "o", color=f"C{i}", label=f"measured n={n}")
        ax_m.plot(sizes, [fit.busbw(n, s) / 1e9 for s in sizes], "-", color=f"C{i}",
                  label=f"model n={n}")
    if ceiling:
        ax_m.axhline(ceiling / 1e9, color="k", lw=1, alpha=0.5, label="TCP ceiling")
    ax_m.set_title(f"{backend} all_reduce: measured vs alpha-beta "
                   f"(alpha={fit.alpha_s * 1e6:.0f}us)")
    bw, _ = project(fit, ceiling, link_bits)
    for i, n in enumerate(hosts):
        ax_p.plot(sizes, [ring_busbw(n, s, fit.alpha_s, bw) / 1e9 for s in sizes],
                  color=f"C{i}", label=f"{n} hosts, ring")
        ax_p.plot(sizes, [mccl_busbw(n, s, fit.alpha_s, bw) / 1e9 for s in sizes], "--",
                  color=f"C{i}",
                  label=f"{n} hosts, grid where mccl runs one")
    ax_p.axhline(bw / 1e9, color="k", lw=1, alpha=0.5, label="B on target link")
    ax_p.set_title(f"predicted busbw on {link_bits / 1e9:g} GbE")
    for ax in (ax_m, ax_p):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    out = plot_file(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry: 0 = fitted and predicted, 2 = bad flags or a file the model cannot use."""
    p = argparse.ArgumentParser(prog="python -m mccl.bench.model",
                                description="Fit alpha-beta to all_reduce results; extrapolate.")
    p.add_argument("results", help="JSON written by python -m mccl.bench --json")
    p.add_argument("--backend", default=None, help="default: mccl if present, else the first")
    p.add_argument("--hosts", default=",".join(map(str, DEFAULT_TARGET_HOSTS)),
                   help="host counts to predict, comma list of integers >= 2")
    p.add_argument("--link-gbit", type=at_least(0.0, float, strict=True),
                   default=DEFAULT_LINK_BITS / 1e9)
    p.add_argument("--min-size", default="0", help="ignore smaller all_reduce points")
    p.add_argument("--png", default=None, metavar="PATH")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        hosts = int_items(args.hosts, "--hosts", minimum=2)
        try:
            min_size = parse_size(args.min_size)
        except ValueError as exc:
            raise CliError(f"error: --min-size: {exc}") from None
        try:
            if args.png is not None:
                check_plot_path(args.png, "--png")
        except ValueError as exc:  # the message names the flag
            raise CliError(f"error: {exc}") from None
        try:
            doc = load_json(args.results)
        except (OSError, ValueError) as exc:  # missing, unreadable, not JSON, not a result
            raise CliError(f"error: cannot read {args.results}: "
                           f"{getattr(exc, 'strerror', None) or exc}") from None
        backends = sorted({r["backend"] for r in check_rows(doc) if r["op"] == "all_reduce"})
        if not backends:
            raise CliError(f"error: {args.results}: no all_reduce rows")
        if args.backend is not None and args.backend not in backends:
            raise CliError(f"error: {args.results}: no all_reduce rows of backend "
                           f"{args.backend!r} (there are: {', '.join(backends)})")
        backend = args.backend or ("mccl" if "mccl" in backends else backends[0])
        fit = fit_alpha_beta(allreduce_points(doc, backend, min_size))
    except CliError as exc:
        return report_error(exc)
    except ValueError as exc:
        print(f"error: {args.results}: {exc}", file=sys.stderr)
        return 2
    link = args.link_gbit * 1e9
    print(report(doc, backend, fit, hosts, link, DEFAULT_PREDICT_SIZES, min_size))
    if args.png:
        written = write_png(args.png, doc, backend, fit, hosts, link)
        if written is not None:
            print(f"wrote {written}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
