"""CPU tensors: the comm thread works on the tensors themselves; no markers, no copies."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class CpuHandoff:
    __slots__ = ("tensors",)

    def __init__(self, tensors: Sequence[torch.Tensor]):
        self.tensors = list(tensors)

    def acquire(self) -> list[torch.Tensor]:
        return self.tensors

    def release(self) -> None:
        pass

    def discard(self) -> None:
        pass

    def ready_now(self) -> bool:
        return True

    def gate(self):
        return None

    def result_context(self):
        return None

    def queued(self) -> None:
        pass


class CpuAdapter:
    device_type = "cpu"

    def prepare(self, tensors: Sequence[torch.Tensor], reads: Sequence[bool],
                writes: Sequence[bool], inline: bool = False) -> CpuHandoff:
        return CpuHandoff(tensors)
