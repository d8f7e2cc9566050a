"""TCP connections between the ranks of one group: socket options, a sender thread per peer,
and framed receives straight into caller memory (the group's logic over them is ``mesh``).

One thread owns each socket direction: the peer's sender thread writes, the group's comm
thread reads. Small payloads, and an op's first large one, may be written inline by the comm
thread, under the peer's send lock, when the sender thread has nothing queued (saves a thread
hand-off per message, and the link does not wait for the sender thread at an op's start).
"""

from __future__ import annotations

import errno
import logging
import queue
import select
import socket
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .framing import HEADER_SIZE, Header, Signature

log = logging.getLogger("mccl.transport")


#: Socket buffer we ask for where the OS lets us have it (else kernel autotuning is kept).
SOCKET_BUFFER_BYTES = 8 << 20
#: Unsent bytes a data socket holds before a write waits (TCP_NOTSENT_LOWAT, Linux and macOS;
#: the kernel's default is unlimited, so a sender thread kept ~3 MB queued behind the bytes in
#: flight). Handing the kernel a quarter MiB at a time keeps the link busier: on emulated
#: 10 Gbit links whose token bucket forgives little idle time (256 KiB, as a switch port
#: forgives none), all-reduce at 16-256 MB gained 1.2-4.1 points on 4 and 8 hosts (ninth
#: session, benchmarks/results/h200/call_s9i, call_s9j); with the lenient default bucket about
#: a point on 4 hosts and level on 8. Bytes in flight are not limited by it.
NOTSENT_LOWAT_BYTES = 256 << 10
#: Congestion controls a data socket is moved off, and to what (Linux; macOS offers no choice
#: per socket and runs CUBIC). BBR, the default of some Linux hosts, cuts a flow's window to 4
#: packets for 200 ms whenever the flow's minimum RTT was not renewed for 10 s (PROBE_RTT),
#: which a collective's always-busy flows never renew; a ring waits for its slowest link, so
#: each such phase stalled the whole op. Traced on 4 emulated 1 Gbit hosts, every 256 MB
#: all-reduce but one of five held one or two (about 190 ms each, 94.7 % of the ceiling); on
#: CUBIC sockets every sample read 99.9 % (forty-fifth session, benchmarks/results/1gbit/s45).
#: Without CAP_NET_ADMIN the kernel allows only net.ipv4.tcp_allowed_congestion_control (a
#: BBR host may list "reno bbr" only): then the socket stays on BBR.
#: The swap is made before a connection exists (the dialling socket before connect, the
#: listener before listen: an accepted connection inherits a control set on its listener).
#: A connection swapped once made keeps what BBR set up at its start (likely the kernel's
#: own pacing, which BBR turns on and nothing turns off): in an A/B on 4 and 8 emulated
#: 10 Gbit BBR hosts, swapped once connected they read 98.3-98.9 % of the ceiling at
#: 64-256 MB, swapped before 99.5-100.2, gloo 100.0-100.3 (forty-ninth session,
#: benchmarks/results/h200/call_s49a).
CONGESTION_CONTROL_SWAPS = {b"bbr": b"cubic"}
_CONGESTION = getattr(socket, "TCP_CONGESTION", None)  # Linux only
#: Largest write of one blocking send call (see ``Peer._write``).
WRITE_PIECE_BYTES = 8 << 20
#: How often a blocked receive wakes up to check the other connections (SO_RCVTIMEO).
PROBE_S = 1.0
#: A send without progress fails after this many group timeouts (SO_SNDTIMEO).
SEND_TIMEOUT_FACTOR = 2
#: Unexpected payloads are allocated in steps of this size as bytes actually arrive, so a
#: corrupt length cannot make us allocate memory nobody sends.
STASH_STEP = 16 << 20
#: At close, what waits unread in a socket is read and dropped in reads of this size, at most
#: this many (``Peer.discard_unread``): a few socket buffers' worth.
DISCARD_CHUNK_BYTES = 1 << 20
DISCARD_READS = 64
#: Linux "autocorking" holds a frame's short last segment back while earlier segments of the
#: socket still sit in a queue (a shaped qdisc, a busy NIC) when nothing follows it: a 64 KiB
#: all-reduce at 4 ranks on 1 Gbit links took 2.8 ms instead of 1.1 ms. Setting TCP_NODELAY
#: again pushes it out, so a sender that goes idle does that (macOS does not cork).
PUSH_WHEN_IDLE = sys.platform.startswith("linux")
_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", None)
_WAITALL = getattr(socket, "MSG_WAITALL", 0)
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
_PEEK = socket.MSG_PEEK | _DONTWAIT
_POLL = getattr(select, "poll", None)  # macOS and Linux have it; elsewhere peek directly
_TIMEOUTS = (BlockingIOError, TimeoutError)
#: errnos of a connection its peer's end dropped (a killed process, a reboot)
_RESETS = (errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED)
#: What a connection a peer closed or reset without a goodbye may mean (an aborting rank
#: whose connection was busy could not send its report first).
_GONE_HINT = "(process exited, was killed or aborted the group?)"




