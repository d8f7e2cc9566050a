"""Which machine a rank runs on and how many cores it has, so that ranks sharing one machine
are known to share its cores (``rendezvous.cores_per_rank`` exchanges these facts). Linux reads
its boot id from /proc; macOS asks sysctlbyname through ctypes; elsewhere, or where neither can
be read, the host name alone names the machine."""

from __future__ import annotations

import hashlib
import os
import socket
import sys

#: Linux names each boot of a machine; network namespaces (the emulated hosts) share it.
_BOOT_ID = "/proc/sys/kernel/random/boot_id"
#: Room for a string read with sysctlbyname (a UUID is 36 characters).
SYSCTL_MAX_BYTES = 128


def machine_id() -> str:
    """Which machine this process runs on: the host name and the id of the machine's current
    boot (``_boot_session``), so that machines imaged alike (one host name) still differ.
    Where no boot id can be read, machines that share a host name count as one (then the
    group is only treated as short of cores, never the other way round)."""
    ident = socket.gethostname() + "/" + _boot_session()
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def _boot_session() -> str:
    """This boot's id: Linux's ``boot_id`` (shared by network namespaces, so emulated hosts
    count as one machine), macOS's ``kern.bootsessionuuid``; "" where neither can be read."""
    try:
        with open(_BOOT_ID) as f:
            return f.read().strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        return sysctl_string(b"kern.bootsessionuuid")
    return ""


def sysctl_string(name: bytes) -> str:
    """A string value from the BSD ``sysctlbyname`` call (macOS, through ctypes: no compiler,
    no subprocess); "" if it cannot be read."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        size = ctypes.c_size_t(SYSCTL_MAX_BYTES)
        buf = ctypes.create_string_buffer(SYSCTL_MAX_BYTES)
        if libc.sysctlbyname(name, buf, ctypes.byref(size), None, ctypes.c_size_t(0)) != 0:
            return ""
        return buf.value.decode(errors="replace")
    except (OSError, AttributeError, ValueError):
        return ""


def machine_cores() -> int:
    """The machine's core count (at least 1 where the OS does not say)."""
    return max(1, os.cpu_count() or 1)


def usable_cores() -> int:
    """Cores this process may run on: its affinity mask where the OS has one (Linux), else the
    machine's count (macOS)."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        try:
            return max(1, len(affinity(0)))
        except OSError:
            pass
    return machine_cores()


def machine_facts() -> tuple[str, int, int]:
    """(machine, its core count, this process's usable cores), as ``cores_per_rank``
    publishes them."""
    return machine_id(), machine_cores(), usable_cores()


def fewest_cores(facts: list[tuple[str, int, int]]) -> float:
    """Min over ranks of min(own usable cores, machine cores / ranks on that machine)."""
    on_machine: dict[str, int] = {}
    for machine, _, _ in facts:
        on_machine[machine] = on_machine.get(machine, 0) + 1
    return min(min(own, total / on_machine[machine]) for machine, total, own in facts)
