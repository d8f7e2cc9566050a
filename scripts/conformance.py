"""Run PyTorch's distributed conformance suite (``distributed_test._DistTestBase``) on mccl and
write a report.

    python scripts/conformance.py                      # every test in the suite
    python scripts/conformance.py -k 'all_reduce|ddp'  # a regex selection
    python scripts/conformance.py --world-sizes 3,4,8  # retry world-size skips at 4, 8

Each test forks its ranks from a child process per world size; the ranks' output goes to
``<out>/log-world<N>.txt`` so the terminal shows one line per test. Writes
``<out>/report.json`` and ``<out>/report.md`` (outcome and first failure line per test).
See docs/CONFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def _fd_redirect(path: Path):
    """Send fds 1 and 2 (and so the forked ranks' output) to ``path`` for the duration."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _first_line(detail: str) -> str:
    """The most telling line of a failure: the last exception line of the first traceback."""
    lines = [ln.strip() for ln in detail.splitlines() if ln.strip()]
    for ln in lines:
        if re.match(r"^[A-Za-z_.]*(Error|Exception|Timeout)\b.*:", ln):
            return ln[:300]
    return lines[-1][:300] if lines else ""


def run_world(names: list[str] | None, pattern: str, world: int, timeout: int, gated_only: bool,
              unlock_all: bool, out: Path) -> list[dict]:
    """Run the selected tests at one world size in this process (the suite reads WORLD_SIZE
    when it is imported, so one process serves one world size)."""
    os.environ["BACKEND"] = "mccl"
    os.environ["WORLD_SIZE"] = str(world)
    os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(timeout)
    if unlock_all or gated_only:
        os.environ["MCCL_CONFORMANCE_UNLOCK_ALL"] = "1"
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT))
    import conformance_suite as suite

    if not suite.AVAILABLE:
        raise SystemExit(f"cannot run the suite: {suite.IMPORT_ERROR}")
    pool = suite.NAME_GATED if gated_only else suite.ALL_TESTS
    selected = [n for n in pool if re.search(pattern, n) and (names is None or n in names)]
    log = out / f"log-world{world}.txt"
    log.write_text("")
    results = []
    for i, name in enumerate(selected, 1):
        t0 = time.monotonic()
        with _fd_redirect(log):
            print(f"===== {name}", flush=True)
            outcome, detail = suite.run_one(name)
            print(detail, flush=True)
        secs = time.monotonic() - t0
        reason = detail if outcome == "skipped" else _first_line(detail)
        results.append({"test": name, "outcome": outcome, "seconds": round(secs, 2),
                        "world": world, "unlocked": name in suite.UNLOCKED, "reason": reason})
        print(f"[world {world} {i}/{len(selected)}] {outcome:7s} {secs:5.1f}s {name}"
              + (f"  -- {reason[:110]}" if outcome != "passed" else ""), flush=True)
    return results


#: Skip reasons that a larger world size may lift.
_WORLD_SKIP = re.compile(r"world size|small world", re.I)


def merge(runs: list[list[dict]]) -> list[dict]:
    """One row per test: its first pass at any world size, else its last outcome."""
    by_name: dict[str, dict] = {}
    for rows in runs:
        for r in rows:
            prev = by_name.get(r["test"])
            if prev is None or prev["outcome"] != "passed":
                by_name[r["test"]] = r
    return [by_name[n] for n in sorted(by_name)]


def write_report(results: list[dict], worlds: list[int], seconds: float, out: Path) -> dict:
    import torch

    counts = {k: sum(r["outcome"] == k for r in results) for k in ("passed", "failed", "skipped")}
    summary = {"world_sizes": worlds, "torch": torch.__version__, "seconds": round(seconds, 1),
               "unlocked_passed": sum(r["unlocked"] and r["outcome"] == "passed"
                                      for r in results), **counts}
    (out / "report.json").write_text(json.dumps({"summary": summary, "tests": results},
                                                indent=1))
    md = [f"# mccl conformance report (torch {summary['torch']}, world sizes "
          f"{', '.join(map(str, worlds))})", "",
          f"{counts['passed']} passed ({summary['unlocked_passed']} of them unlocked: torch "
          f"skips them by backend name), {counts['failed']} failed, {counts['skipped']} skipped "
          f"in {summary['seconds']} s", "",
          "| test | outcome | world | s | reason |", "|---|---|---|---|---|"]
    for r in results:
        reason = r["reason"].replace("|", "\\|").replace("\n", " ")[:200]
        outcome = r["outcome"] + (" (unlocked)" if r["unlocked"] else "")
        md.append(f"| {r['test']} | {outcome} | {r['world']} | {r['seconds']} | {reason} |")
    (out / "report.md").write_text("\n".join(md) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", "--pattern", default="", help="regex over test names")
    ap.add_argument("--world-sizes", default="3",
                    help="comma-separated; after the first, only tests skipped for their world "
                    "size are retried (e.g. 3,4,8)")
    ap.add_argument("--timeout", type=int, default=90, help="seconds per test before its ranks "
                    "are killed")
    ap.add_argument("--out", default=str(ROOT / "build" / "conformance"))
    ap.add_argument("--gated-only", action="store_true",
                    help="run only the tests torch skips by backend name (implies --unlock-all)")
    ap.add_argument("--unlock-all", action="store_true",
                    help="also run every test torch skips by backend name (exploration)")
    ap.add_argument("--names", help=argparse.SUPPRESS)  # internal: file of names, one world
    ap.add_argument("--rows", help=argparse.SUPPRESS)  # internal: where to write the rows
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    worlds = [int(w) for w in args.world_sizes.split(",")]
    if args.rows:  # child mode: one world size, rows to a file
        names = json.loads(Path(args.names).read_text()) if args.names else None
        rows = run_world(names, args.pattern, worlds[0], args.timeout, args.gated_only,
                         args.unlock_all, out)
        Path(args.rows).write_text(json.dumps(rows))
        return 0
    t0 = time.monotonic()
    runs: list[list[dict]] = []
    names: list[str] | None = None
    for world in worlds:
        rows_file, names_file = out / f"rows-{world}.json", out / f"names-{world}.json"
        cmd = [sys.executable, __file__, "--world-sizes", str(world), "--timeout",
               str(args.timeout), "--out", str(out), "--rows", str(rows_file), "-k",
               args.pattern]
        if names is not None:
            names_file.write_text(json.dumps(names))
            cmd += ["--names", str(names_file)]
        cmd += ["--gated-only"] * args.gated_only + ["--unlock-all"] * args.unlock_all
        subprocess.run(cmd, check=True)
        runs.append(json.loads(rows_file.read_text()))
        names = [r["test"] for r in merge(runs)
                 if r["outcome"] == "skipped" and _WORLD_SKIP.search(r["reason"])]
        if not names:
            break
    results = merge(runs)
    s = write_report(results, worlds, time.monotonic() - t0, out)
    print(f"{s['passed']} passed ({s['unlocked_passed']} unlocked), {s['failed']} failed, "
          f"{s['skipped']} skipped -> {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
