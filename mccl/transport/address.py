"""Which address a rank listens on and advertises, and how addresses are written: the
interface ``MCCL_SOCKET_IFNAME`` names (NCCL's syntax), else the one on the route to the master;
IPv4 where there is one, else IPv6 (link-local ones keep their interface). Only calls that
Linux and macOS both have (ioctl SIOCGIFADDR with each one's constant, getifaddrs, a UDP
connect that sends nothing)."""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
import sys

from .ifaddrs import ipv6_addresses

#: Port a route lookup "connects" its UDP socket to (nothing is sent).
DISCARD_PORT = 9
#: Longest interface name (IFNAMSIZ less its NUL, Linux and macOS alike).
IFNAME_MAX_BYTES = 15


def ipv4_address(ifname: str) -> str | None:
    """IPv4 address of an interface via SIOCGIFADDR (Linux and macOS constants)."""
    if sys.platform.startswith("linux"):
        req = 0x8915
    elif sys.platform == "darwin":
        req = 0xC0206921
    else:
        return None
    name = ifname.encode()
    if not name or len(name) > IFNAME_MAX_BYTES or b"\0" in name:
        return None  # the kernel would read a prefix of it: another interface's name
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        res = fcntl.ioctl(s.fileno(), req, struct.pack("16s24s", name, b"\0" * 24))
    except OSError:
        return None
    finally:
        s.close()
    return socket.inet_ntoa(res[20:24])


def _ifname_ipv6(ifname: str) -> str | None:
    """The interface's first IPv6 address (global before link-local), or None."""
    found = ipv6_addresses(ifname)
    return found[0] if found else None


def _interface_address(ifname: str) -> str | None:
    """The address to use on an interface: its IPv4 address, else an IPv6 one."""
    return ipv4_address(ifname) or _ifname_ipv6(ifname)


def _is_loopback(addr: str) -> bool:
    return ipaddress.ip_address(addr.split("%", 1)[0]).is_loopback


def _resolve(host: str) -> tuple[int, tuple] | None:
    """(family, sockaddr) of ``host`` (a name, an address, or an IPv6 address in brackets):
    its IPv4 address if it has one (what every earlier version used), else its IPv6 one."""
    try:
        infos = socket.getaddrinfo(host.strip().strip("[]"), DISCARD_PORT,
                                   type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        return None
    for family in (socket.AF_INET, socket.AF_INET6):
        for fam, _, _, _, sockaddr in infos:
            if fam == family:
                return fam, sockaddr
    return None


def route_address(master: str | None) -> str:
    """The local address this host uses to reach the master (UDP connect sends nothing):
    IPv4 where the master has an IPv4 address, else IPv6."""
    found = _resolve(master) if master else None
    if found is not None:
        family, sockaddr = found
        try:
            s = socket.socket(family, socket.SOCK_DGRAM)
            try:
                s.connect(sockaddr)
                return _with_scope(s.getsockname())
            finally:
                s.close()
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _with_scope(sockaddr: tuple) -> str:
    """The host of a socket address, with its interface (``%en0``) where IPv6 needs one: a
    link-local address means nothing without it."""
    host = sockaddr[0]
    scope = sockaddr[3] if len(sockaddr) > 3 else 0
    if scope and "%" not in host:
        try:
            host = f"{host}%{socket.if_indextoname(scope)}"
        except OSError:
            host = f"{host}%{scope}"
    return host


def through_own_interface(host: str, own: str) -> str:
    """A peer's link-local IPv6 address names the peer's interface (``fe80::1%en1``), which
    means nothing on this machine: reach it through this rank's own interface instead."""
    if "%" in host and "%" in own:
        return f"{host.split('%', 1)[0]}%{own.split('%', 1)[1]}"
    return host


def join_host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets (``[fe80::1%en0]:29500``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_host_port(addr: str) -> tuple[str, int]:
    """The inverse of ``join_host_port``."""
    host, port = addr.rsplit(":", 1)
    return host.strip("[]"), int(port)


def stream_address(host: str, port: int) -> tuple[int, tuple]:
    """(family, sockaddr) to bind or connect a TCP socket to a numeric ``host``."""
    fam, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                flags=socket.AI_NUMERICHOST)[0]
    return fam, sockaddr


def interface_names() -> list[str]:
    """Interface names in the kernel's order (Linux and macOS)."""
    try:
        return [name for _, name in socket.if_nameindex()]
    except OSError:
        return []


def choose_address(ifname: str | None, master: str | None) -> str:
    """Address to listen on and advertise: MCCL_SOCKET_IFNAME if set, else the master route.

    The syntax is NCCL's (``NCCL_SOCKET_IFNAME``), which users of other backends already
    write: a comma list of names, tried in order, then as prefixes (``en`` matches ``en0``)
    unless ``=`` in front asks for exact names only; ``^`` in front excludes the listed ones
    and takes another (the one on the route to the master if it qualifies, else the first
    that is not loopback). The first match with an address wins: its IPv4 address, else an
    IPv6 one (global before link-local).
    """
    if not ifname:
        return route_address(master)
    spec = ifname.strip()
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise ValueError(f"MCCL_SOCKET_IFNAME={ifname!r} names no interface (e.g. en0, "
                         "en0,en1, =en0 or ^lo,docker)")
    here = interface_names()

    def matches(name: str, want: str) -> bool:
        return name == want or (not exact and name.startswith(want))

    if exclude:
        kept = [a for n in here if not any(matches(n, w) for w in names)
                for a in [_interface_address(n)] if a]
        if kept:
            route = route_address(master)
            return next((a for a in kept if a == route),
                        next((a for a in kept if not _is_loopback(a)), kept[0]))
    else:  # the exact names in the list's order, then (unless '=') the names they start
        tries = names + ([n for w in names for n in here if n != w and matches(n, w)]
                         if not exact else [])
        for name in tries:
            addr = _interface_address(name)
            if addr:
                return addr
    what = "other than those" if exclude else "matching that"
    raise ValueError(f"MCCL_SOCKET_IFNAME={ifname!r}: no interface {what} has an IPv4 or IPv6 "
                     f"address (interfaces here: {', '.join(here) or 'none found'})")
