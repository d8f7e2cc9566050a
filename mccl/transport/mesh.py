"""The connections of one group and the logic over them: framed data checked against the
op every rank should be in, point-to-point matching, and failure detection.

Failure semantics (never hang, never corrupt): a blocked receive wakes every ``probe_s``
(SO_RCVTIMEO) and, off the hot path, looks at the other connections: error frames, dead peers
(EOF without a BYE) and stale or mismatched frames raise at once; the first time it blocks in an
op it tells every peer what it waits in (a STATE frame), so ranks that issued different ops at
the same sequence number find out even when no data flows. Silence from the awaited peer for the
group timeout raises, unless that peer reported it is itself waiting for a third rank (then
that rank's neighbour reports the real culprit first).
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence

from .framing import (
    BLAME_NOBODY,
    BYE,
    DATA,
    ERROR,
    HEADER_SIZE,
    MAX_ERROR_BYTES,
    P2P,
    STATE,
    STATE_PAYLOAD,
    FrameError,
    Header,
    Signature,
    after_states,
    error_frame,
    pack_header,
    unpack_header,
)
from .posted import PostedRecv, PostedRecvs
from .tcp import (
    PROBE_S,
    Peer,
    PeerError,
    byte_view,
    seconds_text,
    set_socket_timeouts,
    tune_socket,
)

log = logging.getLogger("mccl.transport")

#: Payloads up to this size are copied or written inline instead of queued zero-copy.
INLINE_MAX_BYTES = 64 << 10
#: How long a failing rank keeps its sockets open so its error frame can reach the peers.
ERROR_LINGER_S = 3.0
#: Ops whose signatures are remembered to explain stale frames and late probes.
HISTORY = 64
#: Frames of other peers up to this size are read ahead (stashed) while blocked, so error
#: frames queued behind them are seen; larger ones are left in the socket.
POLL_STASH_MAX = 1 << 20
#: Bytes of frames a group keeps read ahead of the receives and ops that want them (messages
#: sent before their receive was posted, data of a later op). A stream must be read past such
#: frames to reach the ones behind them; a sender that keeps sending what nobody receives
#: (its peer blocked in another op) would otherwise fill this process's memory (a rank grew to
#: 20 GB). Frames only read ahead to see what follows them stay in their socket past it, which
#: holds the sender back; a frame that must be read past it fails the op that needs it.
STASH_MAX_BYTES = 1 << 30
#: How far into what a peer sent a failed send looks for the report it left (``send_failure``).
REPORT_PEEK_BYTES = 1 << 20
#: Frames read from one peer per poll before moving on.
POLL_FRAMES = 64
#: Bytes peeked to find a peer's next frame behind its STATE frames (a few of 44 bytes).
PEEK_BYTES = 512


#: What every MismatchError's text starts with: a peer that gets it in an error frame tells a
#: mismatch (nothing broke) from a failure by it.
MISMATCH = "collective mismatch"


class MismatchError(RuntimeError):
    """Ranks issued different collectives at the same sequence number."""

    def __init__(self, peer: int, message: str):
        super().__init__(message if message.startswith(MISMATCH) else f"{MISMATCH}: {message}")
        self.peer = peer
        self.culprit = peer


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
        probe_s: float = PROBE_S,
    ):
        self.rank = rank
        self.size = size
        self.group = group
        self._probe_cap = probe_s
        self.timeout_s = timeout_s
        self.probe_s = self._probe_for(timeout_s)
        self.describe = describe
        self.peers: list[Peer | None] = [None] * size
        for r, s in peers.items():
            tune_socket(s, timeout_s, self.probe_s)
            p = Peer(r, s, timeout_s, label, self.probe_s)
            p.on_stall = self._stalled
            self.peers[r] = p
        self.closed = False
        self.failed = False
        self._close_lock = threading.Lock()
        # What this rank is doing (comm thread): current op (seq 0 outside collectives), the
        # last completed collective, and the signatures of recent ones.
        self.cur_seq = 0
        #: (rank, since when) of the peer the running op has heard nothing from for
        #: ``probe_s`` or more (``_stalled``); None otherwise. Read by ``waiting_text``.
        self.silent: tuple[int, float] | None = None
        self.cur_sig = Signature(0)
        self.done_seq = 0
        self._hist: list[tuple[int, Signature] | None] = [None] * HISTORY
        self._ahead: dict[int, list[tuple[int, Signature]]] = {}  # probes for ops not begun
        #: Bumped when a receive is filled: a later wait for the same peer is news again.
        self._probe_round = 0
        self._polling = False
        #: Receives waiting for their message, in the order they were posted (comm thread).
        self.posted = PostedRecvs()
        #: p2p messages stashed so far: the order a receive from any peer takes them in.
        self._stashed = 0
        #: Payload bytes in the peers' stashes now (bounded by ``STASH_MAX_BYTES``).
        self._stash_bytes = 0
        #: Peers whose next frame stays in the socket (a later collective's, too large to
        #: stash, until that op reads it; or a large message no receive asks for yet, until one
        #: does); ``serve`` does not wait on them meanwhile.
        self._held: set[int] = set()
        #: The thread running an op (the one that may read the sockets), else None.
        self._reader: threading.Thread | None = None

    def _probe_for(self, timeout_s: float) -> float:
        return max(0.01, min(self._probe_cap, timeout_s / 2))

    def set_timeout(self, timeout_s: float) -> None:
        """A new group timeout, from now on (any thread): waits under way measure the
        silence of their peer against it too."""
        self.timeout_s = timeout_s
        self.probe_s = self._probe_for(timeout_s)
        for p in self._live():
            p.timeout_s, p.probe_s = timeout_s, self.probe_s
            try:
                set_socket_timeouts(p.sock, timeout_s, self.probe_s)
            except OSError:  # a closed socket: its next use reports that
                pass

    def peer(self, r: int) -> Peer:
        p = self.peers[r]
        if p is None:
            raise ValueError(
                f"rank {r} is not a peer of rank {self.rank} in a group of {self.size}")
        return p

    def _live(self) -> list[Peer]:
        return [p for p in self.peers if p is not None]

    def _reachable(self) -> list[Peer]:
        """Peers whose connection may still take a frame: no send to them failed and they
        have not closed their side (where a last word, an error report or BYE, can go)."""
        return [p for p in self._live() if p.send_error is None and not p.eof]

    # ---- op bookkeeping (comm thread, once per op) ----
    def begin_op(self, seq: int, sig: Signature) -> None:
        """Record the op this rank is in (seq 0: not a collective); checks probes that peers
        sent for it before this rank got here."""
        self.cur_seq = seq
        self.cur_sig = sig
        self.silent = None
        self._held.clear()
        self._reader = threading.current_thread()
        if seq:
            self._hist[seq % HISTORY] = (seq, sig)
            if self._ahead:
                for r, theirs in self._ahead.pop(seq, ()):
                    self._compare(r, seq, theirs)

    def end_op(self) -> None:
        if self.cur_seq:
            self.done_seq = self.cur_seq
            if self.posted:  # every peer just took part: a posted receive's timeout counts
                now = time.monotonic()  # from here (its sender is alive, merely later)
                for pr in self.posted:
                    pr.since = now
        self.cur_seq = 0
        self.silent = None
        self._reader = None

    def op_failed(self) -> None:
        """The running op failed: its thread no longer reads the sockets (``_send_error``)."""
        self._reader = None

    def _issued(self, seq: int) -> Signature | None:
        h = self._hist[seq % HISTORY]
        return h[1] if h is not None and h[0] == seq else None

    def _compare(self, r: int, seq: int, theirs: Signature) -> None:
        differs = self._issued_otherwise(r, seq, theirs)
        if differs is not None:
            raise MismatchError(r, differs)

    def _mismatch_text(self, r: int, seq: int, mine: Signature, their_seq: int,
                       theirs: Signature) -> str:
        d = self.describe
        return (f"{MISMATCH}: rank {self.rank} issued op #{seq} "
                f"{describe_signature(mine, d)}, but rank {r} issued op #{their_seq} "
                f"{describe_signature(theirs, d)}")

    def _issued_otherwise(self, r: int, seq: int, theirs: Signature) -> str | None:
        """The mismatch text if this rank issued op ``seq`` with another signature than rank
        ``r`` did (None: the same, or too long ago to tell)."""
        mine = self._issued(seq)
        if mine is None or mine == theirs:
            return None
        return self._mismatch_text(r, seq, mine, seq, theirs)

    # ---- sends ----
    def send(self, peer: int, kind: int, sig: Signature, seq: int, payload, tag: int = 0,
             on_done: Callable[[BaseException | None], None] | None = None) -> bool:
        """Send one frame; returns True if it was written (or copied) before returning, so the
        caller may reuse ``payload`` at once, False if it was queued zero-copy (then
        ``on_done`` is called by the sender thread once it was written or failed)."""
        nbytes = memoryview(payload).nbytes if payload is not None else 0
        if kind == P2P:
            sig = Signature(sig.op, sig.dtype, sig.redop, tag, sig.count)
        return self.send_frame(peer, pack_header(kind, sig, self.group, seq, nbytes), payload,
                               nbytes, on_done)

    def send_frame(self, peer: int, header: bytes, payload, nbytes: int,
                   on_done: Callable[[BaseException | None], None] | None = None,
                   start: bool = False) -> bool:
        """``send`` with the header already packed (an op reuses one per chunk length).

        Small frames are written by the calling thread when the connection is idle (else
        copied and queued). A large one is queued zero-copy for the sender thread, except with
        ``start`` (an op's first send to this peer): then the calling thread writes what the
        idle socket takes at once, so the link does not wait for the sender thread to wake up
        (on a loaded host that took milliseconds), and queues the rest."""
        p = self.peer(peer)
        if p.send_error is not None:
            raise self._send_error(p)
        p.sent_since_state = True
        try:
            if nbytes <= INLINE_MAX_BYTES:
                if p.write_now(header, payload, copy_rest=True) is None:
                    p.enqueue(header, bytes(byte_view(payload)) if nbytes else b"")
                return True
            if start:
                done = p.write_now(header, payload, copy_rest=False, on_done=on_done)
                if done is not None:
                    return done
            p.enqueue(header, payload, on_done)
        except PeerError:
            if p.send_error is not None:
                raise self._send_error(p) from None
            raise
        return False

    def send_failure(self, peer: int) -> PeerError | MismatchError:
        """Why a send to ``peer`` failed (any thread); see ``_send_error``."""
        return self._send_error(self.peer(peer))

    def _send_error(self, p: Peer) -> PeerError | MismatchError:
        """Why sending to ``p`` failed. A peer that failed first (a mismatch it found, a rank
        it gave up on) sent an error frame before closing: on the thread running an op, read
        what arrived from ``p`` so that reason (or its exit) is reported, not a broken pipe;
        what it sent before that may show the mismatch here too. On another thread, while no
        op reads the sockets, peek for that report (or a BYE) past what ``p`` sent before it
        (a rank whose group broke over a third rank closes its connections, and this rank,
        writing to it, would otherwise name that live rank as the one that exited)."""
        if self._reader is threading.current_thread():
            if not self._polling and not p.eof:
                self._polling = True
                try:
                    self._poll_peer(p)
                except (PeerError, MismatchError) as e:
                    return e
                except Exception:  # noqa: BLE001 - the socket error is the answer then
                    pass
                finally:
                    self._polling = False
            return p.send_failure()
        try:
            found = self._peek_next(p, False, REPORT_PEEK_BYTES, (STATE, DATA, P2P))
            left = self._departure(p, found)
            if left is not None:
                return left
        except PeerError:
            pass  # (the connection is gone: the socket's error is all there is)
        return p.send_failure()

    def _departure(self, p: Peer, found: tuple[int, Header] | None) -> PeerError | None:
        """What ``p``'s peeked frame ``found`` (``_peek_next``) says of its leaving: a BYE
        (it shut the group down) or its error report; None for any other frame."""
        if found is None:
            return None
        at, hdr = found
        if hdr.kind == BYE:
            return PeerError(p.rank, f"rank {p.rank} has shut the group down")
        if hdr.kind == ERROR:
            return self._peeked_report(p, at, hdr)
        return None

    def check_open(self, peer: int) -> None:
        """Raise if ``peer`` has closed its side (exited, killed, or shut the group down): a
        message sent now would be lost without an error (any thread: only peeks)."""
        p = self.peer(peer)
        if p.eof:
            raise p._closed_error()
        left = self._departure(p, self._peek_next(p, closed_raises=True))
        if left is not None:
            raise left

    def check_reports(self, peer: int) -> None:
        """End of a collective that received from ``peer``: raise if what follows its data is
        its report that it gave up on this collective or an earlier one (a report numbered 0,
        of a point-to-point op, may come after this op completed there). A rank that comes to
        a small op after its peers timed out waiting for it finds all their data waiting,
        with those reports behind it, and would otherwise return the op's result although no
        other rank completed the op (its next op would fail). A BYE or the end of the stream
        there is a peer that completed the op and left: no error."""
        p = self.peer(peer)
        try:
            found = self._peek_next(p, closed_raises=False)
        except PeerError:
            return  # a broken connection: the next op reports it
        if found is not None:
            at, hdr = found
            if hdr.kind == ERROR and 0 < hdr.seq <= self.cur_seq:
                raise self._peeked_report(p, at, hdr)

    def _peek_next(self, p: Peer, closed_raises: bool, nbytes: int = PEEK_BYTES,
                   skip: tuple[int, ...] = (STATE,)) -> tuple[int, Header] | None:
        """``p``'s next frame of this group after any STATE frames (where it said what it was
        blocked in; after any of the kinds in ``skip``, within ``nbytes``), if its header has
        arrived, and its offset; left in the socket. Looked at only while no other thread
        reads the sockets (else the bytes peeked may be the middle of a frame; the op's own
        thread reads whole frames)."""
        raw = p.peek(nbytes)  # headers only: the peer's data may be waiting
        if not raw:
            if raw is not None and closed_raises:
                raise p._closed_error()
            return None
        if self._polling or self._reader not in (None, threading.current_thread()):
            return None  # a reader may be inside a frame: the bytes peeked need not start one
        return after_states(raw, self.group, skip)

    def _peeked_report(self, p: Peer, at: int, hdr: Header) -> PeerError:
        """The error that ``p``'s error frame ``hdr`` at ``at``, still in the socket, reports."""
        start = at + HEADER_SIZE
        raw = p.peek(start + min(hdr.length, MAX_ERROR_BYTES)) or b""
        return self._reported(p, hdr, bytes(raw[start:]).decode("utf-8", "replace"))

    def flush(self, peers: Sequence[int], deadline: float | None = None,
              poll: bool = True) -> None:
        """Wait until every frame queued to ``peers`` has been handed to the kernel.

        Without ``deadline`` this relies on the sender thread, whose writes fail after the
        group timeout without progress; meanwhile it keeps looking at the other connections.
        """
        self.wait_marks(self.mark(peers), deadline, poll)

    def mark(self, peers: Sequence[int]) -> list[tuple[int, threading.Event]]:
        """A token for 'everything queued to ``peers`` so far'; see ``wait_marks``."""
        return [(r, self.peer(r).marker()) for r in peers]

    def wait_marks(self, events: list[tuple[int, threading.Event]],
                   deadline: float | None = None, poll: bool = True) -> None:
        """Wait until the frames queued before ``mark`` have been handed to the kernel."""
        for r, ev in events:
            while not ev.wait(self.probe_s):
                if self.closed:
                    raise PeerError(r, "the process group was shut down")
                if deadline is not None and time.monotonic() >= deadline:
                    raise PeerError(r, f"sending to rank {r} made no progress before the "
                                       "timeout")
                if poll and not self._polling:
                    self._probe(r)
                    self._poll(None)
            p = self.peer(r)
            if p.send_error is not None:
                raise self._send_error(p)

    # ---- receives (comm thread) ----
    def _header(self, p: Peer) -> Header:
        """Read the next frame header from ``p``; control frames are handled here (ERROR
        raises, STATE is recorded and checked, BYE is noted) and returned for the caller to
        skip."""
        p.recv_exact(p._hdr)
        return self._parse(p)

    def _parse(self, p: Peer) -> Header:
        """``_header`` for a header already read into ``p._hdr``."""
        try:
            hdr = unpack_header(p._hdr)
        except FrameError as e:
            raise PeerError(p.rank, f"malformed frame from rank {p.rank}: {e}") from e
        p.heard_at = time.monotonic()
        if hdr.kind > P2P:
            self._control(p, hdr)
        return hdr

    def _reported(self, p: Peer, hdr: Header, text: str) -> PeerError:
        """The error that ``p``'s error frame ``hdr`` with reason ``text`` reports: its rank to
        blame and its reason, forwarded unchanged (``origin``) so messages do not nest."""
        blamed = hdr.sig.root
        if text.startswith(MISMATCH) and self._issued_otherwise_than_here(hdr):
            # A mismatch is between two ranks: the sender issued the op otherwise than this
            # rank did, so it is the peer that differs here, whoever it blamed (with three
            # ranks and one odd, the two that agree both name the odd one).
            return PeerError(p.rank, f"reported by rank {p.rank}: {text}", culprit=p.rank,
                             origin=text)
        if blamed == self.rank:  # this rank is the one the others gave up on: the fault is
            # here (its link broke, it stalled, or it issued the odd op), not at the rank that
            # says so
            said = (f"reported by rank {p.rank}" if text.startswith(MISMATCH)
                    else f"rank {p.rank} gave up on rank {self.rank}")
            return PeerError(p.rank, f"{said}: {text}", culprit=self.rank, origin=text)
        culprit = blamed if 0 <= blamed < self.size else p.rank
        return PeerError(p.rank, f"reported by rank {p.rank}: {text}", culprit=culprit,
                         origin=text, blame=blamed != BLAME_NOBODY)

    def _issued_otherwise_than_here(self, hdr: Header) -> bool:
        """Did the sender of error frame ``hdr`` issue its op (``error_frame``'s ``issued``)
        otherwise than this rank issued that op? False where either cannot tell."""
        mine = self._issued(hdr.seq) if hdr.seq else None
        theirs = hdr.sig
        if mine is None or theirs.op == 0:
            return False
        return (theirs.op, theirs.dtype, theirs.redop, theirs.count) != (
            mine.op, mine.dtype, mine.redop, mine.count)

    def _control(self, p: Peer, hdr: Header) -> None:
        if hdr.kind == ERROR:
            reason = bytearray(hdr.length)
            p.recv_exact(reason)
            raise self._reported(p, hdr, reason.decode("utf-8", "replace"))
        if hdr.kind == STATE:
            raw = bytearray(STATE_PAYLOAD.size)
            p.recv_exact(raw)
            (waits_for,) = STATE_PAYLOAD.unpack(raw)
            p.state = (hdr.seq, hdr.sig, waits_for)
            p.sent_since_state = False
            if hdr.seq:
                if hdr.seq > max(self.cur_seq, self.done_seq):
                    self._ahead.setdefault(hdr.seq, []).append((p.rank, hdr.sig))
                else:
                    self._compare(p.rank, hdr.seq, hdr.sig)
        elif hdr.kind == BYE:
            p.bye = True

    def _aside(self, p: Peer, hdr: Header) -> None:
        """A frame that is not the awaited one: stash data, fail on a BYE."""
        if hdr.kind == BYE:
            raise PeerError(p.rank, f"rank {p.rank} shut the group down while rank {self.rank} "
                                    "still waits for it")
        self._stash(p, hdr)

    def _stash(self, p: Peer, hdr: Header) -> None:
        """Keep a data or p2p frame read ahead of its op (control frames need no keeping)."""
        if hdr.kind == P2P:
            if not self._deliver(p, hdr):
                self._reserve(p, hdr)
                self._stashed += 1
                p.p2p_stash.append((hdr, p.read_payload(hdr), self._stashed))
        elif hdr.kind == DATA:
            self._check_early(p, hdr)
            self._reserve(p, hdr)
            p.coll_stash.append((hdr, p.read_payload(hdr)))

    def _has_room(self, nbytes: int) -> bool:
        return self._stash_bytes + nbytes <= STASH_MAX_BYTES

    def _reserve(self, p: Peer, hdr: Header) -> None:
        """Count a frame about to be stashed; raise where that would pass
        ``STASH_MAX_BYTES`` (this rank cannot get past it without keeping it)."""
        if not self._has_room(hdr.length):
            p2p = hdr.kind == P2P
            what = (f"a point-to-point message with tag {hdr.sig.root}" if p2p
                    else f"data of op #{hdr.seq}")
            advice = ("; post a send's receive before the ops that follow it (on NCCL and "
                      "gloo a send waits for its receive)" if p2p else "")
            raise PeerError(
                p.rank,
                f"rank {p.rank} sent {what} ({hdr.length} bytes) that rank {self.rank} would "
                f"have to keep until it is wanted, on top of the {self._stash_bytes} bytes "
                f"it keeps already (limit {STASH_MAX_BYTES}, mesh.STASH_MAX_BYTES), to reach "
                f"what it waits for behind it{advice}")
        self._stash_bytes += hdr.length

    def _check_early(self, p: Peer, hdr: Header) -> None:
        """A collective frame read ahead of its receive: stale or mismatched ones raise now."""
        if hdr.seq <= self.done_seq and hdr.seq != self.cur_seq:
            raise MismatchError(p.rank, self._completed_text(p, hdr))
        if hdr.seq == self.cur_seq and hdr.sig != self.cur_sig:
            raise MismatchError(p.rank, self._mismatch_text(p.rank, hdr.seq, self.cur_sig,
                                                            hdr.seq, hdr.sig))

    def _check(self, p: Peer, hdr: Header, seq: int, sig: Signature, nbytes: int) -> None:
        if hdr.group != self.group:
            raise MismatchError(p.rank, f"rank {p.rank} sent a frame of another group")
        if hdr.seq != seq or hdr.sig != sig:
            raise MismatchError(p.rank, self._frame_mismatch(p, hdr, seq, sig))
        if hdr.length != nbytes:
            raise MismatchError(
                p.rank,
                f"{MISMATCH} in op #{seq} {describe_signature(sig, self.describe)}: "
                f"rank {p.rank} sent {hdr.length} bytes where rank {self.rank} expects {nbytes}",
            )

    def _frame_mismatch(self, p: Peer, hdr: Header, seq: int, sig: Signature) -> str:
        """Explain a frame that does not belong to the op this rank is receiving for."""
        d = self.describe
        if hdr.seq == seq:
            return self._mismatch_text(p.rank, seq, sig, seq, hdr.sig)
        if hdr.seq < seq:  # a frame of an op this rank completed without it
            differs = self._issued_otherwise(p.rank, hdr.seq, hdr.sig)
            if differs is not None:
                return differs
            return (f"{MISMATCH}: rank {p.rank} sent data of op #{hdr.seq} "
                    f"{describe_signature(hdr.sig, d)} that rank {self.rank} completed without "
                    f"it; rank {self.rank} is at op #{seq} {describe_signature(sig, d)}")
        return (f"{MISMATCH}: rank {self.rank} issued op #{seq} "
                f"{describe_signature(sig, d)}, but rank {p.rank} completed that op without "
                f"rank {self.rank}'s data and already sent data of its op #{hdr.seq} "
                f"{describe_signature(hdr.sig, d)}: it issued a different op #{seq}")

    def recv_data(self, peer: int, seq: int, sig: Signature, buf,
                  expect: bytes | None = None) -> None:
        """Receive the next collective frame from ``peer`` into ``buf`` (exact length).

        ``expect``: the header that frame must carry, ``pack_header(DATA, sig, group, seq,
        len(buf))``. A byte-equal header passes every check ``_check`` makes, so the common
        case skips parsing; anything else takes the full path below.
        """
        p = self.peer(peer)
        mv = byte_view(buf)
        if p.coll_stash:
            hdr, data = p.coll_stash.popleft()
            self._stash_bytes -= len(data)
            self._check(p, hdr, seq, sig, len(mv))
            mv[:] = data
            return
        read = False
        if expect is not None:
            p.recv_exact(p._hdr)
            if p._hdr == expect:
                p.recv_exact(mv)
                return
            read = True
        while True:
            hdr = self._parse(p) if read else self._header(p)
            read = False
            if hdr.kind != DATA:
                self._aside(p, hdr)
                continue
            self._check(p, hdr, seq, sig, len(mv))
            p.recv_exact(mv)
            return

    def _take_p2p(self, p: Peer, hdr: Header, tag: int, mv: memoryview, dtype: int = 0) -> None:
        """Check a message against the receive it fills: the same bytes, and (``dtype`` given)
        the same dtype, so float bits are never read as integers without a word."""
        if hdr.length != len(mv):
            raise MismatchError(
                p.rank,
                f"rank {p.rank} sent {hdr.length} bytes with tag {tag}; "
                f"the receive buffer on rank {self.rank} holds {len(mv)}",
            )
        if dtype and hdr.sig.dtype and hdr.sig.dtype != dtype:
            theirs, mine = (describe_signature(Signature(hdr.sig.op, code), self.describe)
                            for code in (hdr.sig.dtype, dtype))
            raise MismatchError(
                p.rank,
                f"rank {p.rank} sent {theirs} with tag {tag}; the receive on rank "
                f"{self.rank} is {mine} (the same bytes, another dtype)",
            )

    def _from_stash(self, senders: Sequence[Peer], tag: int, mv: memoryview,
                    dtype: int = 0) -> Peer | None:
        """Fill ``mv`` with the message with ``tag`` that was read first from any of
        ``senders`` (a peer's own in order, and across peers in the order read, so a receive
        from any peer never leaves an early message behind later ones); return its sender, or
        None if none is stashed."""
        first: tuple[int, Peer, int] | None = None
        for p in senders:
            for i, (hdr, _, n) in enumerate(p.p2p_stash):
                if hdr.sig.root == tag:
                    if first is None or n < first[0]:
                        first = (n, p, i)
                    break
        if first is None:
            return None
        _, p, i = first
        hdr, data, _ = p.p2p_stash[i]
        self._take_p2p(p, hdr, tag, mv, dtype)
        del p.p2p_stash[i]
        self._stash_bytes -= len(data)
        mv[:] = data
        return p

    # ---- posted receives (comm thread) ----
    def post_recv(self, src: int | None, tag: int, buf,
                  on_filled: Callable[[PostedRecv], None], dtype: int = 0) -> PostedRecv:
        """Receive the next message with ``tag`` from ``src`` (None: any peer) into ``buf``
        without waiting for it: ``on_filled`` is called (on the reading thread) once it is
        there, at once if it was read ahead already. Messages from one peer with one tag fill
        receives in the order they were posted."""
        pr = PostedRecv(src, tag, byte_view(buf), time.monotonic(), on_filled, dtype)
        p = self._from_stash(self._senders(src), tag, pr.buf, dtype)
        if p is not None:
            self._filled(pr, p)
            return pr
        self.posted.add(pr)
        if src is None:  # a message held in its socket may be this receive's now
            self._held.clear()
        else:
            self._held.discard(src)
        return pr

    def _senders(self, src: int | None) -> list[Peer]:
        """The peers a receive from ``src`` (None: any) may take its message from."""
        return [self.peer(src)] if src is not None else self._live()

    def _filled(self, pr: PostedRecv, p: Peer) -> None:
        pr.source = p.rank
        p.delivered_at = time.monotonic()
        self._probe_round += 1  # a later wait for this peer is news again
        pr.on_filled(pr)

    def _receiver(self, p: Peer, hdr: Header) -> PostedRecv | None:
        """The posted receive a p2p frame from ``p`` fills (None: nobody has asked for it yet,
        or an older message with its tag waits in the stash)."""
        tag = hdr.sig.root
        if not self.posted or any(h.sig.root == tag for h, _, _ in p.p2p_stash):
            return None
        return self.posted.match(p.rank, tag)

    def _deliver(self, p: Peer, hdr: Header) -> bool:
        """A p2p frame whose header was just read from ``p``: read its payload straight into
        the posted receive that wants it; False if none does (the caller stashes it)."""
        pr = self._receiver(p, hdr)
        if pr is None:
            return False
        self.posted.remove(pr)
        self._take_p2p(p, hdr, pr.tag, pr.buf, pr.dtype)
        p.recv_exact(pr.buf)
        self._filled(pr, p)
        return True

    def serve(self, timeout_s: float, wake: socket.socket) -> None:
        """The comm thread is idle while receives are posted or sends are on their way: wait up
        to ``timeout_s`` for bytes from any peer (or a byte on ``wake``: new work), then read
        every complete frame that arrived: messages for posted receives straight into their
        buffers, other small messages stashed (a large one stays in the socket for the receive
        posted later, unless a posted receive may want a later message of its sender), small
        frames of a later collective stashed (a large one stays in the socket for its op),
        control frames handled (an error frame or a dead peer raises). Raises when a posted
        receive waited the group timeout."""
        if self.closed:
            raise PeerError(self.rank, "the process group was shut down")
        self._polling = True  # a stalled read in here must not probe or poll
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(wake, selectors.EVENT_READ, None)
                for q in self._live():
                    if not q.eof and q.rank not in self._held:
                        sel.register(q.sock, selectors.EVENT_READ, q)
                ready: list[Peer] = []
                for key, _ in sel.select(timeout_s):
                    if key.data is not None:
                        ready.append(key.data)
                        continue
                    try:
                        wake.recv(4096)
                    except OSError:
                        pass
                self._read_round_robin(ready)
        finally:
            self._polling = False
        self._check_posted()

    def _read_round_robin(self, ready: list[Peer]) -> None:
        """Read the whole frames that arrived from the ``ready`` peers, a frame from each in
        turn (at most ``POLL_FRAMES`` each): messages from several peers are stashed in about
        the order they arrived, which a receive from any peer then follows (gloo's too)."""
        for turn in range(POLL_FRAMES):
            still = []
            for q in ready:
                # a large message nobody asked for stays in the socket (its receive, posted
                # later, takes it straight from there) unless a posted receive may want a
                # later message of that peer, which waits behind it
                read = self._poll_peer(q, any_p2p=self.posted.asks_for(q.rank), limit=1)
                if read is None:
                    self._held.add(q.rank)
                elif read:
                    still.append(q)
                elif turn == 0 and not q.eof:
                    # readable, but not a whole header yet: wait for the rest of it here
                    # (rather than spin on the select), or for the end of the stream
                    self._stash(q, self._header(q))
            if not still:
                return
            ready = still

    def _check_posted(self) -> None:
        """Tell the peers what a posted receive waits for once it waited ``probe_s``; raise
        once it waited the group timeout, or when its sender has shut the group down. The wait
        counts from when it was posted or its sender's last message filled a receive, so a
        long queue of receives that their sender is filling never times out."""
        if not self.posted:
            return
        now = time.monotonic()
        for pr in self.posted.oldest_per_source():
            senders = self._senders(pr.src)
            if all(q.eof for q in senders):
                who = f"rank {pr.src}" if pr.src is not None else "every peer"
                text = (f"{who} shut the group down before sending the message with tag "
                        f"{pr.tag} that rank {self.rank} waits for")
                raise PeerError(-1 if pr.src is None else pr.src, text,
                                blame=pr.src is not None)
            waited = now - max(pr.since, max(q.delivered_at for q in senders))
            if waited >= self.probe_s:
                self._probe(pr.src if pr.src is not None else -1)
            if waited < self.timeout_s:
                continue
            if pr.src is None:
                raise PeerError(-1, f"no message with tag {pr.tag} from any rank for "
                                    f"{seconds_text(waited)} (group timeout){self._gone()}"
                                    f"{self._other_tags(senders)}",
                                blame=False)  # none sent: no peer to blame
            raise PeerError(pr.src, f"no message with tag {pr.tag} from rank {pr.src} for "
                                    f"{seconds_text(waited)} (group timeout)"
                                    f"{self._waits_on_us(self.peer(pr.src))}"
                                    f"{self._other_tags(senders)}")

    @staticmethod
    def _other_tags(senders: Sequence[Peer]) -> str:
        """For a receive that timed out: the messages of ``senders`` that arrived with other
        tags and wait unread (a tag mismatch between sender and receiver)."""
        unread = [(q.rank, sorted({h.sig.root for h, _, _ in q.p2p_stash})) for q in senders
                  if q.p2p_stash]
        if not unread:
            return ""
        said = "; ".join(f"rank {r} with tag{'s' if len(t) > 1 else ''} "
                         f"{', '.join(map(str, t[:8]))}" for r, t in unread)
        return f"; messages that no receive asked for wait here from {said}"

    def _read_one(self, p: Peer, tag: int, mv: memoryview) -> bool:
        """Read one frame from ``p``; True if it was the awaited p2p message (now in mv)."""
        hdr = self._header(p)
        if hdr.kind == P2P and hdr.sig.root == tag:
            self._take_p2p(p, hdr, tag, mv)
            p.recv_exact(mv)
            return True
        self._aside(p, hdr)
        return False

    def recv_p2p_any(self, tag: int, buf, deadline: float) -> int:
        """Receive a p2p message with ``tag`` from whichever peer sends first; return its rank."""
        mv = byte_view(buf)
        live = self._live()
        p = self._from_stash(live, tag, mv)
        if p is not None:
            return p.rank
        with selectors.DefaultSelector() as sel:
            for p in live:
                if not p.eof:
                    sel.register(p.sock, selectors.EVENT_READ, p)
            while True:
                if self.closed:
                    raise PeerError(self.rank, "the process group was shut down")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"no message with tag {tag} from any rank before the timeout")
                if not sel.get_map():
                    raise PeerError(-1, "every peer shut the group down", blame=False)
                for key, _ in sel.select(min(left, self.probe_s)):
                    p = key.data
                    if p.bye and p.at_eof():
                        sel.unregister(p.sock)
                        continue
                    if self._read_one(p, tag, mv):
                        return p.rank

    # ---- the slow path: blocked for probe_s or more ----
    def _stalled(self, p: Peer, got: int, stall: list | None) -> list:
        """Called by ``p.recv_exact`` each time its socket timed out (comm thread)."""
        now = time.monotonic()
        if self.closed:
            raise PeerError(p.rank, "the process group was shut down")
        if stall is None or stall[1] != got:
            stall = [now - self.probe_s if stall is None else now, got]
        waited = now - stall[0]
        self.silent = (p.rank, stall[0])
        if waited >= self.timeout_s and not self._excused(p, waited):
            raise PeerError(p.rank, f"no data from rank {p.rank} for {seconds_text(waited)} "
                                    f"(group timeout){self._waits_on_us(p)}"
                                    f"{self._alone_since(p, stall[0])}")
        if not self._polling:
            self._poll(p)  # first: what the others sent is read before they are probed
            self._probe(p.rank)
        return stall

    def _gone(self) -> str:
        """The peers that have shut the group down (for a receive from any peer that timed
        out: they cannot be the sender it waits for)."""
        gone = [q.rank for q in self._live() if q.bye or q.eof]
        if not gone:
            return ""
        ranks = ", ".join(map(str, gone))
        return f"; rank{'s' if len(gone) > 1 else ''} {ranks} shut the group down"

    def _waits_on_us(self, p: Peer) -> str:
        """The silent peer's STATE, where it says the peer waits for this rank (and this rank
        sent it nothing since) in another op: the two wait on each other, which a timeout
        alone does not explain. Both blocked in the same collective means bytes that never
        arrived (a link lost in one direction), not an ordering, so no hint then."""
        st = p.state
        if (st is None or st[2] != self.rank or p.sent_since_state
                or (st[0] and st[0] == self.cur_seq)):
            return ""
        what = (f"op #{st[0]} {describe_signature(st[1], self.describe)}" if st[0]
                else "a point-to-point op")
        return (f"; rank {p.rank} last reported waiting for rank {self.rank} in {what}: each "
                "waits for the other (a group runs its collectives one at a time in the order "
                "each rank issued them, and a blocking receive keeps its caller from issuing "
                "what follows it; did the two ranks issue their ops in different orders?)")

    def _alone_since(self, p: Peer, since: float) -> str:
        """Where no other peer sent a frame either since ``since``: a hint that this rank may
        be the one cut off. Ranks stalled in a collective tell every peer so (STATE frames),
        so a rank that hears from none of them may have lost its own link; but peers with
        nothing to send (done with the op) are silent too, so the peer stays the one named."""
        others = [q for q in self._live() if q is not p]
        if not others or any(q.heard_at >= since for q in others):
            return ""
        return (f"; nothing came from any other rank either since then (if they wait too, "
                f"the link of rank {self.rank} itself may be the one down)")

    def _excused(self, p: Peer, waited: float) -> bool:
        """The awaited peer said it is itself blocked on a third rank, in this op or in the
        one before it (a rank that got all it needed of an op goes on to the next while its
        neighbour still waits in that op's last step): give that rank's neighbour time to
        report the real culprit (at most one more timeout)."""
        st = p.state
        return (st is not None and st[0] != 0 and self.cur_seq - 1 <= st[0] <= self.cur_seq
                and st[2] not in (-1, self.rank) and waited < 2 * self.timeout_s)

    def _probe(self, waits_for: int) -> None:
        """Tell every peer, once per (op, awaited rank), what this rank is blocked in.

        Not a peer whose bytes wait unread here: it may have said BYE behind them and closed,
        and a write to a closed socket makes its kernel reset the connection, which throws
        away every byte it sent that this rank had not read yet. What has arrived whole from
        such a peer is read first (a peer blocked on this rank probes it at about the moment
        this rank probes, a wait of one probe interval after the other: skipped then, it went
        unprobed until the timeout, and named this rank instead of the rank this one waits
        for); only a peer whose bytes are still unread after that gets the probe on a later
        stall, once they are read (it is alive and talking meanwhile)."""
        mark = (self.cur_seq, waits_for, self._probe_round)
        payload = header = None
        for q in self._live():
            if q.send_error is not None or q.bye or q.probed == mark:
                continue
            if q.has_unread() and (q.rank == waits_for or not self._read_arrived(q)):
                continue
            if header is None:
                payload = STATE_PAYLOAD.pack(waits_for)
                header = pack_header(STATE, self.cur_sig, self.group, self.cur_seq,
                                     len(payload))
            q.probed = mark
            try:
                q.enqueue(header, payload)
            except PeerError:
                pass

    def _read_arrived(self, q: Peer) -> bool:
        """Read ``q``'s frames that have arrived whole, as ``_poll`` does (control frames
        handled, small ones stashed); whether nothing of it is left unread then."""
        if self._polling or q.eof:
            return False
        self._polling = True
        try:
            self._poll_peer(q)
        finally:
            self._polling = False
        return not q.has_unread()

    def _peek_header(self, q: Peer) -> Header | None:
        """The header of ``q``'s next frame if all of it has arrived, left in the socket (None:
        not yet, or the end of the stream after a BYE, which sets ``q.eof``). A dead or
        garbled connection raises PeerError."""
        raw = q.peek(HEADER_SIZE)
        if raw is None:
            return None
        if not raw:
            if q.bye:
                q.eof = True
                return None
            raise q._closed_error()
        if len(raw) < HEADER_SIZE:
            return None
        try:
            return unpack_header(raw)
        except FrameError as e:
            raise PeerError(q.rank, f"malformed frame from rank {q.rank}: {e}") from e

    def _poll(self, awaited: Peer | None) -> None:
        """Read what the other peers sent without blocking: error frames and probes are handled,
        small frames stashed, EOF without a BYE (a dead process) raises."""
        self._polling = True
        try:
            for q in self.peers:
                if q is not None and q is not awaited and not q.eof:
                    self._poll_peer(q)
        finally:
            self._polling = False

    def _poll_peer(self, q: Peer, any_p2p: bool = False, limit: int = POLL_FRAMES) -> int | None:
        """Read ``q``'s frames that have arrived whole (at most ``limit``); return how
        many, or None where it stopped at a frame too large to stash (or that the stash has no
        room for), left in the socket. A p2p message a posted receive wants is always read
        (into that receive); other large frames, a later collective's too, only with
        ``any_p2p`` (a posted receive may want a message behind them: rank 0 queues an async
        scatter, then the message its peer waits for before it joins the scatter)."""
        for n in range(limit):
            peeked = self._peek_header(q)
            if peeked is None:
                return n
            if peeked.kind <= P2P and (peeked.length > POLL_STASH_MAX
                                       or not self._has_room(peeked.length)):
                if peeked.kind == DATA:
                    self._check_early(q, peeked)
                if not any_p2p and (peeked.kind == DATA or self._receiver(q, peeked) is None):
                    return None
            self._stash(q, self._header(q))
        return limit

    # ---- what the peers sent that was never read (clean shutdown) ----
    def unread(self, grace_s: float) -> list[str]:
        """After a clean shutdown's BYE: what the peers sent that this rank never read, up to
        each peer's own BYE (waited for at most ``grace_s``; a peer still busy by then is
        skipped). Why: an op that only sends on some ranks (a small broadcast whose ranks
        named different roots) completes everywhere, and without a later op to trip over its
        data the mismatch would pass silently. Returns one explanation per finding: data of an
        op this rank issued differently or never, a peer's probe for such an op, a
        point-to-point message nobody received. (A peer's error report is none: that peer
        raised it to its own caller.) Only the shutting-down thread may call this (the comm
        thread has stopped)."""
        found = [self._unread_text(p, hdr) for p in self._live()
                 for hdr in [h for h, _ in p.coll_stash] + [h for h, _, _ in p.p2p_stash]]
        found += [self._never_issued(r, seq, sig) for seq, probes in sorted(self._ahead.items())
                  for r, sig in probes]
        deadline = time.monotonic() + grace_s
        self._polling = True  # a stalled read here must not probe or poll
        try:
            with selectors.DefaultSelector() as sel:
                for p in self._live():
                    if not (p.bye or p.eof) and not self._scan(p, found):
                        sel.register(p.sock, selectors.EVENT_READ, p)
                while sel.get_map():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        log.debug("rank %d: no BYE from ranks %s within %.1fs of shutdown",
                                  self.rank, sorted(k.data.rank for k in
                                                    sel.get_map().values()), grace_s)
                        break
                    for key, _ in sel.select(left):
                        if self._scan(key.data, found):
                            sel.unregister(key.fileobj)
        finally:
            self._polling = False
        return list(dict.fromkeys(found))  # a stray op's chunks explain it once

    def _scan(self, p: Peer, found: list[str]) -> bool:
        """Read ``p``'s frames that have arrived; True once there is nothing more to learn from
        it (its BYE, the end of its stream, or a finding added to ``found``)."""
        for _ in range(POLL_FRAMES):
            try:
                hdr = self._peek_header(p)
            except PeerError:  # gone without a BYE (exited without shutting down): not a
                return True    # finding, and nothing more to read
            if hdr is None:
                return p.eof
            if hdr.kind in (DATA, P2P):
                found.append(self._unread_text(p, hdr))
                return True
            try:
                self._header(p)  # a control frame: STATE is checked, BYE noted, ERROR raises
            except MismatchError as e:
                found.append(str(e))
                return True
            except PeerError:  # the peer failed and said so: it raised there, to its caller
                return True
            if hdr.kind == STATE and hdr.seq > max(self.cur_seq, self.done_seq):
                found.append(self._never_issued(p.rank, hdr.seq, hdr.sig))  # it waits there
                return True
            if p.bye:
                return True
        return False

    def _unread_text(self, p: Peer, hdr: Header) -> str:
        if hdr.kind == P2P:
            return (f"rank {p.rank} sent rank {self.rank} a point-to-point message (tag "
                    f"{hdr.sig.root}, {hdr.length} bytes) that rank {self.rank} never received")
        if hdr.seq > self.done_seq:
            return self._never_issued(p.rank, hdr.seq, hdr.sig)
        return self._completed_text(p, hdr)

    def _completed_text(self, p: Peer, hdr: Header) -> str:
        """Explain a collective frame of an op this rank already completed without it."""
        return self._issued_otherwise(p.rank, hdr.seq, hdr.sig) or (
            f"{MISMATCH}: rank {p.rank} sent rank {self.rank} data for op #{hdr.seq} "
            f"{describe_signature(hdr.sig, self.describe)} that rank {self.rank} did not "
            "expect (it completed that op)")

    def _never_issued(self, r: int, seq: int, sig: Signature) -> str:
        last = (f"its last was op #{self.done_seq}" if self.done_seq
                else "it issued no collective")
        return (f"{MISMATCH}: rank {r} issued op #{seq} {describe_signature(sig, self.describe)}"
                f", which rank {self.rank} never issued ({last} before shutting the group "
                "down)")

    # ---- failure and shutdown ----
    def fail(self, reason: str, culprit: int | None = None, seq: int = 0,
             nobody: bool = False) -> None:
        """Tell every peer why this rank gives up (blaming ``culprit`` if known; with
        ``nobody``, no rank: else the peers blame this one), then close the connections
        shortly after."""
        if self.failed:
            return
        self.failed = True
        blamed = culprit if culprit is not None else (BLAME_NOBODY if nobody else -1)
        header, text = error_frame(reason, self.group, seq, blamed,
                                   self._issued(seq) if seq else None)
        for p in self._reachable():
            try:
                p.enqueue(header, text)
            except Exception:  # noqa: BLE001 - best effort
                pass
        t = threading.Timer(ERROR_LINGER_S, self.close)
        t.daemon = True
        t.start()

    def say_bye(self, deadline: float) -> None:
        """Clean shutdown: tell every peer, so a rank still blocked elsewhere does not take the
        closing connection for a crash."""
        header = pack_header(BYE, Signature(0), self.group, 0, 0)
        sent = []
        for p in self._reachable():
            try:
                p.enqueue(header, b"")
                sent.append(p.rank)
            except PeerError:
                pass
        try:
            self.flush(sent, deadline, poll=False)
        except PeerError:
            pass

    def close(self, tell: str | None = None) -> None:
        """Shut every socket down; unblocks any thread waiting on them. ``tell``: first write
        that reason as an error frame to each peer whose socket takes it at once (an abort:
        its peers read why instead of a closed connection, as from a dead process; nothing
        here waits for a busy or full connection). The frame is numbered with the first
        collective this rank did not complete, so a peer that comes to that op later and
        finds this rank's data of it waiting fails it too (``check_reports``)."""
        with self._close_lock:
            if self.closed:
                return
            self.closed = True
        if tell is not None and not self.failed:
            header, text = error_frame(tell, self.group, seq=self.done_seq + 1,
                                       blamed=-1)  # (this rank)
            for p in self._reachable():
                try:
                    p.write_now(header, text, copy_rest=True)
                except (PeerError, OSError):
                    pass
        for p in self._live():
            p.stop()
            try:
                p.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def dispose(self, join_s: float = 2.0) -> None:
        """Close and release the sockets once no thread uses them any more."""
        self.close()
        deadline = time.monotonic() + join_s
        for p in self._live():
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self._live():
            p.discard_unread()
            try:
                p.sock.close()
            except OSError:
                pass
