"""The fixed frame header that precedes every payload on an mccl connection.

Every frame says which group, which op (sequence number) and what op signature it belongs to,
so a receiver can refuse data from a mismatched collective instead of reducing garbage, and
every length read from the wire is checked against what the receiver expects before any
memory is touched.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = b"MC"
VERSION = 1

# Frame kinds.
DATA = 1  # payload of a collective, ordered by sequence number
P2P = 2  # payload of send/recv, matched by tag
ERROR = 3  # the sender failed; payload is a UTF-8 reason, sig.root the blamed rank or -1
#: ``sig.root`` of an ERROR frame whose sender blames no rank (-1: the sender itself failed).
BLAME_NOBODY = -2
STATE = 4  # the sender is blocked in op seq/sig; payload: the rank it waits for (int32, -1)
BYE = 5  # the sender shut the group down cleanly; no payload
KINDS = (DATA, P2P, ERROR, STATE, BYE)

#: Largest frame payload accepted, a bound on lengths read from the wire: 1 TiB, beyond any
#: tensor one host holds (16 GiB refused a 17.5 GB point-to-point message that gloo moves).
#: An expected payload must match the buffer the receiver posted; one read ahead of its
#: receive (stashed) is allocated step by step as its bytes arrive (``Peer.read_payload``).
MAX_UNEXPECTED_BYTES = 1 << 40
#: Largest error reason accepted.
MAX_ERROR_BYTES = 1 << 16
#: Payload of a STATE frame: the rank the sender waits for.
STATE_PAYLOAD = struct.Struct("<i")

# magic, version, kind, op, dtype, redop, pad, root/tag, group, seq, count, length
_HEADER = struct.Struct("<2sBBBBBxiIQQQ")
HEADER_SIZE = _HEADER.size


class FrameError(ConnectionError):
    """A frame on the wire is malformed (bad magic, version, kind or length)."""


@dataclass(frozen=True, slots=True)
class Signature:
    """What all ranks must agree on for one collective: op, dtype, reduce op, root, count."""

    op: int
    dtype: int = 0
    redop: int = 0
    root: int = 0
    count: int = 0


@dataclass(frozen=True, slots=True)
class Header:
    kind: int
    sig: Signature
    group: int
    seq: int
    length: int


def pack_header(kind: int, sig: Signature, group: int, seq: int, length: int) -> bytes:
    s = sig
    return _HEADER.pack(
        MAGIC, VERSION, kind, s.op, s.dtype, s.redop, s.root, group, seq, s.count, length
    )


def error_frame(reason: str, group: int, seq: int = 0, blamed: int = BLAME_NOBODY,
                issued: Signature | None = None) -> tuple[bytes, bytes]:
    """(header, payload) of an ERROR frame: why the sender gives up, blaming ``blamed``
    (a group rank; -1: the sender itself, ``BLAME_NOBODY``: no rank). ``issued``: the
    sender's own op ``seq`` (its root aside), so a receiver of a mismatch report can tell
    whether the sender issued that op as it did."""
    text = reason.encode("utf-8", "replace")[:MAX_ERROR_BYTES]
    i = issued or Signature(0)
    sig = Signature(i.op, i.dtype, i.redop, blamed, i.count)
    return pack_header(ERROR, sig, group, seq, len(text)), text


def unpack_header(raw: bytes | bytearray | memoryview) -> Header:
    """Parse and bound-check a header; raises FrameError on anything malformed."""
    if len(raw) != HEADER_SIZE:
        raise FrameError(f"short frame header: {len(raw)} of {HEADER_SIZE} bytes")
    magic, version, kind, op, dtype, redop, root, group, seq, count, length = _HEADER.unpack(raw)
    if magic != MAGIC:
        raise FrameError(f"bad frame magic {bytes(magic)!r}")
    if version != VERSION:
        raise FrameError(f"unsupported frame version {version} (this side speaks {VERSION})")
    if kind > P2P:  # control frames: fixed or small payloads
        if kind > BYE:
            raise FrameError(f"unknown frame kind {kind}")
        if kind == ERROR and length > MAX_ERROR_BYTES:
            raise FrameError(f"error frame of {length} bytes exceeds {MAX_ERROR_BYTES}")
        if kind == STATE and length != STATE_PAYLOAD.size:
            raise FrameError(f"state frame of {length} bytes (expected {STATE_PAYLOAD.size})")
        if kind == BYE and length:
            raise FrameError(f"bye frame with a {length}-byte payload")
    elif kind < DATA:
        raise FrameError(f"unknown frame kind {kind}")
    if length > MAX_UNEXPECTED_BYTES:
        raise FrameError(f"frame length {length} exceeds {MAX_UNEXPECTED_BYTES}")
    return Header(kind, Signature(op, dtype, redop, root, count), group, seq, length)


def after_states(raw: bytes | bytearray | memoryview, group: int,
                 skip: tuple[int, ...] = (STATE,)) -> tuple[int, Header] | None:
    """The first frame in ``raw`` (the start of a peer's stream, peeked) after any STATE
    frames (any frames of the kinds in ``skip``), with its offset, if its header is all
    there; None where it is not yet, or the bytes are garbled or not ``group``'s (the reader
    reports those)."""
    at = 0
    while len(raw) - at >= HEADER_SIZE:
        try:
            hdr = unpack_header(raw[at:at + HEADER_SIZE])
        except FrameError:
            return None
        if hdr.group != group:
            return None
        if hdr.kind not in skip:
            return at, hdr
        at += HEADER_SIZE + hdr.length
    return None
