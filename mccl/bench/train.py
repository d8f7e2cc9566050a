"""Launch examples/train_ddp.py on N local ranks (or emulated hosts) without torchrun.

Why: the README's demo should be one command on a laptop, and a hung backend must not hang
it, so every rank runs in its own session and the set is killed after a deadline.

    python -m mccl.bench.train --world-size 2 [--backend gloo] [--cluster --rate 1gbit]
        [-- --steps 40 --hidden 512 ...]   # anything after -- goes to the training script
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mccl.bench.cli import (
    INTERRUPTED,
    CliError,
    at_least,
    check_backends,
    interrupt_on_sigterm,
    local_ranks,
    report,
    start_cluster,
)
from mccl.bench.cluster import DEFAULT_PREFIX, Cluster, kill_tree
from mccl.bench.runner import LOOPBACK, LOOPBACK_IFNAME, REPO_ROOT, free_port

log = logging.getLogger(__name__)

DEFAULT_SCRIPT = REPO_ROOT / "examples" / "train_ddp.py"
DEFAULT_TIMEOUT_S = 300.0
POLL_S = 0.2
#: What examples/train_ddp.py can train with: its model and batches stay on the CPU.
TRAIN_BACKENDS = ("mccl", "gloo")


def launch(world: int, backend: str, script_args: Sequence[str], script: Path = DEFAULT_SCRIPT,
           timeout: float = DEFAULT_TIMEOUT_S, cluster: Cluster | None = None) -> int:
    """Run the script on `world` ranks; rank 0's output passes through, others go to stderr
    only on failure. Returns the first non-zero exit code (124 on timeout)."""
    if not script.exists():
        raise FileNotFoundError(f"{script} not found (run from a checkout, or pass --script)")
    master = cluster.addr(0) if cluster else LOOPBACK
    pypath = os.environ.get("PYTHONPATH", "")
    env = dict(os.environ, MASTER_ADDR=master, MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
               PYTHONPATH=str(REPO_ROOT) + (os.pathsep + pypath if pypath else ""),
               GLOO_SOCKET_IFNAME=cluster.iface if cluster else LOOPBACK_IFNAME)
    if cluster:
        env["MCCL_SOCKET_IFNAME"] = cluster.iface
    argv = [sys.executable, str(script), "--backend", backend, *script_args]
    procs: list[subprocess.Popen[Any]] = []
    try:
        for rank in range(world):
            renv = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
            out = None if rank == 0 else subprocess.PIPE
            kw: dict[str, Any] = dict(stdout=out, stderr=out, text=True)
            if cluster:
                procs.append(cluster.popen(rank % cluster.n_hosts, argv, env=renv, **kw))
            else:
                procs.append(subprocess.Popen(argv, env=renv, start_new_session=True, **kw))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes) or all(c == 0 for c in codes):
                break
            time.sleep(POLL_S)
        else:
            log.error("training did not finish within %gs; killing ranks", timeout)
            return 124
        bad = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode not in (None, 0)]
        if bad:
            time.sleep(1.0)  # let the others notice and print their errors
            for r, p in enumerate(procs):
                if r and p.poll() is not None and p.returncode != 0 and p.stdout:
                    sys.stderr.write(f"--- rank {r} (exit {p.returncode}) ---\n"
                                     + p.stdout.read()[-2000:] + p.stderr.read()[-2000:])
            log.error("rank %d exited with code %d", *bad[0])
            return bad[0][1]
        return 0
    finally:
        for p in procs:
            kill_tree(p)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mccl.bench.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-size", type=local_ranks(1), default=2)
    p.add_argument("--backend", default="mccl",
                   help=f"{' or '.join(TRAIN_BACKENDS)} for the default script (it trains on "
                        "the CPU); any available backend for --script")
    p.add_argument("--script", type=Path, default=DEFAULT_SCRIPT)
    p.add_argument("--timeout", type=at_least(0.0, float, strict=True),
                   default=DEFAULT_TIMEOUT_S, help="seconds before the ranks are killed")
    p.add_argument("--cluster", action="store_true", help="one rank per emulated host")
    p.add_argument("--rate", default="1gbit", help="cluster link rate (e.g. 10gbit, none)")
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help="cluster namespace prefix")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry; the script's exit status, 124 on timeout, 2 = usage, 3 = no cluster,
    130 = interrupted (Ctrl-C or SIGTERM: ranks killed, cluster removed)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    cluster: Cluster | None = None
    try:
        interrupt_on_sigterm()
        args = build_parser().parse_args(argv)
        logging.basicConfig(level=logging.WARNING, format="train: %(message)s")
        check_backends([args.backend], "--backend",
                       TRAIN_BACKENDS if args.script == DEFAULT_SCRIPT else None)
        if args.cluster:
            cluster = start_cluster(args.world_size, args.rate, args.prefix)
        return launch(args.world_size, args.backend, extra, args.script, args.timeout,
                      cluster)
    except CliError as exc:
        return report(exc)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; ranks killed" + (", cluster removed" if cluster else ""),
              file=sys.stderr)
        return INTERRUPTED
    finally:
        if cluster is not None:
            cluster.down()


if __name__ == "__main__":
    raise SystemExit(main())