class PeerError(ConnectionError):
    """A failure attributable to one peer rank (closed connection, timeout, error frame).

    ``peer`` is the connection it was seen on; ``culprit`` the rank to blame (a peer's error
    frame may name a third rank; without ``blame``, none: e.g. a receive from any peer that
    nobody sent to); ``origin`` the reason text a peer's error frame carried, which is
    forwarded unchanged so messages do not nest.
    """

    def __init__(self, peer: int, message: str, culprit: int | None = None,
                 origin: str | None = None, blame: bool = True):
        super().__init__(message)
        self.peer = peer
        self.culprit = (peer if culprit is None else culprit) if blame else None
        self.origin = origin


def seconds_text(s: float) -> str:
    """A duration for an error message: whole seconds, or two digits under one second (a
    200 ms group timeout read "for 0s")."""
    return f"{s:.0f}s" if s >= 1 else f"{s:.2g}s"


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


def tune_socket(sock: socket.socket, timeout_s: float, probe_s: float | None = None) -> None:
    """Options every data connection gets; all exist on Linux and macOS (where Python lacks
    one, it is skipped)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if _NOTSENT_LOWAT is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, _NOTSENT_LOWAT, NOTSENT_LOWAT_BYTES)
        except OSError:  # a kernel without it: keep the default
            pass
    if _buffer_cap_allows(SOCKET_BUFFER_BYTES):
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
            except OSError:
                pass
    swap_congestion_control(sock)
    sock.settimeout(None)
    set_socket_timeouts(sock, timeout_s, probe_s)


def congestion_control(sock: socket.socket) -> str:
    """The socket's TCP congestion control ("" where the OS does not say: not Linux)."""
    if _CONGESTION is None:
        return ""
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, _CONGESTION, 16).split(b"\0", 1)[0].decode()
    except OSError:
        return ""


def data_congestion_control(system: str) -> str:
    """The congestion control mccl's data sockets ask for where the system's is ``system``."""
    return CONGESTION_CONTROL_SWAPS.get(system.encode(), system.encode()).decode()


def probe_data_congestion_control() -> str:
    """What a data socket made here ends up on ("" where the OS does not say): the kernel
    lets an unprivileged process pick only from net.ipv4.tcp_allowed_congestion_control."""
    with socket.socket() as sock:
        swap_congestion_control(sock)
        return congestion_control(sock)


def swap_congestion_control(sock: socket.socket) -> None:
    """Move the socket off a congestion control named in ``CONGESTION_CONTROL_SWAPS``; where
    the kernel refuses (not loaded, not allowed), the socket keeps the system's."""
    current = congestion_control(sock)
    wanted = data_congestion_control(current)
    if wanted == current:
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _CONGESTION, wanted.encode())
    except OSError as e:
        global _told_swap_refused
        if not _told_swap_refused:  # once per process: every data socket would say it
            _told_swap_refused = True
            log.info("data sockets keep the system's congestion control %s (%s refused: %s; "
                     "list it in net.ipv4.tcp_allowed_congestion_control to allow it)",
                     current, wanted, e)


_told_swap_refused = False


def set_socket_timeouts(sock: socket.socket, timeout_s: float, probe_s: float | None) -> None:
    """Blocking socket with kernel-side timeouts: recv(MSG_WAITALL) fills a whole buffer in one
    call; a receive wakes every probe_s to look around. A send gives up after twice the group
    timeout without progress: a stalled rank is reported by whoever receives from it after
    one timeout, and ranks whose sends back up behind it learn that from error frames
    instead of blaming the neighbour that merely stopped reading."""
    rcv = probe_s if probe_s is not None else timeout_s
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(max(rcv, 0.001)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                    _timeval(max(SEND_TIMEOUT_FACTOR * timeout_s, 0.001)))


