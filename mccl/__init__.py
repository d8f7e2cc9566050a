"""mccl: a pure-Python torch.distributed backend with bandwidth-optimal ring collectives over
TCP, for Apple-Silicon (MPS), CPU and CUDA tensors.

``import mccl`` registers the backend ``"mccl"``; then ``dist.init_process_group("mccl")``.
"""

from __future__ import annotations

import logging

import torch.distributed as dist

from .eager import run_eagerly
from .errors import CollectiveError
from .process_group import BACKEND_NAME, ProcessGroupMCCL, create
from .work import GroupWork, Work

__all__ = ["BACKEND_NAME", "CollectiveError", "ProcessGroupMCCL", "register"]
__version__ = "0.1.0"

logging.getLogger("mccl").addHandler(logging.NullHandler())


def register() -> None:
    """Register backend "mccl" with torch.distributed (idempotent)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, create, extended_api=True,
                                  devices=["cpu", "cuda", "mps"])


register()
run_eagerly(ProcessGroupMCCL, Work, GroupWork)  # torch.compile: see mccl/eager.py
