"""What moves when: the per-group ordered job queue and its comm thread.

Ops of one group run in the order they were issued, on every rank, so a sequence number
identifies an op across ranks. The first failure breaks the group: the reason goes to every
peer in an error frame, and every pending or later op fails with it instead of hanging.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from .algorithms.base import Scratch
from .device import Handoff
from .errors import CollectiveError
from .transport.framing import DATA, Signature
from .transport.tcp import Mesh, MismatchError, PeerError
from .work import Work

log = logging.getLogger("mccl.engine")


class OpChannel:
    """The algorithms' Channel for one op: frames tagged with the op's seq and signature."""

    __slots__ = ("mesh", "rank", "size", "seq", "sig", "deadline", "_queued")

    def __init__(self, mesh: Mesh, seq: int, sig: Signature, deadline: float):
        self.mesh = mesh
        self.rank = mesh.rank
        self.size = mesh.size
        self.seq = seq
        self.sig = sig
        self.deadline = deadline
        self._queued: set[int] = set()

    def send(self, peer: int, buf: np.ndarray) -> bool:
        done = self.mesh.send(peer, DATA, self.sig, self.seq, buf)
        if not done:
            self._queued.add(peer)
        return done

    def recv(self, peer: int, buf: np.ndarray) -> None:
        self.mesh.recv_data(peer, self.seq, self.sig, buf)

    def flush(self) -> None:
        if self._queued:
            self.mesh.flush(sorted(self._queued), self.deadline)
            self._queued.clear()


Body = Callable[[OpChannel, list[torch.Tensor]], None]


@dataclass
class Job:
    """One op: what to run on the comm thread once the device hand-off is acquired."""

    name: str
    sig: Signature
    body: Body
    work: Work
    handoff: Handoff
    collective: bool = True  # collectives consume a sequence number; p2p receives do not
    seq: int = 0
    describe: str = field(default="")


class Engine:
    """Comm thread + ordered queue of one process group."""

    def __init__(self, mesh: Mesh, label: str, timeout_s: float):
        self.mesh = mesh
        self.label = label
        self.timeout_s = timeout_s
        self.scratch = Scratch()
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._seq = 0
        self._seq_lock = threading.Lock()
        self.error: CollectiveError | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name=f"mccl-comm-{label}", daemon=True)
        self._thread.start()

    @property
    def seq(self) -> int:
        return self._seq

    def submit(self, job: Job) -> Work:
        if self._stopped:
            raise CollectiveError(f"mccl {job.name}: process group {self.label} was shut down",
                                  op=job.name)
        with self._seq_lock:
            if job.collective:
                self._seq += 1
                job.seq = self._seq
            self._q.put(job)
        return job.work

    def _loop(self) -> None:
        # Reductions follow torch semantics: overflow to inf/wrap silently, like torch ops do.
        np.seterr(all="ignore")
        while True:
            job = self._q.get()
            if job is None:
                return
            if self.error is not None:
                job.work.fail(self._later_error(job))
                continue
            try:
                hosts = job.handoff.acquire()
                ch = OpChannel(self.mesh, job.seq, job.sig, time.monotonic() + self.timeout_s)
                job.body(ch, hosts)
                job.handoff.release()
            except BaseException as e:  # noqa: BLE001 - every failure must reach the waiter
                err = self._wrap(job, e)
                self.error = err
                log.error("%s", err)
                job.work.fail(err)
                if not self.mesh.closed:
                    self.mesh.fail(str(err))
                continue
            job.work.complete(job.handoff.gate(), job.handoff.result_context())

    def _where(self, job: Job) -> str:
        op = f"op #{job.seq}" if job.collective else "p2p"
        return f"mccl {job.name} ({op}) on rank {self.mesh.rank} of group '{self.label}'"

    def _wrap(self, job: Job, e: BaseException) -> CollectiveError:
        peer = getattr(e, "peer", None)
        if self.mesh.closed and not isinstance(e, (MismatchError,)):
            cause = f"process group was aborted or shut down ({e})"
        else:
            cause = str(e) or type(e).__name__
        who = f" [peer rank {peer}]" if peer is not None else ""
        kind = "collective mismatch" if isinstance(e, MismatchError) else (
            "peer failure" if isinstance(e, PeerError) else type(e).__name__)
        err = CollectiveError(f"{self._where(job)} failed{who}: {kind}: {cause}", op=job.name,
                              peer=peer)
        err.__cause__ = e
        return err

    def _later_error(self, job: Job) -> CollectiveError:
        assert self.error is not None
        return CollectiveError(
            f"{self._where(job)} not run: the group failed earlier: {self.error}",
            op=job.name, peer=self.error.peer)

    def shutdown(self, abort: bool = False, drain_s: float = 5.0) -> None:
        """Stop the comm thread. Without ``abort``, queued ops finish first (bounded)."""
        if self._stopped:
            return
        self._stopped = True
        if abort:
            self.error = self.error or CollectiveError(
                f"mccl process group '{self.label}' was aborted", op="abort")
            self.mesh.close()
        self._q.put(None)
        self._thread.join(timeout=None if abort else drain_s)
        if self._thread.is_alive():
            self.mesh.close()
            self._thread.join(timeout=drain_s)
        if not abort and not self.mesh.closed:
            try:  # let queued bytes reach the peers before the sockets go
                self.mesh.flush([p.rank for p in self.mesh.peers if p is not None],
                                time.monotonic() + drain_s)
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass
        self.mesh.dispose()
