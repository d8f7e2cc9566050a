"""Set mccl's named constants (and a few switches) from a spec "key=value,...", with undo.

Used at start-up by this folder's sitecustomize (``MCCL_AB``, benchmarks/h200/ab.sh) and at
run time by benchmarks/oppath.py ``--variants`` (variants interleaved in one run). Keys:
``inline_max``, ``min_chunk``, ``max_chunk``, ``chunks_per_segment`` (constants, bytes or
counts; ``max_chunk`` is the cap of groups whose ranks have ``min_cores`` cores each or more,
``cpu_chunk`` the cap of the others: ``min_cores=0`` or ``min_cores=1000`` forces one);
``sndbuf=N`` fixes every data socket's SO_SNDBUF at N bytes (receive autotuning
untouched); ``inline_cuda=0`` runs blocking CUDA ops on the comm thread; ``gpu_wait=0``
makes the comm thread sleep on the producer's marker instead of the side stream waiting for
it on the GPU; ``start_write=0`` queues an op's first large send to the sender thread like
the others instead of writing it at once; ``write_max=N`` writes every send of up to N
bytes at once like an op's first (the op's thread writes what the idle socket takes, the
sender thread the rest), not only the first; ``quickack=1`` sets TCP_QUICKACK on a data socket
before every blocking receive (Linux: ACK at once, not when the reader gets to the data);
``notsent=N`` sets TCP_NOTSENT_LOWAT to N bytes (-1: the kernel's unlimited default);
``cc=1`` / ``cc=2`` pick the reno / bbr congestion control for the data sockets (where the
kernel has it); ``switch=US`` sets the interpreter's GIL switch interval to US microseconds
(``sys.setswitchinterval``; CPython's default is 5000); ``piece_min``, ``piece_max``
(``ring.PIECE_*_BYTES``), ``ahead``, ``first_ranges``, ``step_ranges`` (``staging.COPY_*``)
size a staged all-reduce's copy pieces and lookahead; ``whole=1`` copies one range per ring
segment instead (the staging before pieces; with ``first_ranges=1000`` all enqueued at once);
``torch_ctx=1`` enters the CUDA side stream through torch's ``device`` and ``stream``
context managers for every copy (before the fourteenth session; now a plain switch of the
stream where the thread is on the adapter's device); ``pool_wait=1`` makes a CUDA hand-off
wait for a pooled host buffer's copy back before reusing it (before the twelfth session it
always did; its copies run in order on one stream, so it need not); ``spin=0`` records
CUDA copy fences as blocking-sync events again, so
waiting on one sleeps until the driver wakes the thread (before the twelfth session; now
they spin);
``lazy_future=0`` makes every device op's Work make its torch Future at once (before the
twelfth session; now only when asked for, which blocking ops never do);
``early=0`` turns the engine's early start of a queued all-reduce off (``EARLY_START``);
``pipeline_min=N``: staged all-reduces of at least N bytes copy piece by piece, smaller ones
whole (``staging.PIPELINE_MIN_BYTES``); ``clamp=N`` caps the window every data socket
advertises at N bytes (TCP_WINDOW_CLAMP, Linux: bounds the bytes in flight per connection,
as gloo's two outstanding 1 MiB segments do; at 10 Gbit it changed nothing, ninth session);
``rs_spares=N``: reduce-scatter's partial sums rotate through N segment buffers
(``ring.REDUCE_SCATTER_SPARES``); ``rs_pool=N``: at most N cache-sized slots it prefers
(``ring.REDUCE_SCATTER_POOL_SLOTS``; 0: the spares only, as before the twenty-sixth
session), ``rs_pool_bytes=N`` their bytes (``ring.REDUCE_SCATTER_POOL_BYTES``);
``recv_piece=N`` reads every frame in receives of at most
N bytes (the kernel holds the socket's lock while one receive copies what is queued, and
handles newly arrived packets, and so their ACKs, only after it); ``ag_copy=0`` skips
all-gather's local copy of the own segment into the output (timing only: the output's own
part is then wrong); ``cc_late=1`` moves a data connection off BBR only once it is made
(``tune_socket``), not before it is dialled or accepted (before the forty-eighth session);
``peer_check=0`` skips ``Mesh.check_open`` (a collective's first send to each peer looks for
its end of stream since the seventeenth session; p2p sends before);
``a2a_pairwise=N``: all_to_all queues its sends a step at a time from N bytes to one peer
(``direct.ALL_TO_ALL_PAIRWISE_BYTES``; a huge N: all at once, as before the twenty-second
session); ``sockbuf=N``: the SO_SNDBUF/SO_RCVBUF every data socket asks for
(``tcp.SOCKET_BUFFER_BYTES``; above the kernel's rmem_max/wmem_max, e.g. 1099511627776, none
is asked for and the kernel's autotuning sizes them); ``grid_min=N``: all-reduces and flat
all-gathers and reduce-scatters use grids only in groups of at least N ranks
(``grid.MIN_RANKS``; a huge N: the ring only, as before the thirtieth session);
``flat_ranges=0``: staged flat all-gathers and reduce-scatters copy their tensors whole, as
before the fifty-fifth session (all-reduces still copy piece by piece); ``own_ranges=0``:
they copy only the large tensor piece by piece and the one that holds this rank's segment
(the all-gather's input, the reduce-scatter's output) whole, as in the fifty-fifth session;
``ready_spin=1``: the producer's marker of a CUDA op is not a blocking-sync event, so a comm
thread that finds it not passed spins on it in the driver instead of sleeping until the
driver wakes it (fifty-ninth session, call B: no difference seen); ``cuda_ranks=N`` (bench
only, with ``--device cuda``): ranks N and up bench host tensors, so only N ranks copy
through the shared GPU (with N=1, one rank's staging costs as if every host had a GPU of its
own, the others' on the host); each rank it moves adds a line to ``MCCL_AB_MARKS`` (default
``CUDA_RANKS_MARKS``); ``caller_stream=0``: a blocking CUDA op run on the caller's thread
copies on the adapter's side stream, as before the sixtieth session (now on the caller's
stream).
Experiment tooling only; the library never reads these."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

#: Where ``cuda_ranks`` notes each rank it puts on host tensors (a line per op and rank).
CUDA_RANKS_MARKS = "/tmp/mccl_ab_cuda_ranks.txt"

_CONSTANTS = {
    "inline_max": ("mccl.transport.mesh", "INLINE_MAX_BYTES"),
    "min_chunk": ("mccl.algorithms.base", "MIN_CHUNK_BYTES"),
    "max_chunk": ("mccl.algorithms.base", "MAX_CHUNK_BYTES"),
    "cpu_chunk": ("mccl.algorithms.base", "CPU_BOUND_CHUNK_BYTES"),
    "min_cores": ("mccl.algorithms.base", "MIN_CORES_PER_RANK"),
    "chunks_per_segment": ("mccl.algorithms.base", "CHUNKS_PER_SEGMENT"),
    "piece_min": ("mccl.algorithms.ring", "PIECE_MIN_BYTES"),
    "piece_max": ("mccl.algorithms.ring", "PIECE_MAX_BYTES"),
    "ahead": ("mccl.device.staging", "COPY_AHEAD_BYTES"),
    "first_ranges": ("mccl.device.staging", "COPY_FIRST_RANGES"),
    "step_ranges": ("mccl.device.staging", "COPY_STEP_RANGES"),
    "early": ("mccl.engine", "EARLY_START"),
    "pipeline_min": ("mccl.device.staging", "PIPELINE_MIN_BYTES"),
    "rs_spares": ("mccl.algorithms.ring", "REDUCE_SCATTER_SPARES"),
    "rs_pool": ("mccl.algorithms.ring", "REDUCE_SCATTER_POOL_SLOTS"),
    "rs_pool_bytes": ("mccl.algorithms.ring", "REDUCE_SCATTER_POOL_BYTES"),
    "a2a_pairwise": ("mccl.algorithms.direct", "ALL_TO_ALL_PAIRWISE_BYTES"),
    "sockbuf": ("mccl.transport.tcp", "SOCKET_BUFFER_BYTES"),
    "grid_min": ("mccl.algorithms.grid", "MIN_RANKS"),
}


def _whole_segments(copy_plan):
    """``ring.copy_plan`` as before pieces: one range per segment, in the ring's order."""

    def plan(n, w, r, itemsize, chunk_bytes=None, cap=None):
        fine = copy_plan(n, w, r, itemsize, chunk_bytes, cap)
        k = len(fine.starts[0])
        starts, ends = [[-1] * k for _ in range(w)], [[-1] * k for _ in range(w)]
        ranges = []
        for s in sorted(range(w), key=lambda s: fine.starts[s][0]):  # the ring's order
            starts[s][0] = ends[s][k - 1] = len(ranges)
            ranges.append((fine.cuts[s][0], fine.cuts[s][k]))
        return type(fine)(tuple(ranges), fine.cuts, tuple(map(tuple, starts)),
                          tuple(map(tuple, ends)))

    return plan


