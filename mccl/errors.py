"""Exceptions that user code sees. Each names the op, the rank and, where known, the peer."""

from __future__ import annotations

import torch.distributed as dist


class CollectiveError(dist.DistBackendError):
    """An mccl operation failed (peer died or stalled, mismatch, abort).

    Subclasses torch's DistBackendError so code written for NCCL/Gloo errors catches it.
    """

    def __init__(self, message: str, op: str = "", peer: int | None = None):
        super().__init__(message)
        self.op = op
        self.peer = peer


class InStepError(ValueError):
    """Bad input that every rank of an op finds at the same point, from what they all
    exchanged, with nothing of the op left in flight (e.g. sparse tensors of different
    sizes): the op fails on every rank with this error and the group stays usable, as
    gloo's does, where other failures inside an op break the group."""


#: The twin of each OS error class a group's set-up raised (``setup_error``).
_TWINS: dict[type, type] = {}


def setup_error(e: BaseException) -> BaseException:
    """``e``, raised while a group formed, as an instance of a class that is both its own
    (``TimeoutError``, ``ConnectionError``, mccl's ``GaveUpError``, ...) and torch's
    ``DistNetworkError``: code written for gloo, whose set-up failures are RuntimeErrors,
    catches it too. Errors that are not OS errors, or whose class cannot be rebuilt from
    their args, are returned as they are."""
    cls = type(e)
    if not isinstance(e, OSError) or isinstance(e, dist.DistError):
        return e
    twin = _TWINS.get(cls)
    if twin is None:
        twin = _TWINS[cls] = type(cls.__name__, (cls, dist.DistNetworkError),
                                  {"__module__": cls.__module__, "__doc__": cls.__doc__})
    try:
        out = twin(*e.args)
    except Exception:  # noqa: BLE001 - a class with its own constructor: keep the original
        return e
    return out.with_traceback(e.__traceback__)  # its cause: the caller's ``raise ... from``
