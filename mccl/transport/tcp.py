"""TCP connections between the ranks of one group: socket options, a sender thread per peer,
and framed receives straight into caller memory.

One thread owns each socket direction: the peer's sender thread writes, the group's comm
thread reads. Small payloads may be written inline by the comm thread, under the peer's send
lock, when the sender thread has nothing queued (saves a thread hand-off per message).
"""

from __future__ import annotations

import logging
import queue
import selectors
import socket
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .framing import (
    DATA,
    ERROR,
    HEADER_SIZE,
    MAX_ERROR_BYTES,
    P2P,
    FrameError,
    Header,
    Signature,
    pack_header,
    unpack_header,
)

log = logging.getLogger("mccl.transport")

#: Socket buffer we ask for where the OS lets us have it (else kernel autotuning is kept).
SOCKET_BUFFER_BYTES = 8 << 20
#: Payloads up to this size are copied or written inline instead of queued zero-copy.
INLINE_MAX_BYTES = 64 << 10
#: How long a failing rank keeps its sockets open so its error frame can reach the peers.
ERROR_LINGER_S = 3.0
_WAITALL = getattr(socket, "MSG_WAITALL", 0)


class PeerError(ConnectionError):
    """A failure attributable to one peer rank (closed connection, timeout, error frame)."""

    def __init__(self, peer: int, message: str):
        super().__init__(message)
        self.peer = peer


class MismatchError(RuntimeError):
    """Ranks issued different collectives at the same sequence number."""

    def __init__(self, peer: int, message: str):
        super().__init__(message)
        self.peer = peer


def _timeval(seconds: float) -> bytes:
    sec = int(seconds)
    usec = int((seconds - sec) * 1e6)
    # struct timeval is {time_t, suseconds_t} padded to 16 bytes on 64-bit Linux and macOS.
    return struct.pack("@qq", sec, usec)


def _buffer_cap_allows(target: int) -> bool:
    """On Linux an explicit SO_RCVBUF above rmem_max is silently capped and turns autotuning
    off, which is worse than leaving it alone; elsewhere (macOS) asking is safe."""
    if not sys.platform.startswith("linux"):
        return True
    try:
        with open("/proc/sys/net/core/rmem_max") as f, open("/proc/sys/net/core/wmem_max") as g:
            return int(f.read()) >= target and int(g.read()) >= target
    except (OSError, ValueError):
        return False


