"""Op codes and signatures: what every rank must agree on for a collective, and how it reads
in an error message."""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Sequence
from enum import IntEnum

import torch

from .reduce import Op
from .transport.framing import Signature


class Kind(IntEnum):
    ALL_REDUCE = 1
    BROADCAST = 2
    REDUCE = 3
    ALL_GATHER = 4
    GATHER = 5
    SCATTER = 6
    REDUCE_SCATTER = 7
    ALL_TO_ALL = 8
    BARRIER = 9
    SEND_RECV = 10
    MONITORED_BARRIER = 11
    SPARSE_ALL_REDUCE = 12


#: Wire codes of dtypes are positions in this list (append only: ranks must agree). Named, so
#: a torch without one of them keeps the others' codes (its slot is None there).
_DTYPE_NAMES = (
    "float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8",
    "bool", "complex64", "complex128", "uint16", "uint32", "uint64", "float8_e4m3fn",
    "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "complex32",
)
DTYPES: list[torch.dtype | None] = [getattr(torch, n, None) for n in _DTYPE_NAMES]
DTYPE_CODE = {d: i + 1 for i, d in enumerate(DTYPES) if d is not None}


def dtype_code(dtype: torch.dtype) -> int:
    return DTYPE_CODE.get(dtype, 255)


#: The real dtype torch hands a complex tensor over as (``torch.view_as_real``).
_REAL_OF = {getattr(torch, c): getattr(torch, r) for c, r in (
    ("complex64", "float32"), ("complex128", "float64"), ("complex32", "float16"))
    if hasattr(torch, c)}


def wire_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype of ``t``'s elements on the wire, for the op's signature. A complex tensor
    travels as its real and imaginary parts: torch hands most ops its real view
    (``torch.view_as_real``), and a view the caller made looks the same, so complex64[n] and
    float32[n, 2] are one and the same data (as on gloo), and a float32 tensor is always
    float32 whatever it is a view of."""
    return _REAL_OF.get(t.dtype, t.dtype)


def wire_numel(t: torch.Tensor) -> int:
    """``t``'s element count on the wire (a complex element is two real ones)."""
    return t.numel() * 2 if t.dtype in _REAL_OF else t.numel()


@functools.lru_cache(maxsize=4096)
def signature(kind: Kind, dtype: torch.dtype | None = None, redop: Op | None = None,
              root: int = 0, count: int = 0) -> Signature:
    return Signature(int(kind), dtype_code(dtype) if dtype is not None else 0,
                     int(redop) if redop is not None else 0, root, count)


#: Tensors of a coalesced all-reduce that ``split_digest`` counts exactly (more read as this).
_MAX_SPLIT_TENSORS = 127


def split_digest(counts: Sequence[int]) -> int:
    """``Signature.root`` of an all-reduce of several tensors at once
    (``all_reduce_coalesced``, torch's coalescing manager): how many tensors (7 bits) and a
    24-bit digest of their sizes. The total count alone let ranks that split one total
    differently ([2, 3] and [3, 2]) add one tensor's elements to another's without an error;
    a single tensor gives 0, as a plain all-reduce does."""
    if len(counts) < 2:
        return 0
    digest = zlib.crc32(struct.pack(f"<{len(counts)}q", *counts)) & 0xFFFFFF
    return (min(len(counts), _MAX_SPLIT_TENSORS) << 24) | digest


_COUNTED = (Kind.ALL_REDUCE, Kind.BROADCAST, Kind.REDUCE, Kind.ALL_GATHER, Kind.GATHER,
            Kind.SCATTER, Kind.REDUCE_SCATTER)


def describe(sig: Signature, global_ranks: Sequence[int] | None = None) -> str:
    """Human form of a signature, e.g. ``all_reduce(SUM, torch.float32, 1000 elements)``.
    ``global_ranks``: a subgroup's global rank of each group rank, to name a root both ways
    (``root=1 (global 5)``, ``root=0 (global 0)``: torch's rooted calls take the global
    rank)."""
    try:
        name = Kind(sig.op).name.lower()
    except ValueError:
        name = f"op{sig.op}"
    parts = []
    if sig.redop:
        try:
            parts.append(Op(sig.redop).name)
        except ValueError:
            parts.append(f"redop{sig.redop}")
    if sig.dtype:
        known = DTYPES[sig.dtype - 1] if sig.dtype <= len(DTYPES) else None
        parts.append(str(known) if known is not None else "dtype?")
    if sig.count or sig.op in _COUNTED:  # "0 elements" matters in a count mismatch
        parts.append(f"{sig.count} elements")
    if sig.op == Kind.ALL_REDUCE and sig.root > 0:  # ``split_digest``
        n = sig.root >> 24
        more = " or more" if n == _MAX_SPLIT_TENSORS else ""
        parts.append(f"in {n}{more} tensors of sizes #{sig.root & 0xFFFFFF:06x}")
    if sig.op in (Kind.BROADCAST, Kind.REDUCE, Kind.GATHER, Kind.SCATTER):
        known = global_ranks is not None and 0 <= sig.root < len(global_ranks)
        parts.append(f"root={sig.root} (global {global_ranks[sig.root]})" if known
                     else f"root={sig.root}")
    return f"{name}({', '.join(parts)})"
