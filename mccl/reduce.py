"""Element-wise reductions into a host buffer, per (reduce op, dtype).

Reductions run in numpy on host views: numpy releases the GIL and is single-threaded, so a
comm thread reducing never fights PyTorch's intra-op pool. Half types (float16, bfloat16) are
reduced in float32 and rounded once by the caller.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from enum import IntEnum

import numpy as np
import torch


class Op(IntEnum):
    SUM = 1
    AVG = 2
    PRODUCT = 3
    MIN = 4
    MAX = 5
    BAND = 6
    BOR = 7
    BXOR = 8


#: ``reduce(a, b, out=None)``: ``out = a (op) b``; in place into ``a`` when out is None.
Reducer = Callable[..., None]

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
#: Dtypes whose partial sums travel and accumulate in float32.
UPCAST = {torch.float16: torch.float32, torch.bfloat16: torch.float32}
SUPPORTED_DTYPES = FLOAT_DTYPES + INT_DTYPES + (torch.bool,)

_ARITH: dict[Op, Reducer] = {
    Op.SUM: lambda d, s, o=None: np.add(d, s, out=d if o is None else o),
    Op.AVG: lambda d, s, o=None: np.add(d, s, out=d if o is None else o),
    Op.PRODUCT: lambda d, s, o=None: np.multiply(d, s, out=d if o is None else o),
    Op.MIN: lambda d, s, o=None: np.minimum(d, s, out=d if o is None else o),
    Op.MAX: lambda d, s, o=None: np.maximum(d, s, out=d if o is None else o),
}
_BITWISE: dict[Op, Reducer] = {
    Op.BAND: lambda d, s, o=None: np.bitwise_and(d, s, out=d if o is None else o),
    Op.BOR: lambda d, s, o=None: np.bitwise_or(d, s, out=d if o is None else o),
    Op.BXOR: lambda d, s, o=None: np.bitwise_xor(d, s, out=d if o is None else o),
}
# bool follows torch's own semantics for bool tensors: sum/max are "any", product/min "all".
_BOOL: dict[Op, Reducer] = {
    Op.SUM: lambda d, s, o=None: np.logical_or(d, s, out=d if o is None else o),
    Op.MAX: lambda d, s, o=None: np.logical_or(d, s, out=d if o is None else o),
    Op.BOR: lambda d, s, o=None: np.logical_or(d, s, out=d if o is None else o),
    Op.PRODUCT: lambda d, s, o=None: np.logical_and(d, s, out=d if o is None else o),
    Op.MIN: lambda d, s, o=None: np.logical_and(d, s, out=d if o is None else o),
    Op.BAND: lambda d, s, o=None: np.logical_and(d, s, out=d if o is None else o),
    Op.BXOR: lambda d, s, o=None: np.logical_xor(d, s, out=d if o is None else o),
}


def check(op: Op, dtype: torch.dtype, collective: str | None = None) -> None:
    """Raise a TypeError naming the reduce op, the dtype and (if given) the collective if
    this pair cannot be reduced."""
    where = f"mccl {collective}" if collective else "mccl"
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{where}: reduce op {op.name} cannot reduce dtype {dtype} (mccl "
                        f"reduces {', '.join(str(d) for d in SUPPORTED_DTYPES)})")
    if dtype == torch.bool:
        ok = op in _BOOL
    elif dtype in INT_DTYPES:
        ok = op in _ARITH and op != Op.AVG or op in _BITWISE
    else:
        ok = op in _ARITH
    if not ok:
        raise TypeError(f"{where}: reduce op {op.name} is not defined for dtype {dtype}")


@functools.cache
def reducer(op: Op, dtype: torch.dtype) -> Reducer:
    """``reduce(a, b, out=None)`` for host arrays of ``dtype`` (after upcast); cached, as it
    is looked up once per op."""
    check(op, dtype)
    if dtype == torch.bool:
        return _BOOL[op]
    return _BITWISE[op] if op in _BITWISE else _ARITH[op]


def finisher(op: Op, world: int) -> Callable[[np.ndarray], None] | None:
    """What to apply once to a fully reduced element (AVG divides by the world size)."""
    if op == Op.AVG and world > 1:
        return lambda d: np.divide(d, world, out=d)
    return None
