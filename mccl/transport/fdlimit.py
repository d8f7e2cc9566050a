"""Room for a group's sockets under the process's open-file limit (RLIMIT_NOFILE).

Every group holds a socket to each of its peers. macOS starts processes with a soft limit of
256 open files, so on a fleet of a few hundred Macs one group, or the second group of a
smaller job (FSDP and DeviceMesh make several), would fail mid-rendezvous with a bare
"Too many open files" on one rank and a lost store on the others. Before a group opens its
sockets, the soft limit is raised as far as the hard limit allows; where even that is too
low, the group fails at once with the numbers and the fix.
"""

from __future__ import annotations

import errno
import logging
import os
import sys

try:
    import resource
except ImportError:  # not a Unix: nothing to raise, the sockets' own errors report it
    resource = None  # type: ignore[assignment]

log = logging.getLogger("mccl.transport")

#: Descriptors a group holds besides one socket per peer: its listener, the listener's
#: selector, and the engine's wake-up socket pair.
GROUP_EXTRA_FDS = 4
#: When the limit must rise anyway, room left beyond the new group's needs (the application's
#: files, torch's, later groups).
HEADROOM_FDS = 64
#: macOS refuses a soft limit above OPEN_MAX for open files, even where the hard limit is
#: unlimited (setrlimit(2)).
MACOS_OPEN_MAX = 10240
#: Where the process's open descriptors are listed (Linux and macOS both have it).
FD_DIR = "/dev/fd"


def open_count() -> int:
    """Descriptors this process has open now (0 where that cannot be listed)."""
    try:
        return max(0, len(os.listdir(FD_DIR)) - 1)  # less the listing's own
    except OSError:
        return 0


def _ceiling(hard: int) -> int:
    """The highest soft limit this platform accepts under ``hard``."""
    infinite = resource.RLIM_INFINITY
    if sys.platform == "darwin":
        return MACOS_OPEN_MAX if hard == infinite else min(hard, MACOS_OPEN_MAX)
    return sys.maxsize if hard == infinite else hard


def _shown(limit: int) -> int | str:
    """A limit as the messages and the doctor give it."""
    return "unlimited" if limit == resource.RLIM_INFINITY else limit


def make_room(sockets: int, what: str) -> None:
    """Make sure ``sockets`` more descriptors fit under the soft open-file limit, raising it
    toward the hard limit if needed (doubling it, or more where the need is larger, plus
    ``HEADROOM_FDS``). Raises ``OSError(EMFILE)`` naming ``what`` (the group) and the limits
    when the hard limit leaves no room, before any socket is opened."""
    if resource is None or sockets <= 0:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = open_count()
    need = in_use + sockets
    if soft == resource.RLIM_INFINITY or need + HEADROOM_FDS <= soft:
        return
    ceiling = _ceiling(hard)
    target = min(ceiling, max(2 * soft, need + HEADROOM_FDS))
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as e:
            log.debug("raising the open-file limit to %d failed: %s", target, e)
        else:
            log.info("%s: raised this process's open-file limit from %d to %d (%d open, "
                     "%d more for the group's sockets)", what, soft, target, in_use, sockets)
            soft = target
    if need > soft:
        raise OSError(errno.EMFILE, (
            f"{what} needs {sockets} more open files (one socket per peer), {in_use} are "
            f"open, and the open-file limit is {soft} (hard limit {_shown(hard)}): raise it "
            "on every host (ulimit -n) before starting the job"))


def summary() -> dict[str, int | str | None]:
    """For ``python -m mccl doctor``: descriptors open, the limits, and the largest group whose
    sockets would fit once ``make_room`` raised the soft limit as far as it may."""
    if resource is None:
        return {"open": None, "soft": None, "hard": None, "largest_group": None}
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = open_count()
    top = soft if soft == resource.RLIM_INFINITY else max(soft, _ceiling(hard))
    largest = (None if top == resource.RLIM_INFINITY
               else max(1, top - in_use - GROUP_EXTRA_FDS + 1))
    return {"open": in_use, "soft": _shown(soft), "hard": _shown(hard), "largest_group": largest}