def _readable(sock: socket.socket) -> bool:
    """Whether a read would not block (data or the end of the stream): asked before a peek,
    because an empty socket's peek costs a raised exception (about 5 us; this 1.4 us). A
    fresh poll object each time: a shared one may not be polled from two threads at once."""
    if _POLL is None:
        return True
    try:
        p = _POLL()
        p.register(sock, select.POLLIN)
    except (ValueError, OSError):  # closed here: the read reports it
        return True
    return bool(p.poll(0))


def peek(sock: socket.socket, n: int) -> bytes | None:
    """Up to ``n`` bytes waiting on ``sock``, left there (None: nothing waits; b"": the peer
    closed its side); a connection error raises ``OSError``."""
    if not _readable(sock):
        return None
    try:
        return sock.recv(n, _PEEK)
    except _TIMEOUTS:
        return None


def byte_view(buf) -> memoryview:
    mv = memoryview(buf)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


@dataclass(slots=True)
class _Marker:
    """Queued behind sends; set once everything before it was handed to the kernel."""

    event: threading.Event


def _stall_alone(p: Peer, got: int, stall: list | None) -> list:
    """Stall handler of a Peer outside a Mesh: give up after the timeout."""
    now = time.monotonic()
    if stall is None or stall[1] != got:
        return [now - p.probe_s if stall is None else now, got]
    if now - stall[0] >= p.timeout_s:
        raise PeerError(p.rank, f"no data from rank {p.rank} for {seconds_text(now - stall[0])} "
                                "(group timeout)")
    return stall


