"""The few environment variables mccl reads, in one place.

Everything else is automatic. Each variable is read when a process group is created, so a
script may set it before ``init_process_group``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

#: Interface whose address peers connect to, in NCCL_SOCKET_IFNAME's syntax: a comma list of
#: names or prefixes (first with an address wins, IPv4 before IPv6), ``=`` for exact names, ``^`` to
#: exclude (``address.choose_address``).
SOCKET_IFNAME_ENV = "MCCL_SOCKET_IFNAME"
#: "0" selects the staging hand-off (copy out, wait, copy back) instead of in-place host views.
UNIFIED_ENV = "MCCL_UNIFIED_COLLECTIVE"
#: Python logging level name for the "mccl" logger (e.g. INFO, DEBUG).
LOG_LEVEL_ENV = "MCCL_LOG_LEVEL"

ENV_DOCS = {
    SOCKET_IFNAME_ENV: "network interface for mccl traffic, as NCCL_SOCKET_IFNAME: en0, a prefix "
                       "(en), =exact, ^excluded (default: the route to the master)",
    UNIFIED_ENV: "1 (default): average in place in shared memory; 0: staging copies",
    LOG_LEVEL_ENV: "logging level of the 'mccl' logger (default WARNING)",
}


@dataclass(frozen=True)
class Config:
    socket_ifname: str | None
    unified: bool
    log_level: int | str


def _log_level(value: str | None) -> int | str:
    """A logging level name (DEBUG, INFO, WARNING, ERROR, CRITICAL) or number."""
    v = (value or "").strip().upper() or "WARNING"
    if v.isdigit():  # a level number, 0 (NOTSET) and up; a negative one means nothing
        return int(v)
    if v in ("DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL", "FATAL", "NOTSET"):
        return v
    raise ValueError(f"{LOG_LEVEL_ENV}={value!r}: expected a logging level (DEBUG, INFO, "
                     "WARNING, ERROR, CRITICAL) or a number")


def _flag(value: str | None, default: bool) -> bool:
    if value is None or value.strip() == "":
        return default
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{UNIFIED_ENV}={value!r}: expected 0 or 1")


#: Format of the stderr handler ``apply_log_level`` adds (ranks of one job often share it).
LOG_FORMAT = "[mccl pid %(process)d] %(levelname)s %(name)s: %(message)s"


def apply_log_level(level: int | str) -> None:
    """Set the "mccl" logger's level. Where MCCL_LOG_LEVEL asks for one and the application
    has configured no logging (no handler on "mccl" or the root), also write the records to
    stderr: otherwise Python shows only warnings and worse, and asking for DEBUG showed
    nothing."""
    logger = logging.getLogger("mccl")
    logger.setLevel(level)
    if not (os.environ.get(LOG_LEVEL_ENV) or "").strip():
        return
    configured = [h for h in logger.handlers + logging.getLogger().handlers
                  if not isinstance(h, logging.NullHandler)]  # the library's own NullHandler
    if configured:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logger.addHandler(handler)
    logger.propagate = False  # a root handler the application adds later would repeat them


def load() -> Config:
    """Read the environment now (not at import) so tests and scripts can change it."""
    return Config(
        socket_ifname=os.environ.get(SOCKET_IFNAME_ENV) or None,
        unified=_flag(os.environ.get(UNIFIED_ENV), True),
        log_level=_log_level(os.environ.get(LOG_LEVEL_ENV)),
    )
