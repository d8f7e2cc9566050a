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