class Peer:
    """One connected peer: the socket, its sender thread and the frames read ahead of time."""

    def __init__(self, rank: int, sock: socket.socket, timeout_s: float, label: str,
                 probe_s: float | None = None):
        self.rank = rank
        self.sock = sock
        self.timeout_s = timeout_s
        self.probe_s = probe_s if probe_s is not None else timeout_s
        self.label = label
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        # Items ever queued and ever finished (written or failed); their difference is what
        # is still pending. The queue is FIFO, so item t is finished once _finished >= t
        # (``ticket``/``passed``). Guarded by _count_lock.
        self._queued = 0
        self._finished = 0
        self._count_lock = threading.Lock()
        self._write_lock = threading.Lock()  # held while bytes go into the socket
        self._thread: threading.Thread | None = None
        self._stopping = False  # set under _count_lock; nothing is queued after the sentinel
        self.send_error: BaseException | None = None
        self.coll_stash: deque[tuple[Header, bytearray]] = deque()
        #: p2p messages read ahead of their receive: (header, payload, the mesh's read count
        #: when read), so a receive from any peer takes the one read first (``Mesh.post_recv``)
        self.p2p_stash: list[tuple[Header, bytearray, int]] = []
        self._hdr = bytearray(HEADER_SIZE)
        #: Called by recv_exact when the socket timed out: (peer, bytes got, state) -> state.
        self.on_stall: Callable[[Peer, int, list | None], list] = _stall_alone
        self.bye = False  # the peer announced a clean shutdown
        self.eof = False  # the peer's side is closed (after a BYE)
        #: Why a read found the connection gone without a BYE (the peer's process exited or
        #: was killed), once one did (``gone``).
        self.lost: str | None = None
        self.heard_at = 0.0  # when a frame from this peer was last read (time.monotonic)
        self.delivered_at = 0.0  # when a message from this peer last filled a receive
        #: The last STATE probe sent to it: (seq, awaited rank, ``Mesh._probe_round``).
        self.probed: tuple[int, int, int] | None = None
        #: Last STATE probe: (seq, signature, rank it waits for).
        self.state: tuple[int, Signature, int] | None = None
        #: This rank sent the peer a frame after its last STATE (the wait it reported on this
        #: rank may be over).
        self.sent_since_state = False

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
        with self._count_lock:  # put under the lock: nothing may follow stop()'s sentinel
            if self._stopping:
                raise PeerError(self.rank, f"connection to rank {self.rank} is closed")
            self._put(header, payload, on_done)

    def _put(self, header: bytes, payload, on_done) -> None:
        """``enqueue`` with ``_count_lock`` held."""
        self._queued += 1
        if self._thread is None:
            self._start()
        self._q.put((header, payload, on_done))

    def write_now(self, header: bytes, payload, copy_rest: bool,
                  on_done: Callable[[BaseException | None], None] | None = None) -> bool | None:
        """Write a frame from the calling thread if nothing is queued ahead of it (None: busy,
        queue it instead). Never blocks: what the socket buffer does not take at once is queued
        for the sender thread, copied (``copy_rest``: True is returned, the caller may reuse
        ``payload``) or as a view of ``payload`` (False: it must stay unchanged until written,
        ``on_done`` is called then). (Blocking here deadlocked rings of small chunks: every
        rank stuck writing to its full neighbour, none reading.)

        The check, the write and the queueing of the rest happen under ``_count_lock``, so a
        frame another thread queues meanwhile (a p2p send) goes behind the rest, not into the
        middle of this frame."""
        if not self._write_lock.acquire(blocking=False):
            return None
        try:
            with self._count_lock:
                if self._pending or self._stopping:
                    return None
                if self.send_error is not None:
                    raise self.send_failure()
                mv = byte_view(payload) if payload is not None else None
                frame = [header, mv] if mv is not None else [header]
                total = len(header) + (len(mv) if mv is not None else 0)
                try:
                    try:
                        sent = self.sock.sendmsg(frame, [], _DONTWAIT)
                    except _TIMEOUTS:
                        sent = 0
                    if sent == total:
                        self._push()
                except OSError as e:
                    self.send_error = e
                    raise self.send_failure() from e
                if sent == total:
                    return True
                head = header[sent:]
                rest = mv[max(sent - len(header), 0):] if mv is not None else b""
                if copy_rest:
                    self._put(b"", head + bytes(rest), None)
                    return True
                self._put(head, rest, on_done)
                return False
        finally:
            self._write_lock.release()

    def marker(self) -> threading.Event:
        """An event set once everything queued so far has been handed to the kernel (or
        failed)."""
        ev = threading.Event()
        with self._count_lock:
            idle = self._pending == 0 or self._stopping
            if not idle:
                self._queued += 1
                self._q.put((None, _Marker(ev), None))
        if idle:
            ev.set()
        return ev

    @property
    def _pending(self) -> int:
        """Queued items not yet written (read with ``_count_lock`` held)."""
        return self._queued - self._finished

    def ticket(self) -> int:
        """A number for everything queued so far; ``passed`` tells without blocking or
        queueing anything whether it has all been handed to the kernel (or failed)."""
        return self._queued

    def passed(self, ticket: int) -> bool:
        return self._finished >= ticket

    def _write(self, header: bytes, payload, last: bool = True) -> None:
        """Write one frame; ``last``: nothing else is about to follow it (push it out).

        At most ``WRITE_PIECE_BYTES`` per call: a blocking call gives up at SO_SNDTIMEO even
        while bytes still move, so a call that returns short only at about that time found
        the peer no longer reading (a stopped process), and the frame fails then, within
        the documented bound, instead of starting another full wait (or failing a whole
        large frame that merely takes longer than the timeout to transmit)."""
        sock = self.sock
        if payload is None or len(payload) == 0:
            sock.sendall(header)
        else:
            mv = byte_view(payload)
            head, off, n = header, 0, len(mv)
            stalled_s = 0.9 * SEND_TIMEOUT_FACTOR * self.timeout_s
            while head or off < n:
                piece = mv[off:off + WRITE_PIECE_BYTES]
                began = time.monotonic()
                sent = sock.sendmsg([head, piece] if head else [piece])
                if (sent < len(head) + len(piece)
                        and time.monotonic() - began >= stalled_s):
                    raise TimeoutError(errno.EAGAIN, "no progress within the send timeout")
                if sent < len(head):
                    head = head[sent:]
                else:
                    off += sent - len(head)
                    head = b""
        if last:
            self._push()

    def _push(self) -> None:
        """Send a corked frame tail now (see PUSH_WHEN_IDLE)."""
        if PUSH_WHEN_IDLE:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _send_loop(self) -> None:
        while True:
            header, payload, on_done = self._q.get()
            if header is None and payload is None:
                return  # shutdown: the sentinel is the last item ever queued
            if isinstance(payload, _Marker):
                payload.event.set()
            elif self.send_error is None:
                with self._write_lock:
                    try:
                        self._write(header, payload, last=self._q.empty())
                    except OSError as e:
                        self.send_error = e
            with self._count_lock:
                self._finished += 1
            if on_done is not None:
                try:
                    on_done(self.send_error)
                except Exception:  # a completion callback must not kill the sender
                    log.exception("send completion callback failed")
            # an idle sender holds nothing of the last frame: its payload is a view of the
            # op's tensor, which would stay allocated until the next send to this peer
            header = payload = on_done = None

    def send_failure(self) -> PeerError:
        e = self.send_error
        if isinstance(e, _TIMEOUTS) or getattr(e, "errno", None) in (errno.EAGAIN,
                                                                   errno.EWOULDBLOCK):
            return PeerError(self.rank, f"rank {self.rank} accepted no data for "
                                        f"{seconds_text(SEND_TIMEOUT_FACTOR * self.timeout_s)} "
                                        "(twice the group timeout)")
        if getattr(e, "errno", None) in _RESETS:
            return PeerError(self.rank, f"sending to rank {self.rank} failed: the connection "
                                        f"was reset {_GONE_HINT}: {e}")
        return PeerError(self.rank, f"sending to rank {self.rank} failed: {e}")

    def stop(self) -> None:
        """Let the sender thread finish what is queued (writes fail fast once the socket is
        shut down) and exit; later sends raise and later markers are set at once."""
        with self._count_lock:
            if self._stopping:
                return
            self._stopping = True
            if self._thread is not None:
                self._q.put((None, None, None))

    def join(self, timeout: float) -> None:
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # ---- receiving (comm thread only; peek from any thread) ----
    def peek(self, n: int) -> bytes | None:
        """Up to ``n`` waiting bytes, left in the socket (None: nothing waits; b"": the peer
        closed its side)."""
        try:
            return peek(self.sock, n)
        except OSError as e:
            raise self._conn_error(e) from e

    def discard_unread(self) -> None:
        """Before the socket is closed: read and drop what waits in it. Closing a socket with
        unread bytes resets the connection instead of ending it, and a reset makes the peer's
        kernel throw away what this rank sent that the peer has not read yet."""
        for _ in range(DISCARD_READS):  # bounded: a peer may still be writing
            try:
                if not self.sock.recv(DISCARD_CHUNK_BYTES, _DONTWAIT):
                    return
            except OSError:  # nothing more waits (or the connection is gone already)
                return

    def has_unread(self) -> bool:
        """Whether bytes from the peer (or the end of its stream) wait unread in the socket."""
        return _readable(self.sock)

    def at_eof(self) -> bool:
        """Whether the peer closed its side and every byte before that was read (sets
        ``eof``); a connection error counts as the end too."""
        try:
            raw = self.peek(1)
        except PeerError:
            return True
        if raw is None or raw:
            return False
        self.eof = True
        return True

    def recv_exact(self, buf) -> None:
        mv = byte_view(buf)
        n = len(mv)
        got = 0
        sock = self.sock
        stall = None
        while got < n:
            try:
                k = sock.recv_into(mv[got:], n - got, _WAITALL)
            except _TIMEOUTS:
                stall = self.on_stall(self, got, stall)  # raises past the group timeout
                continue
            except OSError as e:
                raise self._conn_error(e) from e
            if k == 0:
                raise self._closed_error()
            got += k

    def _conn_error(self, e: OSError) -> PeerError:
        if e.errno in _RESETS:
            err = PeerError(self.rank, f"connection to rank {self.rank} was reset "
                                       f"{_GONE_HINT}: {e}")
            if not self.bye:
                self.lost = str(err)
            return err
        return PeerError(self.rank, f"connection to rank {self.rank} failed: {e}")

    def _closed_error(self) -> PeerError:
        if self.bye:
            return PeerError(self.rank, f"rank {self.rank} shut the group down and closed the "
                                        "connection")
        err = PeerError(self.rank, f"rank {self.rank} closed the connection {_GONE_HINT}")
        self.lost = str(err)
        return err

    def gone(self) -> str | None:
        """Why the peer's process is known to be gone: its end of the connection closed or
        reset without a BYE (a clean shutdown of this group says BYE first), seen by a read
        before or by a peek now (any thread); None while it may be alive."""
        if self.lost is None and not self.bye:
            try:
                raw = self.peek(1)
            except PeerError:
                pass  # (sets ``lost`` if it was a reset)
            else:
                if raw == b"":
                    self._closed_error()
        return None if self.bye else self.lost

    def read_payload(self, hdr: Header) -> bytearray:
        """Read an unexpected payload (to stash); memory grows only as bytes arrive."""
        n = hdr.length
        if n <= STASH_STEP:
            data = bytearray(n)
            self.recv_exact(data)
            return data
        data = bytearray()
        while len(data) < n:
            piece = bytearray(min(STASH_STEP, n - len(data)))
            self.recv_exact(piece)
            data += piece
        return data
