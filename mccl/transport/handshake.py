"""Mutual authentication of a new connection with the job secret from the rendezvous store.

The acceptor speaks first: a fresh random challenge. The dialer's hello proves it knows the
secret of this job and group, names the right ranks and answers that challenge (so a hello
recorded on the wire cannot be replayed on another connection); the acceptor's ack proves the
same back for the dialer's nonce. Port scans, random bytes, a wrong secret, a replayed hello or
a second job on the same port fail here and are dropped.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct

CHALLENGE_MAGIC = b"MCCLCHAL"
HELLO_MAGIC = b"MCCLHELO"
ACK_MAGIC = b"MCCL_ACK"
VERSION = 2
NONCE_BYTES = 16
_MAC = hashlib.sha256
_CHALLENGE = struct.Struct(f"<8s{NONCE_BYTES}s")
# magic, version, group, src rank, dst rank, nonce, mac
_HELLO = struct.Struct(f"<8sHIII{NONCE_BYTES}s32s")
_ACK = struct.Struct("<8s32s")
CHALLENGE_SIZE = _CHALLENGE.size
HELLO_SIZE = _HELLO.size
ACK_SIZE = _ACK.size


class HandshakeError(ConnectionError):
    """The other side is not a peer of this job and group."""


def _mac(secret: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, b"|".join(parts), _MAC).digest()


def make_challenge() -> tuple[bytes, bytes]:
    """Return (challenge bytes, its nonce): what the acceptor sends on a new connection."""
    nonce = os.urandom(NONCE_BYTES)
    return _CHALLENGE.pack(CHALLENGE_MAGIC, nonce), nonce


def parse_challenge(raw: bytes) -> bytes:
    """The acceptor's nonce from its challenge."""
    if len(raw) != CHALLENGE_SIZE:
        raise HandshakeError(f"short challenge ({len(raw)} of {CHALLENGE_SIZE} bytes)")
    magic, nonce = _CHALLENGE.unpack(raw)
    if magic != CHALLENGE_MAGIC:
        raise HandshakeError("not an mccl listener (no challenge)")
    return nonce


def make_hello(secret: bytes, group: int, src: int, dst: int, *,
               challenge: bytes) -> tuple[bytes, bytes]:
    """Return (hello bytes, nonce) answering the acceptor's ``challenge``; the nonce is needed
    to check the ack."""
    nonce = os.urandom(NONCE_BYTES)
    fields = struct.pack("<IIII", VERSION, group, src, dst)
    mac = _mac(secret, b"hello", fields, nonce, challenge)
    return _HELLO.pack(HELLO_MAGIC, VERSION, group, src, dst, nonce, mac), nonce


def parse_hello(raw: bytes, secret: bytes, group: int, me: int, world: int, *,
                challenge: bytes) -> tuple[int, bytes]:
    """Validate a hello addressed to rank ``me`` that answers ``challenge`` (the nonce this
    connection was sent); return (source rank, nonce)."""
    if len(raw) != HELLO_SIZE:
        raise HandshakeError(f"short hello ({len(raw)} of {HELLO_SIZE} bytes)")
    magic, version, g, src, dst, nonce, mac = _HELLO.unpack(raw)
    if magic != HELLO_MAGIC:
        raise HandshakeError("not an mccl hello")
    if version != VERSION:
        raise HandshakeError(f"hello version {version}, expected {VERSION}")
    fields = struct.pack("<IIII", version, g, src, dst)
    if not hmac.compare_digest(mac, _mac(secret, b"hello", fields, nonce, challenge)):
        raise HandshakeError("hello not signed with this job's secret for this connection's "
                             "challenge (wrong secret, or replayed)")
    if g != group:
        raise HandshakeError(f"hello for group {g:#x}, this is group {group:#x}")
    if dst != me or not 0 <= src < world or src == me:
        raise HandshakeError(f"hello from rank {src} to rank {dst} does not fit rank {me}/{world}")
    return src, nonce


def make_ack(secret: bytes, nonce: bytes, group: int, src: int, dst: int) -> bytes:
    fields = struct.pack("<III", group, src, dst)
    return _ACK.pack(ACK_MAGIC, _mac(secret, b"ack", fields, nonce))


def check_ack(raw: bytes, secret: bytes, nonce: bytes, group: int, src: int, dst: int) -> None:
    if len(raw) != ACK_SIZE:
        raise HandshakeError(f"short ack ({len(raw)} of {ACK_SIZE} bytes)")
    magic, mac = _ACK.unpack(raw)
    fields = struct.pack("<III", group, src, dst)
    if magic != ACK_MAGIC or not hmac.compare_digest(mac, _mac(secret, b"ack", fields, nonce)):
        raise HandshakeError(f"rank {dst} did not prove it holds this job's secret")


def read_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly n bytes (n is small and fixed here) or raise ConnectionError."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError(f"connection closed after {got} of {n} handshake bytes")
        got += k
    return bytes(buf)
