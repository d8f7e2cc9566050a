"""IPv6 addresses of a network interface, read with the C library's ``getifaddrs``.

Python's standard library has no call for this (its ``ioctl`` route gives IPv4 only), and
``getifaddrs`` exists with the same list layout on Linux and macOS; only the first bytes of
a socket address differ (BSD puts a length byte before the one-byte family). Anything
unexpected gives an empty answer, never an error: the caller then reports that the
interface has no usable address.
"""

from __future__ import annotations

import ctypes
import ipaddress
import logging
import socket
import struct
import sys

log = logging.getLogger("mccl.transport")

#: Bytes of a ``sockaddr_in6``: family (and, on BSD, length), port, flow info, address, scope.
SOCKADDR_IN6_BYTES = 28
#: Where the 16 address bytes start in it.
ADDR_AT = 8


class _IfAddrs(ctypes.Structure):
    pass


_IfAddrs._fields_ = [  # the same on Linux (glibc, musl) and macOS
    ("ifa_next", ctypes.POINTER(_IfAddrs)),
    ("ifa_name", ctypes.c_char_p),
    ("ifa_flags", ctypes.c_uint),
    ("ifa_addr", ctypes.c_void_p),
    ("ifa_netmask", ctypes.c_void_p),
    ("ifa_dstaddr", ctypes.c_void_p),
    ("ifa_data", ctypes.c_void_p),
]


def _family(raw: bytes) -> int:
    if sys.platform == "darwin":
        return raw[1]  # sa_len, then sa_family: one byte each
    return struct.unpack_from("=H", raw, 0)[0]


def sockaddr_in6_text(raw: bytes, ifname: str) -> tuple[bool, str]:
    """(link-local?, text) of a ``sockaddr_in6`` on interface ``ifname``; a link-local
    address carries the interface (``fe80::1%en0``)."""
    packed = raw[ADDR_AT:ADDR_AT + 16]
    link_local = ipaddress.IPv6Address(packed).is_link_local
    if link_local:  # BSD kernels embed the interface index in bytes 2-3 (KAME)
        packed = packed[:2] + b"\0\0" + packed[4:]
    addr = ipaddress.IPv6Address(packed)
    return link_local, f"{addr}%{ifname}" if link_local else str(addr)


def ipv6_addresses(ifname: str) -> list[str]:
    """The interface's IPv6 addresses, global ones first, a link-local one with its
    interface (``fe80::1%en0``); [] where there are none or the lookup is not available."""
    if not (sys.platform.startswith("linux") or sys.platform == "darwin"):
        return []
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        getifaddrs, freeifaddrs = libc.getifaddrs, libc.freeifaddrs
    except (OSError, AttributeError):
        return []
    getifaddrs.argtypes = [ctypes.POINTER(ctypes.POINTER(_IfAddrs))]
    freeifaddrs.argtypes = [ctypes.POINTER(_IfAddrs)]
    head = ctypes.POINTER(_IfAddrs)()
    if getifaddrs(ctypes.byref(head)) != 0:
        log.debug("getifaddrs failed: errno %d", ctypes.get_errno())
        return []
    found: list[tuple[bool, str]] = []
    try:
        node = head
        while node:
            entry = node.contents
            name = entry.ifa_name.decode(errors="replace") if entry.ifa_name else None
            # the family first: a shorter address (IPv4, link layer) must not be over-read
            if (name == ifname and entry.ifa_addr
                    and _family(ctypes.string_at(entry.ifa_addr, 2)) == socket.AF_INET6):
                found.append(sockaddr_in6_text(
                    ctypes.string_at(entry.ifa_addr, SOCKADDR_IN6_BYTES), ifname))
            node = entry.ifa_next
    finally:
        freeifaddrs(head)
    return [a for _, a in sorted(found, key=lambda f: f[0])]