class _SwitchInterval:
    """``sys.setswitchinterval`` as an attribute, so ``apply`` can set and restore it."""

    @property
    def seconds(self) -> float:
        return sys.getswitchinterval()

    @seconds.setter
    def seconds(self, value: float) -> None:
        sys.setswitchinterval(value)


def _setting(key: str, value: int) -> tuple[object, str, object]:
    """(owner, attribute, new value) that ``key=value`` stands for."""
    if key in _CONSTANTS:
        module, name = _CONSTANTS[key]
        return importlib.import_module(module), name, value
    if key == "inline_cuda":
        return (importlib.import_module("mccl.process_group"), "INLINE_DEVICE_TYPES",
                frozenset({"cpu", "cuda"} if value else {"cpu"}))
    if key == "gpu_wait":
        ops = importlib.import_module("mccl.device.cuda").CudaOps
        new = ops.order_after if value else (lambda self, marker: marker.synchronize())
        return ops, "order_after", new
    if key == "pool_wait":
        ops = importlib.import_module("mccl.device.cuda").CudaOps
        return ops, "copies_in_order", not value
    if key == "torch_ctx":
        ops = importlib.import_module("mccl.device.cuda").CudaOps
        ctx = ops.copy_context
        return ops, "copy_context", (lambda self: self._on_side()) if value else ctx
    if key == "spin":
        import torch

        ops = importlib.import_module("mccl.device.cuda").CudaOps
        fence = ops.fence

        def sleeping(self):
            ev = torch.cuda.Event(blocking=True)  # the fences before the twelfth session
            ev.record(self.side)
            return ev

        return ops, "fence", fence if value else sleeping
    if key == "ready_spin":
        import torch

        ops = importlib.import_module("mccl.device.cuda").CudaOps
        ready = ops.ready

        def spinning(self):
            ev = torch.cuda.Event()  # waiting on it spins (GIL released), never sleeps
            ev.record(torch.cuda.current_stream(self.device))
            return ev

        return ops, "ready", spinning if value else ready
    if key == "lazy_future":
        import torch

        work = importlib.import_module("mccl.work").Work
        init = work.__init__

        def eager(self, *args, **kwargs):
            init(self, *args, **kwargs)
            if self._devices:  # every device op made its torch Future at once
                self._raw = torch.futures.Future(devices=self._devices)

        return work, "__init__", init if value else eager
    if key == "cc_late":
        rdv = importlib.import_module("mccl.transport.rendezvous")
        swap = importlib.import_module("mccl.transport.tcp").swap_congestion_control
        return rdv, "swap_congestion_control", (lambda sock: None) if value else swap
    if key == "peer_check":
        mesh = importlib.import_module("mccl.transport.mesh").Mesh
        check = mesh.check_open
        return mesh, "check_open", check if value else (lambda self, peer: None)
    if key == "start_write":
        mesh = importlib.import_module("mccl.transport.mesh").Mesh
        send_frame = mesh.send_frame
        if not value:
            def queued(self, peer, header, payload, nbytes, on_done=None, start=False):
                return send_frame(self, peer, header, payload, nbytes, on_done)

            return mesh, "send_frame", queued
        return mesh, "send_frame", send_frame
    if key == "write_max":
        mesh = importlib.import_module("mccl.transport.mesh").Mesh
        send_frame = mesh.send_frame

        def at_once(self, peer, header, payload, nbytes, on_done=None, start=False):
            return send_frame(self, peer, header, payload, nbytes, on_done,
                              start or nbytes <= value)

        return mesh, "send_frame", at_once if value else send_frame
    if key == "quickack":
        import socket

        peer = importlib.import_module("mccl.transport.tcp").Peer
        recv_exact = peer.recv_exact

        def quick(self, buf):
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
            return recv_exact(self, buf)

        return peer, "recv_exact", quick if value else recv_exact
    if key in ("notsent", "cc", "clamp"):
        import socket

        from mccl.transport import mesh

        tune = mesh.tune_socket
        name = {1: b"reno", 2: b"bbr"}.get(value, b"cubic")

        def tune_more(sock, *args, **kwargs):
            tune(sock, *args, **kwargs)
            if key == "notsent":
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, value)
            elif key == "clamp":
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_WINDOW_CLAMP, value)
            else:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name)

        return mesh, "tune_socket", tune_more
    if key == "recv_piece":
        peer = importlib.import_module("mccl.transport.tcp").Peer
        recv_exact = peer.recv_exact

        def in_pieces(self, buf):
            mv = memoryview(buf).cast("B")
            for a in range(0, len(mv), value):
                recv_exact(self, mv[a:a + value])

        return peer, "recv_exact", in_pieces if value else recv_exact
    if key == "whole":
        ring = importlib.import_module("mccl.algorithms.ring")
        plan = ring.copy_plan
        return ring, "copy_plan", _whole_segments(plan) if value else plan
    if key == "switch":
        return _SwitchInterval(), "seconds", value / 1e6
    if key == "sndbuf":
        import socket

        from mccl.transport import mesh

        tune = mesh.tune_socket

        def tune_socket(sock, *args, **kwargs):
            tune(sock, *args, **kwargs)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, value)

        return mesh, "tune_socket", tune_socket
    if key == "ag_copy":
        ring = importlib.import_module("mccl.algorithms.ring")
        gather = ring.all_gather

        def no_local_copy(ch, segs, mine=None, chunk_bytes=None, started=False, final=None):
            return gather(ch, segs, segs[ch.rank], chunk_bytes, started, final)

        return ring, "all_gather", gather if value else no_local_copy
    if key == "flat_ranges":
        coll = importlib.import_module("mccl.collectives")
        ranges = coll._flat_ranges
        return coll, "_flat_ranges", ranges if value else (lambda *args, **kw: None)
    if key == "own_ranges":
        coll = importlib.import_module("mccl.collectives")
        ranges = coll._flat_ranges

        def whole_own(*args, own: bool = False):
            return None if own else ranges(*args)

        return coll, "_flat_ranges", ranges if value else whole_own
    if key == "caller_stream":
        adapter = importlib.import_module("mccl.device.cuda").CudaAdapter
        prepare = adapter.prepare

        def on_side(self, tensors, reads, writes, inline=False):
            return prepare(self, tensors, reads, writes)

        return adapter, "prepare", prepare if value else on_side
    if key == "cuda_ranks":
        # The bench's worker runs as __main__, so its own functions cannot be patched from
        # here; it imports make_case from mccl.bench.ops at every call.
        ops = importlib.import_module("mccl.bench.ops")
        make_case = ops.make_case

        def first_on_cuda(op, count, dtype, rank, world, device="cpu", queue=1):
            if rank >= value:  # this rank's tensors on the host: no GPU copies of its own
                # the bench deletes its ranks' logs: a file says that this reached them
                marks = os.environ.get("MCCL_AB_MARKS", CUDA_RANKS_MARKS)
                with open(marks, "a") as f:
                    f.write(f"rank {rank} benches {op} on host tensors (asked: {device})\n")
                device = "cpu"
            return make_case(op, count, dtype, rank, world, device, queue)

        return ops, "make_case", first_on_cuda
    raise KeyError(f"unknown A/B key {key!r}")


def _forget_choices() -> None:
    """Drop cached decisions made from the constants (``grid.columns``)."""
    from mccl.algorithms import grid

    grid.columns.cache_clear()


def apply(spec: str) -> Callable[[], None]:
    """Apply ``spec``; returns the function that puts every changed value back."""
    undo: list[tuple[object, str, object]] = []
    for item in filter(None, spec.split(",")):
        key, value = item.split("=")
        owner, name, new = _setting(key, int(value))
        undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, new)
    _forget_choices()

    def restore() -> None:
        for owner, name, old in reversed(undo):
            setattr(owner, name, old)
        _forget_choices()

    return restore