def tune_socket(sock: socket.socket, timeout_s: float) -> None:
    """Options every data connection gets; all exist on Linux and macOS."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if _buffer_cap_allows(SOCKET_BUFFER_BYTES):
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
            except OSError:
                pass
    # Blocking socket with kernel-side timeouts: recv(MSG_WAITALL) fills a whole buffer in one
    # call, and a stalled peer still surfaces as an error after the group timeout.
    sock.settimeout(None)
    tv = _timeval(max(timeout_s, 0.001))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def _as_bytes(buf) -> memoryview:
    mv = memoryview(buf)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


@dataclass(slots=True)
class _Marker:
    """Queued behind sends; set once everything before it was handed to the kernel."""

    event: threading.Event


class Peer:
    """One connected peer: the socket, its sender thread and the frames read ahead of time."""

    def __init__(self, rank: int, sock: socket.socket, timeout_s: float, label: str):
        self.rank = rank
        self.sock = sock
        self.timeout_s = timeout_s
        self.label = label
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._pending = 0  # queued items not yet written; guarded by _count_lock
        self._count_lock = threading.Lock()
        self._write_lock = threading.Lock()  # held while bytes go into the socket
        self._thread: threading.Thread | None = None
        self.send_error: BaseException | None = None
        self.coll_stash: deque[tuple[Header, bytearray]] = deque()
        self.p2p_stash: list[tuple[Header, bytearray]] = []
        self._hdr = bytearray(HEADER_SIZE)

    # ---- sending (sender thread, or inline when idle) ----
    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._send_loop, name=f"mccl-send-{self.label}-to{self.rank}", daemon=True
            )
            self._thread.start()

    def enqueue(self, header: bytes, payload,
                on_done: Callable[[BaseException | None], None] | None = None) -> None:
        """Queue a frame; ``payload`` (bytes-like) must stay unchanged until it is written."""
        with self._count_lock:
            self._pending += 1
        self._start()
        self._q.put((header, payload, on_done))

    def send_inline(self, header: bytes, payload) -> bool:
        """Write a small frame now if nothing is queued ahead of it; False if busy."""
        if not self._write_lock.acquire(blocking=False):
            return False
        try:
            with self._count_lock:
                if self._pending:
                    return False
            if self.send_error is not None:
                raise self._send_failure()
            try:
                self._write(header, payload)
            except OSError as e:
                self.send_error = e
                raise self._send_failure() from e
            return True
        finally:
            self._write_lock.release()

    def marker(self) -> threading.Event:
        """An event set once everything queued so far has been handed to the kernel."""
        ev = threading.Event()
        with self._count_lock:
            idle = self._pending == 0
            if not idle:
                self._pending += 1
        if idle:
            ev.set()
        else:
            self._q.put((None, _Marker(ev), None))
        return ev

    def _write(self, header: bytes, payload) -> None:
        sock = self.sock
        if payload is None or len(payload) == 0:
            sock.sendall(header)
            return
        mv = _as_bytes(payload)
        sent = sock.sendmsg([header, mv])
        total = len(header) + len(mv)
        if sent < total:
            if sent < len(header):
                sock.sendall(header[sent:])
                sent = len(header)
            sock.sendall(mv[sent - len(header):])

    def _send_loop(self) -> None:
        while True:
            header, payload, on_done = self._q.get()
            if header is None and payload is None:
                return  # shutdown
            if isinstance(payload, _Marker):
                payload.event.set()
            elif self.send_error is None:
                with self._write_lock:
                    try:
                        self._write(header, payload)
                    except OSError as e:
                        self.send_error = e
            with self._count_lock:
                self._pending -= 1
            if on_done is not None:
                try:
                    on_done(self.send_error)
                except Exception:  # a completion callback must not kill the sender
                    log.exception("send completion callback failed")

    def _send_failure(self) -> PeerError:
        return PeerError(self.rank, f"sending to rank {self.rank} failed: {self.send_error}")

    def stop(self) -> None:
        if self._thread is not None:
            self._q.put((None, None, None))

    # ---- receiving (comm thread only) ----
    def recv_exact(self, buf) -> None:
        mv = _as_bytes(buf)
        n = len(mv)
        got = 0
        sock = self.sock
        while got < n:
            try:
                k = sock.recv_into(mv[got:], n - got, _WAITALL)
            except (BlockingIOError, TimeoutError) as e:
                raise PeerError(
                    self.rank,
                    f"no data from rank {self.rank} for {self.timeout_s:.0f}s (group timeout)",
                ) from e
            except OSError as e:
                raise PeerError(self.rank, f"connection to rank {self.rank} failed: {e}") from e
            if k == 0:
                raise PeerError(self.rank, f"rank {self.rank} closed the connection")
            got += k

    def read_header(self) -> Header:
        self.recv_exact(self._hdr)
        try:
            hdr = unpack_header(self._hdr)
        except FrameError as e:
            raise PeerError(self.rank, f"malformed frame from rank {self.rank}: {e}") from e
        if hdr.kind == ERROR:
            reason = bytearray(hdr.length)
            self.recv_exact(reason)
            text = reason.decode("utf-8", "replace")
            raise PeerError(self.rank, f"rank {self.rank} failed: {text}")
        return hdr

    def read_payload(self, hdr: Header, limit: int) -> bytearray:
        if hdr.length > limit:
            raise PeerError(
                self.rank, f"rank {self.rank} sent an unexpected frame of {hdr.length} bytes"
            )
        data = bytearray(hdr.length)
        self.recv_exact(data)
        return data


def describe_signature(sig: Signature, names: Callable[[Signature], str] | None) -> str:
    return names(sig) if names else repr(sig)


class Mesh:
    """All connections of one group: rank -> Peer, plus the framed receive logic."""

    def __init__(
        self,
        rank: int,
        size: int,
        group: int,
        peers: dict[int, socket.socket],
        timeout_s: float,
        label: str,
        describe: Callable[[Signature], str] | None = None,
        max_unexpected: int = 1 << 32,
    ):
        self.rank = rank
        self.size = size
        self.group = group
        self.timeout_s = timeout_s
        self.describe = describe
        self.max_unexpected = max_unexpected
        self.peers: list[Peer | None] = [None] * size
        for r, s in peers.items():
            tune_socket(s, timeout_s)
            self.peers[r] = Peer(r, s, timeout_s, label)
        self.closed = False
        self._close_lock = threading.Lock()

    def peer(self, r: int) -> Peer:
        p = self.peers[r]
        if p is None:
            raise ValueError(f"rank {r} is not a peer of rank {self.rank} in a group of {self.size}")
        return p

    # ---- sends ----
    def send(self, peer: int, kind: int, sig: Signature, seq: int, payload, tag: int = 0,
             on_done: Callable[[BaseException | None], None] | None = None) -> bool:
        """Send one frame; returns True if it was written (or copied) before returning, so the
        caller may reuse ``payload`` at once, False if it was queued zero-copy (then
        ``on_done`` is called by the sender thread once it was written or failed)."""
        p = self.peer(peer)
        if p.send_error is not None:
            raise p._send_failure()
        nbytes = memoryview(payload).nbytes if payload is not None else 0
        if kind == P2P:
            sig = Signature(sig.op, sig.dtype, sig.redop, tag, sig.count)
        header = pack_header(kind, sig, self.group, seq, nbytes)
        if nbytes <= INLINE_MAX_BYTES:
            if p.send_inline(header, payload):
                return True
            p.enqueue(header, bytes(_as_bytes(payload)) if nbytes else b"")
            return True
        p.enqueue(header, payload, on_done)
        return False

    def flush(self, peers: Sequence[int], deadline: float) -> None:
        """Wait until every frame queued to ``peers`` has been handed to the kernel."""
        events = [(r, self.peer(r).marker()) for r in peers]
        for r, ev in events:
            if not ev.wait(max(0.0, deadline - time.monotonic())):
                raise PeerError(r, f"sending to rank {r} made no progress before the timeout")
            p = self.peer(r)
            if p.send_error is not None:
                raise p._send_failure()

    # ---- receives (comm thread) ----
    def _check(self, p: Peer, hdr: Header, seq: int, sig: Signature, nbytes: int) -> None:
        if hdr.group != self.group:
            raise MismatchError(p.rank, f"rank {p.rank} sent a frame of another group")
        if hdr.seq != seq or hdr.sig != sig:
            mine = describe_signature(sig, self.describe)
            theirs = describe_signature(hdr.sig, self.describe)
            raise MismatchError(
                p.rank,
                f"collective mismatch: rank {self.rank} issued op #{seq} {mine}, "
                f"but rank {p.rank} issued op #{hdr.seq} {theirs}",
            )
        if hdr.length != nbytes:
            raise MismatchError(
                p.rank,
                f"collective mismatch in op #{seq} {describe_signature(sig, self.describe)}: "
                f"rank {p.rank} sent {hdr.length} bytes where rank {self.rank} expects {nbytes}",
            )

    def recv_data(self, peer: int, seq: int, sig: Signature, buf) -> None:
        """Receive the next collective frame from ``peer`` into ``buf`` (exact length)."""
        p = self.peer(peer)
        mv = _as_bytes(buf)
        if p.coll_stash:
            hdr, data = p.coll_stash.popleft()
            self._check(p, hdr, seq, sig, len(mv))
            mv[:] = data
            return
        while True:
            hdr = p.read_header()
            if hdr.kind == P2P:
                p.p2p_stash.append((hdr, p.read_payload(hdr, self.max_unexpected)))
                continue
            self._check(p, hdr, seq, sig, len(mv))
            p.recv_exact(mv)
            return

    def _take_p2p(self, p: Peer, hdr: Header, tag: int, mv: memoryview) -> None:
        if hdr.length != len(mv):
            raise MismatchError(
                p.rank,
                f"rank {p.rank} sent {hdr.length} bytes with tag {tag}; "
                f"the receive buffer on rank {self.rank} holds {len(mv)}",
            )

    def _from_stash(self, p: Peer, tag: int, mv: memoryview) -> bool:
        for i, (hdr, data) in enumerate(p.p2p_stash):
            if hdr.sig.root == tag:
                del p.p2p_stash[i]
                self._take_p2p(p, hdr, tag, mv)
                mv[:] = data
                return True
        return False

    def _read_one(self, p: Peer, tag: int, mv: memoryview) -> bool:
        """Read one frame from ``p``; True if it was the awaited p2p message (now in mv)."""
        hdr = p.read_header()
        if hdr.kind == DATA:
            p.coll_stash.append((hdr, p.read_payload(hdr, self.max_unexpected)))
            return False
        if hdr.sig.root == tag:
            self._take_p2p(p, hdr, tag, mv)
            p.recv_exact(mv)
            return True
        p.p2p_stash.append((hdr, p.read_payload(hdr, self.max_unexpected)))
        return False

    def recv_p2p(self, peer: int, tag: int, buf) -> None:
        p = self.peer(peer)
        mv = _as_bytes(buf)
        if self._from_stash(p, tag, mv):
            return
        while not self._read_one(p, tag, mv):
            pass

    def recv_p2p_any(self, tag: int, buf, deadline: float) -> int:
        """Receive a p2p message with ``tag`` from whichever peer sends first; return its rank."""
        mv = _as_bytes(buf)
        live = [p for p in self.peers if p is not None]
        for p in live:
            if self._from_stash(p, tag, mv):
                return p.rank
        with selectors.DefaultSelector() as sel:
            for p in live:
                sel.register(p.sock, selectors.EVENT_READ, p)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no message with tag {tag} from any rank before the timeout")
                for key, _ in sel.select(min(left, 1.0)):
                    if self._read_one(key.data, tag, mv):
                        return key.data.rank

    # ---- failure ----
    def fail(self, reason: str) -> None:
        """Tell every peer why this rank gives up, then close the connections shortly after."""
        text = reason.encode("utf-8", "replace")[:MAX_ERROR_BYTES]
        header = pack_header(ERROR, Signature(0), self.group, 0, len(text))
        for p in self.peers:
            if p is not None and p.send_error is None:
                try:
                    p.enqueue(header, text)
                except Exception:  # best effort
                    pass
        t = threading.Timer(ERROR_LINGER_S, self.close)
        t.daemon = True
        t.start()

    def close(self) -> None:
        """Shut every socket down; unblocks any thread waiting on them."""
        with self._close_lock:
            if self.closed:
                return
            self.closed = True
        for p in self.peers:
            if p is None:
                continue
            p.stop()
            try:
                p.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def dispose(self) -> None:
        """Close and release the sockets once no thread uses them any more."""
        self.close()
        for p in self.peers:
            if p is not None:
                try:
                    p.sock.close()
                except OSError:
                    pass
