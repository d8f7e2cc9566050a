"""Checks and error handling shared by the command-line tools (bench, train, doctor, model).

Why one place: every tool must refuse bad input in one line before any rank starts (not a
rank's traceback minutes later), bring an emulated cluster up with the same one-line errors,
and treat SIGTERM like Ctrl-C so that rank sessions and cluster namespaces are cleaned up.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mccl.bench.cluster import Cluster

#: Exit status of a run cut short by Ctrl-C or SIGTERM (128 + SIGINT, as a shell reports it).
INTERRUPTED = 130
#: Ranks one command may start on this machine: so many per core, at least the floor (each
#: imports torch, hundreds of MB, and needs a share of a core to answer within a timeout).
LOCAL_RANKS_PER_CORE = 8
LOCAL_RANKS_FLOOR = 16


class CliError(Exception):
    """A one-line message for the user and the exit status that goes with it."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


def report(exc: CliError) -> int:
    """Print the error on stderr; return its exit status."""
    print(str(exc), file=sys.stderr)
    return exc.status


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def interrupt_on_sigterm() -> None:
    """Make SIGTERM raise KeyboardInterrupt, so `kill` or a job scheduler's stop takes the
    same clean-up path as Ctrl-C (rank sessions, namespaces, owner file)."""
    signal.signal(signal.SIGTERM, _raise_interrupt)


def at_least(minimum: float, kind: Callable[[str], float] = int, *, strict: bool = False
             ) -> Callable[[str], float]:
    """An argparse ``type``: a number >= minimum (> with ``strict``), so a bad value is a
    usage error (exit 2) instead of a failure inside the ranks. NaN is no number here
    (``--timeout nan`` passed both comparisons and ran)."""
    bound = f"> {minimum:g}" if strict else f">= {minimum:g}"

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (value > minimum if strict else value >= minimum):  # (False for NaN)
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    parse.__name__ = getattr(kind, "__name__", "number")  # argparse names the type in errors
    return parse


def local_ranks_limit() -> int:
    """The most ranks a tool starts on this machine (``LOCAL_RANKS_PER_CORE``), and no more
    than the open-file limit leaves room for (each needs a socket per peer)."""
    from mccl.transport import fdlimit

    limit = max(LOCAL_RANKS_FLOOR, LOCAL_RANKS_PER_CORE * (os.cpu_count() or 1))
    largest = fdlimit.summary()["largest_group"]
    return min(limit, largest) if isinstance(largest, int) else limit


def local_ranks(minimum: int) -> Callable[[str], float]:
    """An argparse ``type`` for a number of ranks to start here: ``minimum`` up to
    ``local_ranks_limit()``."""
    bounded = at_least(minimum)

    def parse(text: str) -> float:
        value = bounded(text)
        top = local_ranks_limit()
        if value > top:
            raise argparse.ArgumentTypeError(
                f"must be at most {top} (ranks this machine can run at once), got {text}")
        return value

    parse.__name__ = "int"
    return parse


def csv_items(text: str, flag: str) -> list[str]:
    """A comma list's entries, each once (first occurrence kept); an empty list is an error
    (it used to run nothing, or fall back to the defaults, without a word)."""
    items = list(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    if not items:
        raise CliError(f"error: {flag} is empty")
    return items


def int_items(text: str, flag: str, minimum: int, maximum: int | None = None) -> list[int]:
    """A comma list of integers from minimum up to maximum, each once, naming the flag in any
    error."""
    out = []
    for item in csv_items(text, flag):
        try:
            value = int(item)
        except ValueError:
            raise CliError(f"error: {flag}: {item!r} is not an integer") from None
        if value < minimum:
            raise CliError(f"error: {flag}: {value} is below {minimum}")
        if maximum is not None and value > maximum:
            raise CliError(f"error: {flag}: {value} is more than the {maximum} ranks this "
                           "machine can run at once")
        out.append(value)
    return list(dict.fromkeys(out))


def add_rx_steering(parser: argparse.ArgumentParser) -> None:
    """``--rx-steering auto|on|off``, shared by the tools that bring a cluster up (read it
    with ``steering``)."""
    parser.add_argument(
        "--rx-steering", choices=("auto", "on", "off"), default="auto",
        help="steer every link's received packets to one CPU per flow (Linux RPS), so a flow "
             "arrives in order as through a real NIC; auto (default): on shaped links, off on "
             "unshaped ones, where it costs the CPU being measured")


def steering(choice: str) -> bool | None:
    """``--rx-steering``'s value for ``Cluster(steer=...)``: on, off, or auto (None)."""
    return {"on": True, "off": False, "auto": None}[choice]


def check_device(device: str, flag: str = "--device") -> None:
    """Refuse a tensor device this torch cannot use here (every rank would crash on it)."""
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError:
        raise CliError(f"error: {flag} {device}: unknown device (use cpu, cuda or mps)") from None
    if dev.type == "cuda":
        if torch.version.cuda is None:
            raise CliError(f"error: {flag} {device}: this torch ({torch.__version__}) is built "
                           "without CUDA")
        if not torch.cuda.is_available():
            raise CliError(f"error: {flag} {device}: no CUDA device is visible here")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise CliError(f"error: {flag} {device}: only {torch.cuda.device_count()} CUDA "
                           "device(s) here")
    elif dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise CliError(f"error: {flag} {device}: MPS is not available here (it needs "
                           "Apple silicon and a torch built with MPS)")
    elif dev.type != "cpu":
        raise CliError(f"error: {flag} {device}: unsupported device type (use cpu, cuda or "
                       "mps)")


def check_backends(names: Sequence[str], flag: str, usable: Sequence[str] | None = None
                   ) -> None:
    """Refuse backends torch cannot create here (or, with ``usable``, that the tool cannot
    use), before any rank would fail on them."""
    from mccl.bench.runner import available_backends

    avail = [b for b in available_backends() if usable is None or b in usable]
    missing = [b for b in names if b not in avail]
    if missing:
        why = ("not usable here (choose from" if usable is not None
               else "not available here (available:")
        raise CliError(f"error: {flag}: {', '.join(missing)} {why} "
                       f"{', '.join(avail) or 'none'})")


def start_cluster(hosts: int, rate: str, prefix: str, burst: int | None = None,
                  cc: str | None = None, steer: bool | None = None) -> Cluster:
    """Bring an emulated cluster up for a run (``steer``: see ``Cluster``; None: on shaped
    links); any problem is a one-line CliError (status 2 for a bad setting, 3 when no
    cluster can be had)."""
    from mccl.bench.cluster import Cluster, ClusterError, ClusterUnavailable

    try:
        cluster = Cluster(hosts, rate, prefix=prefix, burst=burst, cc=cc, steer=steer)
    except ValueError as exc:
        raise CliError(f"bad cluster setting: {exc}") from None
    try:
        return cluster.up()
    except ClusterUnavailable as exc:
        raise CliError(f"cluster unavailable: {exc}", 3) from None
    except ClusterError as exc:
        raise CliError(f"cluster bring-up failed: {exc}", 3) from None
    except BaseException:  # interrupted half way: the caller never gets the cluster to down()
        cluster.down()
        raise
