"""A/B hook for design experiments (benchmarks/h200/ab.sh): MCCL_AB="name=value,..." sets
mccl's named module constants in every process started with this folder on PYTHONPATH.
``sndbuf=N`` instead fixes every data socket's SO_SNDBUF at N bytes (receive autotuning
untouched). Experiment tooling only; the library never reads MCCL_AB."""

import os

_TARGETS = {
    "inline_max": ("mccl.transport.tcp", "INLINE_MAX_BYTES"),
    "min_chunk": ("mccl.algorithms.base", "MIN_CHUNK_BYTES"),
    "max_chunk": ("mccl.algorithms.base", "MAX_CHUNK_BYTES"),
    "chunks_per_segment": ("mccl.algorithms.base", "CHUNKS_PER_SEGMENT"),
}


def _fixed_sndbuf(nbytes: int) -> None:
    import socket

    from mccl.transport import tcp

    tune = tcp.tune_socket

    def tune_socket(sock, *args, **kwargs):
        tune(sock, *args, **kwargs)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, nbytes)

    tcp.tune_socket = tune_socket


_spec = os.environ.get("MCCL_AB", "")
if _spec:
    import importlib

    for item in _spec.split(","):
        key, value = item.split("=")
        if key == "sndbuf":
            _fixed_sndbuf(int(value))
            continue
        module, name = _TARGETS[key]
        setattr(importlib.import_module(module), name, int(value))
