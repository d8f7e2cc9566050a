"""A/B hook for design experiments (benchmarks/h200/ab.sh): MCCL_AB="name=value,..." sets
mccl's named module constants in every process started with this folder on PYTHONPATH.
Experiment tooling only; the library never reads MCCL_AB."""

import os

_TARGETS = {
    "inline_max": ("mccl.transport.tcp", "INLINE_MAX_BYTES"),
    "min_chunk": ("mccl.algorithms.base", "MIN_CHUNK_BYTES"),
    "max_chunk": ("mccl.algorithms.base", "MAX_CHUNK_BYTES"),
    "chunks_per_segment": ("mccl.algorithms.base", "CHUNKS_PER_SEGMENT"),
}

_spec = os.environ.get("MCCL_AB", "")
if _spec:
    import importlib

    for item in _spec.split(","):
        key, value = item.split("=")
        module, name = _TARGETS[key]
        setattr(importlib.import_module(module), name, int(value))
