"""Who talks to whom: publish each rank's listen address in the c10d store, share a per-job
secret, build the full mesh of authenticated connections of one group, and agree on how many
cores each rank of the group can count on.

Keys are namespaced per torchrun attempt, because torchrun keeps its store across elastic
restarts and a dead attempt's keys are still there, and per ``init_process_group`` on that
store, because torch reuses group names after ``destroy_process_group``. A rank of a group is
claimed once there, so two jobs sharing a store by mistake fail instead of pairing up.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import secrets
import selectors
import socket
import threading
import time
import zlib
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

from . import handshake, machine
from .address import join_host_port, split_host_port, stream_address, through_own_interface
from .fdlimit import GROUP_EXTRA_FDS, make_room
from .framing import ERROR, HEADER_SIZE, after_states, error_frame
from .tcp import peek, seconds_text, swap_congestion_control

log = logging.getLogger("mccl.rendezvous")

#: How long one unauthenticated connection may take to say hello before it is dropped.
HELLO_TIMEOUT_S = 5.0
#: The key (in a group's namespace) where a rank that stopped waiting for the others
#: leaves its reason for those still to come (``give_up``).
GAVE_UP_KEY = "gave_up"
#: Under it, a count of the ranks that gave up and, numbered from 1, who they were, so a
#: waiting rank sees with one read that the group can no longer form.
GAVE_UP_COUNT = GAVE_UP_KEY + "/count"
GAVE_UP_WHO = GAVE_UP_KEY + "/who/"
#: The ranks that gave up named in a ``GaveUpError``: the first ones are the cause, the
#: later ones gave up because of them (their reasons, which say ``CANNOT_FORM``, are left out).
GAVE_UP_NAMED = 3
CANNOT_FORM = "cannot form: a rank stopped waiting for it"
#: The rank a process leaves its word under when it has no rank of the group (its own is
#: out of range): every rank of the group takes note of it, whatever the members.
NO_RANK = -1
#: A waiting rank looks for the keys it waits for (and for a rank that gave up) after this
#: long, then twice as long each time, up to ``WAIT_POLL_MAX_S``: a blocking wait on the store
#: could not also notice that a rank had given up, so the others waited out the whole group
#: timeout (30 minutes by default) for a rank that had failed at once.
WAIT_POLL_FIRST_S = 0.001
WAIT_POLL_MAX_S = 0.05
#: A rank that gives up keeps the store (which one of them hosts) up until every rank of the
#: group has seen that and given up too, or this long: the others then read why.
GAVE_UP_LINGER_S = 2.0
#: A store call (``BoundedStore``) gets the group timeout and this much more: a ``get`` that
#: the store itself bounds by the group timeout ends by its own limit first.
STORE_GRACE_S = 1.0
#: The thread that runs a store's calls ends once it had none for this long.
STORE_IDLE_S = 1.0
#: Pause between attempts to reach a peer whose listener is not up yet.
CONNECT_RETRY_S = 0.05
#: A rank listens before it publishes its address and keeps listening until every rank that
#: dials it has connected, so a dial refused there means the rank is gone: killed, or failed
#: without leaving a reason (a full listen backlog drops a dial on Linux and macOS, it does
#: not refuse it). Dials refused this long fail, and the others learn it at once
#: (``give_up``) instead of waiting out the group timeout for the rank's dial.
REFUSED_FOR_S = 2.0
#: How often a dial or the acceptor looks whether a rank gave up (``GiveUpWatch``), and the
#: acceptor whether a connected peer went away (``_Acceptor.hear_from``).
GIVE_UP_LOOK_S = 0.25
#: What the acceptor peeks at, leaving it there, on a connection of a group still forming
#: (a peer whose own set-up is done may already send an op's frames on it): room for an error
#: frame's reason behind a few state frames.
EARLY_PEEK_BYTES = 1 << 16
#: How long a rank still forming keeps waiting for its missing peers' dials once a connected
#: peer reported that its first op failed for a reason that blames none of them (ops run as
#: soon as a rank's own connections are up: a mismatch between two formed ranks is no sign
#: that the rank still to dial is gone; that failure reaches this rank's first op instead).
REPORTED_FAILURE_GRACE_S = 10.0
#: Listen backlog, at least the group's size (the kernel caps it: somaxconn, 128 by default on
#: macOS); ranks dial their lower-numbered peers nearest first, so no rank gets every dial at
#: once (64 ranks on one machine with a backlog of 4: 6.3 s to connect dialling rank 0 first,
#: 1.1 s nearest first; `benchmarks/mesh_setup.py`).
LISTEN_BACKLOG = 128
#: Unauthenticated connections held at once; beyond this the oldest is dropped.
MAX_PENDING = 256
_TRANSIENT_ACCEPT = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM,
                     errno.ECONNABORTED, errno.EPROTO}


class Store(Protocol):
    def set(self, key: str, value: str | bytes) -> None: ...
    def get(self, key: str) -> bytes: ...
    def add(self, key: str, amount: int) -> int: ...
    def check(self, keys: list[str]) -> bool: ...


class BoundedStore:
    """A c10d store whose calls give up after ``limit_s``: torch's TCPStore client waits for
    some replies (``add``, ``set``) with no limit of its own, so a rank whose link to the
    store's host went down while its group formed sat in one of them for as long as TCP kept
    retransmitting (about 15 minutes on Linux), long after the group timeout. The calls run
    on a daemon thread; one that does not return in time is left there (the process is about
    to fail: its group cannot form) and this raises ``TimeoutError``, as does every later call
    at once (the client answers one call at a time: they would queue behind it). Other
    attributes pass through."""

    _CALLS = frozenset({"set", "get", "add", "check", "wait", "multi_get", "multi_set",
                        "compare_set", "delete_key", "num_keys"})

    def __init__(self, store: Store, limit_s: float):
        self.store, self.limit_s = store, limit_s
        self.stuck: str | None = None  # the call that did not return, once one did not
        self._calls = _StoreCalls()

    def __getattr__(self, name: str):
        attr = getattr(self.store, name)
        if name not in self._CALLS:
            return attr
        return lambda *args, **kwargs: self._call(name, attr, args, kwargs)

    def _call(self, name: str, fn: Callable, args: tuple, kwargs: dict):
        if self.stuck is not None:
            raise TimeoutError(f"the rendezvous store gave no answer to an earlier "
                               f"{self.stuck}() within {self.limit_s:g}s (the group's timeout)")
        box: list = []
        done = threading.Event()
        self._calls.put((fn, args, kwargs, box, done))
        if not done.wait(self.limit_s + STORE_GRACE_S):
            self.stuck = name
            raise TimeoutError(f"the rendezvous store gave no answer to {name}() within "
                               f"{self.limit_s:g}s (the group's timeout): is the host it runs "
                               "on still reachable from here?")
        ok, value = box[0]
        if not ok:
            raise value
        return value


class _StoreCalls:
    """``BoundedStore``'s queue of calls and the thread that runs them in turn, ending once
    idle (a thread per call cost set-up more). The thread holds no reference to the store
    between calls: a FileStore deletes its file when its last user lets go of it, and a
    process exiting right after destroying its group (the thread still idle then) left the
    file behind, with keys that failed every later job on that path."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._serving = False

    def put(self, job: tuple) -> None:
        with self._lock:
            self._jobs.put(job)
            if not self._serving:
                self._serving = True
                threading.Thread(target=self._serve, name="mccl-store", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                fn, args, kwargs, box, done = self._jobs.get(timeout=STORE_IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():
                        self._serving = False
                        return
                continue
            try:
                box.append((True, fn(*args, **kwargs)))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                box.append((False, e))
            finally:
                # The store goes before the caller hears back: released after ``set``, a
                # caller that destroys its group and exits at once may find it still held
                # here, and a file:// init file then stays behind.
                fn = args = kwargs = box = None
                done.set()
                done = None


class PeerGoneError(ConnectionError):
    """A connected peer closed its connection, or reported that it failed, while this rank
    still waited for its group to form: the group cannot form."""


class StoreFailedError(ConnectionError):
    """The rendezvous store failed while the group formed (its host may have exited): the
    group cannot form, and no word left in that store would reach anyone."""


class GaveUpError(ConnectionError):
    """A rank of the group stopped waiting for it (its reason is in the message): the group
    cannot form, so the ranks still waiting give up too instead of waiting out the timeout."""


def await_ranks(store: Store, ns: str, what: str, ranks: list[int], timeout_s: float,
                members: Sequence[int] | None = None, label: str = "rank(s)",
                among: Collection[int] | None = None) -> None:
    """Wait (at most ``timeout_s``, the group's timeout) until every rank in ``ranks`` has
    published its ``{ns}{what}/{rank}`` key. Raises ``GaveUpError`` as soon as a rank of the
    group has given up on it (``give_up``), with that rank's reason (a rank arriving after the
    others gave up learns why at once); the timeout's error names the ranks that did not come.
    ``members``: the global rank of each of the group's ranks, where ``ranks`` count within
    the group (give-up notes are kept by global rank: ranks that disagree on the members of a
    group of one name share its key space; the timeout's error gives both). ``label`` names what
    ``ranks`` count ("global rank(s)" where they are global ranks). ``among``: see
    ``GiveUpWatch``."""
    keys = [f"{ns}{what}/{r}" for r in ranks]
    if not keys:
        return
    watch = GiveUpWatch(store, ns, members, among, waiting_for=f"{label} {ranks}")
    deadline = time.monotonic() + max(timeout_s, 0.001)
    pause = WAIT_POLL_FIRST_S
    while True:
        try:
            if store.check(keys):
                return
        except Exception as e:  # noqa: BLE001 - torch raises DistNetworkError and kin
            raise watch.store_failed(e) from e
        watch.look()
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(pause, left))
        pause = min(2 * pause, WAIT_POLL_MAX_S)
    missing = [r for r, k in zip(ranks, keys, strict=True) if not _has(store, k)]
    who = f"{label} {missing}"
    if members and any(members[r] != r for r in missing):
        who += f" (global {[members[r] for r in missing]})"
    raise TimeoutError(f"mccl group '{watch.group}': {who} did not join within "
                       f"{seconds_text(timeout_s)} (the group's timeout)")


#: ``(global ranks) -> reason or None``: why one of those ranks is known to be gone, from a
#: connection this process already has to it (``watch_liveness``); None: nothing to ask.
_known_gone: Callable[[Collection[int]], str | None] | None = None


def watch_liveness(known_gone: Callable[[Collection[int]], str | None] | None) -> None:
    """Let every set-up wait ask ``known_gone`` about the ranks of the group it forms: one
    whose process is known to be gone fails the set-up at once, instead of the group timeout
    later (the process group module answers from the default group's connections)."""
    global _known_gone
    _known_gone = known_gone


class GiveUpWatch:
    """Has a rank of the group given up on it (``give_up``)? Every wait of a group's set-up
    looks: the waits on the store (``await_ranks``) and those on the peers (a dial, the
    acceptor), so one rank's failure fails the others at once, with its reason.

    ``among``: the global ranks whose giving up means the group cannot form (default:
    ``members``, else any rank; ranks that passed ``new_group`` other member lists share the
    group's name, not its fate). ``every_s``: the store is read at most this often."""

    def __init__(self, store: Store, ns: str, members: Sequence[int] | None = None,
                 among: Collection[int] | None = None, waiting_for: str = "its ranks",
                 every_s: float = 0.0):
        self.store, self.ns, self.every_s = store, ns, every_s
        self.group = ns.rstrip("/").rsplit("/", 1)[-1]
        self.waiting_for = waiting_for
        self._fate = set(among if among is not None else members if members is not None
                         else ())
        self._seen: list[tuple[int, str]] = []
        self._next = 0.0
        self._next_gone = 0.0

    def look(self, now: bool = False) -> None:
        """Raise ``GaveUpError`` if a rank of the group gave up (``every_s`` after the last
        look at the earliest, unless ``now``), ``PeerGoneError`` if a member is known to be
        gone (``watch_liveness``; asked at most every ``GIVE_UP_LOOK_S``: it peeks a socket
        per member)."""
        t = time.monotonic()
        if t < self._next and not now:
            return
        self._next = t + self.every_s
        try:
            quit_ = [(g, n) for g, n in _who_gave_up(self.store, self.ns, self._seen)
                     if not self._fate or g in self._fate or g == NO_RANK]
        except Exception as e:  # noqa: BLE001 - torch raises DistNetworkError and kin
            raise self.store_failed(e) from e
        if quit_:
            causes = [(g, n) for g, n in quit_ if CANNOT_FORM not in n] or quit_
            said = "; ".join(f"{'a process' if g == NO_RANK else f'global rank {g}'}: {note}"
                             for g, note in causes[:GAVE_UP_NAMED])
            raise GaveUpError(f"mccl group '{self.group}' {CANNOT_FORM} ({said})")
        known_gone = _known_gone
        if known_gone is None or not self._fate or (t < self._next_gone and not now):
            return
        self._next_gone = t + GIVE_UP_LOOK_S
        why = known_gone(self._fate)
        if why is not None:
            raise PeerGoneError(f"mccl group '{self.group}' cannot form: {why}")

    def store_failed(self, e: BaseException) -> StoreFailedError:
        return store_failed(self.group, f"waiting for {self.waiting_for}", e)


def store_failed(group: str, when: str, e: BaseException) -> StoreFailedError:
    """The error for a store call of group ``group``'s set-up that failed (``when``)."""
    return StoreFailedError(
        f"mccl group '{group}': the rendezvous store failed while {when}: {e} (the process "
        "hosting the store, rank 0 unless torchrun's agent hosts it, may have exited: its own "
        "error says why)")


def leave_word(store: Store, group_name: str, global_rank: int,
               error: BaseException) -> None:
    """Leave word, for the group's other ranks (waiting, or still to come), that this rank
    stopped waiting for the group and why; once per rank and group (a second call keeps the
    first reason). Best effort: the store may be what failed. A rank leaves it before it
    closes its connections, so a peer that sees them close finds the reason
    (``_Acceptor.hear_from``) and does not blame a rank that is alive."""
    ns = namespace(group_name)
    key = f"{ns}{GAVE_UP_KEY}/{global_rank}"
    try:
        if store.check([key]):
            return
        store.set(key, str(error))
        count = store.add(ns + GAVE_UP_COUNT, 1)
        store.set(f"{ns}{GAVE_UP_WHO}{count}", str(global_rank))
    except Exception:  # noqa: BLE001
        log.debug("could not leave the give-up note for group %s", group_name, exc_info=True)


def hosts_the_store(global_rank: int) -> bool:
    """Does this global rank's process host the job's store? Global rank 0's does under
    torch's ``tcp://`` and ``env://`` rendezvous, unless torchrun's agent hosts it."""
    return global_rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"


def give_up(store: Store, group_name: str, global_rank: int, error: BaseException,
            size: int = 0) -> None:
    """Leave word that this rank gave up (``leave_word``), then ``await_give_ups``."""
    leave_word(store, group_name, global_rank, error)
    await_give_ups(store, group_name, size)


def await_give_ups(store: Store, group_name: str, size: int) -> None:
    """Wait until all ``size`` ranks have given up (``leave_word``), at most
    ``GAVE_UP_LINGER_S``, so that a store this process hosts is still there when the others
    look (``size`` 0: return at once)."""
    if size <= 0:
        return
    ns = namespace(group_name)
    try:
        count = store.add(ns + GAVE_UP_COUNT, 0)
        deadline = time.monotonic() + GAVE_UP_LINGER_S
        while count < size and time.monotonic() < deadline:
            time.sleep(WAIT_POLL_MAX_S)
            count = store.add(ns + GAVE_UP_COUNT, 0)
    except Exception:  # noqa: BLE001
        log.debug("could not count the give-ups of group %s", group_name, exc_info=True)


def _who_gave_up(store: Store, ns: str, seen: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """(global rank, reason) of the ranks that gave up on groups of this name (``give_up``),
    in order; ``seen`` holds those read by earlier calls of one wait (extended here), so each
    is read once."""
    count = store.add(ns + GAVE_UP_COUNT, 0)
    for i in range(len(seen) + 1, count + 1):
        key = f"{ns}{GAVE_UP_WHO}{i}"
        if not store.check([key]):  # counted, not yet named: the next look finds it
            break
        g = int(store.get(key).decode())
        seen.append((g, _note(store, ns, g) or "no reason given"))
    return seen


def _note(store: Store, ns: str, global_rank: int) -> str | None:
    key = f"{ns}{GAVE_UP_KEY}/{global_rank}"
    try:
        return store.get(key).decode() if store.check([key]) else None
    except Exception:  # noqa: BLE001 - a store that cannot tell
        return None


def _has(store: Store, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except Exception:  # noqa: BLE001 - a store that cannot tell: assume present
        return True


def group_hash(name: str) -> int:
    return zlib.crc32(name.encode()) & 0xFFFFFFFF


#: Which default group of this process, on the store it was made with, the groups from now
#: on belong to (``new_incarnation``).
_incarnation = 0
#: Default groups this process made, by store (its ``STORE_ID_KEY``) and torchrun attempt.
_made_on: dict[str, int] = {}
#: The default groups of the latest incarnation on each store (and attempt), while any lives.
_members: dict[str, list[DefaultMember]] = {}
_members_lock = threading.Lock()
#: A random id the first process to use a store leaves there: tells one store from another.
STORE_ID_KEY = "mccl/store"
#: Where ``claim_rank`` says that a rank of a group was claimed twice.
CLAIMED_TWICE_KEY = "claimed-twice"


class DefaultMember:
    """One default group of this process in its incarnation (``new_incarnation``); ``end``
    once the group is shut down or failed to form."""

    def __init__(self, rank: int) -> None:
        self.rank, self.ended = rank, False

    def end(self) -> None:
        self.ended = True


def new_incarnation(store: Store, rank: int) -> DefaultMember:
    """A default group is being created (``init_process_group``): the groups from here on get
    keys of their own. After ``destroy_process_group`` torch names groups from "0" again, and
    a store kept across inits (torchrun's) still holds the keys the groups before left, the
    listening addresses of ranks since gone among them. Counted per store (and attempt): every
    process of a job creates its default groups on it in the same order, so the count agrees
    across ranks, whatever each did on other stores before (a count per process made one that
    had joined an earlier job, or run one alone, wait in another key space than the fresh
    processes of the next job: a timeout). Ranks that are threads of one process share the
    count: a group joins the latest incarnation while one of its groups lives there and none
    had this rank (each thread counting its own made them wait in different key spaces)."""
    global _incarnation
    where = _store_id(store) + "/" + _attempt_prefix()
    member = DefaultMember(rank)
    with _members_lock:
        members = _members.get(where, [])
        if not any(not m.ended for m in members) or any(m.rank == rank for m in members):
            _made_on[where] = _made_on.get(where, 0) + 1
            members = _members[where] = []
        members.append(member)
        _incarnation = _made_on[where]
    return member


def _store_id(store: Store) -> str:
    """The id the first process to use ``store`` left there (``STORE_ID_KEY``); "" for a store
    without ``compare_set`` (a Python subclass may lack it): then one count per process."""
    try:
        got = store.compare_set(STORE_ID_KEY, "", secrets.token_hex(16))
    except (RuntimeError, NotImplementedError):  # torch: "Not implemented."
        return ""
    return got.decode() if isinstance(got, bytes) else str(got)


def _attempt_prefix() -> str:
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    run = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return f"mccl/{run}/{attempt}/"


def namespace(group_name: str) -> str:
    return f"{_attempt_prefix()}{_incarnation}/{group_name}/"


def claim_rank(store: Store, group_name: str, rank: int) -> None:
    """Take global rank ``rank`` in the group's store key space, or raise if another process
    has: two jobs sharing one store without prefixes (or one rank started twice) would read
    each other's keys, and ranks of different jobs, holding the same secret, paired up
    and summed each other's tensors without an error. The first claim wins; the loser leaves
    a note that fails the group's ranks still forming (``check_claims``)."""
    ns = namespace(group_name)
    if store.add(f"{ns}claim/{rank}", 1) != 1:
        why = (f"mccl group {group_name!r}: global rank {rank} was already taken by another "
               "process in this store's key space: do two jobs share one store (give each its "
               "own, or a torch.distributed.PrefixStore), or was one rank started twice?")
        store.set(f"{ns}{CLAIMED_TWICE_KEY}", why)
        raise RuntimeError(why)


def check_claims(store: Store, group_name: str) -> None:
    """End of forming a group: raise if a rank of it was claimed twice meanwhile
    (``claim_rank``): the ranks that formed it may belong to different jobs."""
    key = f"{namespace(group_name)}{CLAIMED_TWICE_KEY}"
    try:
        twice = store.get(key).decode("utf-8", "replace") if store.check([key]) else None
    except Exception as e:  # noqa: BLE001 - torch raises DistNetworkError and kin
        raise store_failed(group_name, "checking its ranks' claims", e) from e
    if twice is not None:
        raise RuntimeError(twice)


def shared_secret(store: Store, ns: str, rank: int, timeout_s: float,
                  members: Sequence[int] | None = None) -> bytes:
    key = ns + "secret/0"
    if rank == 0:
        store.set(key, secrets.token_hex(32))
    else:
        await_ranks(store, ns, "secret", [0], timeout_s, members)
    return bytes.fromhex(store.get(key).decode())


class _Acceptor:
    """Accept and authenticate connections until every expected peer has arrived.

    One thread and a selector: an unauthenticated connection costs a socket, never a thread,
    and must complete its hello within HELLO_TIMEOUT_S. Port scans, random bytes, a wrong
    secret or another job's ranks are dropped without disturbing the peers that belong.
    """

    def __init__(self, listener: socket.socket, secret: bytes, group: int, rank: int,
                 size: int, expected: set[int]):
        self.listener = listener
        self.secret, self.group, self.rank, self.size = secret, group, rank, size
        self.expected = set(expected)
        self.socks: dict[int, socket.socket] = {}
        self.cond = threading.Condition()
        self.stop = False
        self.dropped = 0
        self.error: BaseException | None = None
        self._heard: float | None = None  # when a peer's report was first seen (hear_from)
        self._heard_what = ""  # and what it said
        # unauthenticated connection -> (hello bytes so far, deadline, challenge it was sent)
        self._pending: dict[socket.socket, tuple[bytearray, float, bytes]] = {}
        self._sel = selectors.DefaultSelector()
        self.thread = threading.Thread(target=self._run, name="mccl-accept", daemon=True)
        self.thread.start()

    def _done(self) -> bool:
        with self.cond:
            return self.expected <= set(self.socks)

    def _run(self) -> None:
        try:
            self.listener.setblocking(False)
            self._sel.register(self.listener, selectors.EVENT_READ, None)
            while not self.stop and not self._done():
                for key, _ in self._sel.select(0.2):
                    if key.data is None:
                        self._accept()
                    else:
                        self._read(key.fileobj)  # type: ignore[arg-type]
                now = time.monotonic()
                for conn, (_, deadline, _) in list(self._pending.items()):
                    if now > deadline:
                        self._drop(conn, f"no hello within {HELLO_TIMEOUT_S:.0f}s")
        except Exception as e:  # noqa: BLE001 - reported to wait(), never lost in a thread
            if not self.stop:
                self.error = e
                log.exception("rank %d: connection acceptor failed", self.rank)
        finally:
            for conn in list(self._pending):
                self._drop(conn, "group setup ended", quiet=True)
            self._sel.close()
            with self.cond:
                self.cond.notify_all()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in _TRANSIENT_ACCEPT:  # out of fds or buffers: retry later
                    log.warning("rank %d: accept failed (%s); retrying", self.rank, e)
                    time.sleep(0.05)
                    return
                raise
            conn.setblocking(False)
            if len(self._pending) >= MAX_PENDING:  # flood: the oldest pending one goes
                self._drop(next(iter(self._pending)), "too many pending connections")
            challenge, nonce = handshake.make_challenge()
            try:  # a new socket's empty buffer takes these few bytes at once
                sent = conn.send(challenge)
            except OSError as e:
                sent, why = 0, str(e)
            else:
                why = f"sent {sent} of {len(challenge)} bytes"
            if sent != len(challenge):
                self._drop(conn, f"could not send the challenge: {why}", registered=False)
                continue
            self._pending[conn] = (bytearray(), time.monotonic() + HELLO_TIMEOUT_S, nonce)
            self._sel.register(conn, selectors.EVENT_READ, True)

    def _read(self, conn: socket.socket) -> None:
        buf, _, challenge = self._pending[conn]
        try:
            chunk = conn.recv(handshake.HELLO_SIZE - len(buf))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._drop(conn, str(e))
            return
        if not chunk:
            self._drop(conn, f"closed after {len(buf)} of {handshake.HELLO_SIZE} hello bytes")
            return
        buf += chunk
        if len(buf) < handshake.HELLO_SIZE:
            return
        self._sel.unregister(conn)
        del self._pending[conn]
        try:
            src, nonce = handshake.parse_hello(bytes(buf), self.secret, self.group, self.rank,
                                               self.size, challenge=challenge)
            with self.cond:
                if src not in self.expected or src in self.socks:
                    raise handshake.HandshakeError(f"unexpected or duplicate rank {src}")
            conn.setblocking(True)
            conn.settimeout(HELLO_TIMEOUT_S)
            conn.sendall(handshake.make_ack(self.secret, nonce, self.group, src, self.rank))
            with self.cond:
                if src in self.socks:
                    raise handshake.HandshakeError(f"duplicate rank {src}")
                self.socks[src] = conn
                self.cond.notify_all()
        except (OSError, handshake.HandshakeError) as e:
            self._drop(conn, str(e), registered=False)

    def _drop(self, conn: socket.socket, why: str, quiet: bool = False,
              registered: bool = True) -> None:
        if registered:
            self._pending.pop(conn, None)
            try:
                self._sel.unregister(conn)
            except (KeyError, ValueError):
                pass
        try:
            conn.close()
        except OSError:
            pass
        if quiet:
            return
        self.dropped += 1
        level = logging.WARNING if self.dropped <= 5 else logging.DEBUG
        log.log(level, "rank %d dropped an incoming connection: %s", self.rank, why)

    def wait(self, deadline: float, watch: GiveUpWatch | None = None,
             dialled: dict[int, socket.socket] | None = None,
             explain: Callable[[list[int]], str] | None = None) -> dict[int, socket.socket]:
        """The expected peers' sockets, once all have connected; ``watch``: stop waiting as
        soon as a rank gave up on the group; ``dialled``: the connections this rank made,
        watched with those accepted (``hear_from``); ``explain``: more on the ranks that
        never connected, for the timeout's error."""
        dialled = dialled or {}
        while True:
            with self.cond:
                if self.expected <= set(self.socks):
                    return dict(self.socks)
                if self.error is not None:
                    raise ConnectionError(f"rank {self.rank}: accepting peers failed: "
                                          f"{self.error}") from self.error
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(self.expected - set(self.socks))
                    more = explain(missing) if explain is not None else ""
                    raise TimeoutError(f"ranks {missing} never connected to rank {self.rank}"
                                       f" within the group's timeout{more}{self._heard_what}")
                self.cond.wait(min(left, GIVE_UP_LOOK_S))
            if watch is not None:
                watch.look()
            self.hear_from(dialled, watch)

    def hear_from(self, dialled: dict[int, socket.socket],
                  watch: GiveUpWatch | None = None) -> None:
        """Raise ``PeerGoneError`` if a peer connected already (dialled, or accepted) has
        closed its connection, or sent an error frame blaming a rank this one still waits for:
        it died, or its own set-up ended and its first op failed on that rank, while this rank
        still waits for it (it may never come: a rank killed once its other dials were done is
        dialled by nobody). An error frame blaming anyone else fails the set-up only if the
        missing ranks stay away ``REPORTED_FAILURE_GRACE_S`` longer. A closed connection
        raises ``watch``'s ``GaveUpError`` first where a rank gave up: a rank leaves its word
        before it closes its connections (``leave_word``), so a rank that timed out is not
        blamed as if it had died."""
        with self.cond:
            conns = {**dialled, **self.socks}
            missing = self.expected - set(self.socks)
        for peer, conn in sorted(conns.items()):
            try:
                raw = peek(conn, EARLY_PEEK_BYTES)
            except OSError:
                raw = b""  # reset: as good as closed
            if raw is None:
                continue
            if not raw:
                if watch is not None:
                    watch.look(now=True)
                raise PeerGoneError(f"rank {peer} closed its connection to rank {self.rank} "
                                    "before the group formed (it exited or was killed)")
            said = _reported_failure(raw, self.group)
            if said is None:
                continue
            blamed, reason = said
            now = time.monotonic()
            if self._heard is None:
                self._heard = now
                self._heard_what = f" (rank {peer} meanwhile gave up: {reason})"
            if blamed in missing or now - self._heard >= REPORTED_FAILURE_GRACE_S:
                raise PeerGoneError(f"rank {peer} failed before the group formed at rank "
                                    f"{self.rank}: {reason}")


def _reported_failure(raw: bytes, group: int) -> tuple[int, str] | None:
    """The blamed rank (-1 if none) and reason of an error frame at the start of ``raw``
    (behind any state frames), the start of a peer's stream; None where it starts otherwise
    (an op's data, a clean BYE) or not all of the frame is there yet."""
    found = after_states(raw, group)
    if found is None:
        return None
    at, hdr = found
    end = at + HEADER_SIZE + hdr.length
    if hdr.kind != ERROR or len(raw) < end:
        return None
    return hdr.sig.root, bytes(raw[at + HEADER_SIZE:end]).decode("utf-8", "replace")


def _dial(addr: str, secret: bytes, group: int, rank: int, peer: int,
          deadline: float, own: str = "", watch: GiveUpWatch | None = None) -> socket.socket:
    """Connect to ``peer``'s published ``addr`` and authenticate, retrying until ``deadline``
    unless the group cannot form: a rank gave up (``watch``), or ``peer`` refuses the
    connection (``REFUSED_FOR_S``)."""
    host, port = split_host_port(addr)
    family, sockaddr = stream_address(through_own_interface(host, own), port)
    last: Exception | None = None
    refused_since: float | None = None
    while time.monotonic() < deadline:
        s = socket.socket(family, socket.SOCK_STREAM)
        try:
            swap_congestion_control(s)  # before the connection exists: see tcp.py
            s.settimeout(max(0.1, min(HELLO_TIMEOUT_S, deadline - time.monotonic())))
            s.connect(sockaddr)
            challenge = handshake.parse_challenge(handshake.read_exact(s, handshake.CHALLENGE_SIZE))
            hello, nonce = handshake.make_hello(secret, group, rank, peer, challenge=challenge)
            s.sendall(hello)
            ack = handshake.read_exact(s, handshake.ACK_SIZE)
            handshake.check_ack(ack, secret, nonce, group, rank, peer)
            return s
        except handshake.HandshakeError:
            s.close()
            raise
        except OSError as e:
            last = e
            s.close()
            now = time.monotonic()
            if not isinstance(e, ConnectionRefusedError):
                refused_since = None
            elif refused_since is None:
                refused_since = now
            elif now - refused_since >= REFUSED_FOR_S:
                if watch is not None:
                    watch.look(now=True)  # the rank's own reason, if it left one
                raise ConnectionError(
                    f"rank {rank} could not connect to rank {peer} at {addr}: refused for "
                    f"{REFUSED_FOR_S:g}s, though rank {peer} listened there when it published "
                    f"that address, so rank {peer} exited or was killed before the group "
                    "formed"
                ) from e
            if watch is not None:
                watch.look()
            time.sleep(CONNECT_RETRY_S)
    raise TimeoutError(f"rank {rank} could not connect to rank {peer} at {addr}: {last}")


def close_telling(socks: Collection[socket.socket], group: int, error: BaseException) -> None:
    """Close the connections of a set-up that failed with ``error``, first writing it as an
    ERROR frame onto each: a peer whose own set-up finished reads it in its first op, instead
    of a reset that looks as if this rank had died (it lives: it gave up); a peer still
    forming sees the frame, and this rank's word in the store (``leave_word``). Never blocks:
    a connection whose buffer is full gets no frame."""
    header, text = error_frame(str(error) or type(error).__name__, group)
    for s in socks:
        try:
            s.send(header + text, socket.MSG_DONTWAIT)
        except OSError:
            pass
        s.close()


def dial_order(rank: int) -> Sequence[int]:
    """The peers ``rank`` dials (those below it), nearest first: rank r's first dial goes to
    r - 1, so no rank gets every rank's first dial at once (``LISTEN_BACKLOG``)."""
    return range(rank - 1, -1, -1)


def connect_mesh(store: Store, rank: int, size: int, group_name: str, timeout_s: float,
                 address: str, members: Sequence[int] | None = None,
                 before_close: Callable[[BaseException], None] | None = None,
                 ) -> tuple[int, dict[int, socket.socket]]:
    """Connect this rank to every other rank of the group; returns (group hash, sockets).
    ``members``: the group's global ranks (see ``await_ranks``). ``before_close``: called
    with the error when connecting fails, before this rank's connections close (to leave its
    word: ``leave_word``)."""
    group = group_hash(group_name)
    if size == 1:
        return group, {}
    ns = namespace(group_name)
    deadline = time.monotonic() + timeout_s
    secret = shared_secret(store, ns, rank, timeout_s, members)
    make_room(size - 1 + GROUP_EXTRA_FDS, f"rank {rank} of group {group_name!r} ({size} ranks)")
    family, sockaddr = stream_address(address, 0)
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        swap_congestion_control(listener)  # accepted connections inherit it (see tcp.py)
        listener.bind(sockaddr)
        listener.listen(max(LISTEN_BACKLOG, size))
        port = listener.getsockname()[1]
        acceptor = _Acceptor(listener, secret, group, rank, size, set(range(rank + 1, size)))
        store.set(f"{ns}addr/{rank}", join_host_port(address, port))
        socks: dict[int, socket.socket] = {}
        watch = GiveUpWatch(store, ns, members, waiting_for="its peers' connections",
                            every_s=GIVE_UP_LOOK_S)
        try:
            await_ranks(store, ns, "addr", list(range(rank)), deadline - time.monotonic(),
                        members)
            order = dial_order(rank)
            addrs = _get_all(store, [f"{ns}addr/{peer}" for peer in order])
            for peer, addr in zip(order, addrs, strict=True):
                socks[peer] = _dial(addr, secret, group, rank, peer, deadline, address, watch)
            socks.update(acceptor.wait(deadline, watch, socks,
                                       lambda missing: _unpublished(store, ns, missing)))
        except BaseException as e:
            if before_close is not None and isinstance(e, Exception):
                before_close(e)
            close_telling(list(socks.values()) + list(acceptor.socks.values()), group, e)
            raise
        finally:
            acceptor.stop = True
            acceptor.thread.join(timeout=1.0)
    finally:
        listener.close()
    log.debug("rank %d connected to %d peers in group %s", rank, len(socks), group_name)
    return group, socks


def _unpublished(store: Store, ns: str, missing: list[int]) -> str:
    """Which of the ranks that never connected never published their address either (they
    did not reach the group's set-up, or died in it): a rank dials only once every lower
    rank's address is out, so the others may be alive and waiting for those."""
    absent = [r for r in missing if not _has(store, f"{ns}addr/{r}")]
    if not absent:
        return ""
    waiting = [r for r in missing if r not in absent]
    text = f"; rank(s) {absent} never published an address (did not reach set-up, or died in it)"
    if waiting:
        them = "it" if len(absent) == 1 else "them"
        text += f"; rank(s) {waiting} did and may still wait for {them}"
    return text


def _exchange(store: Store, ns: str, what: str, me: int, value: str, others: list[int],
              timeout_s: float, members: Sequence[int] | None = None,
              label: str = "rank(s)", among: Collection[int] | None = None) -> list[str]:
    """Publish ``value`` as ``{ns}{what}/{me}`` and return what the ranks ``others``
    published there (waiting for them at most ``timeout_s``; ``members``, ``label``: see
    ``await_ranks``)."""
    store.set(f"{ns}{what}/{me}", value)
    await_ranks(store, ns, what, others, timeout_s, members, label, among)
    return _get_all(store, [f"{ns}{what}/{r}" for r in others])


def _get_all(store: Store, keys: list[str]) -> list[str]:
    """The values of ``keys`` (all present), in one round trip where the store has
    ``multi_get``."""
    many = getattr(store, "multi_get", None)
    raw = many(keys) if many is not None else [store.get(k) for k in keys]
    return [v.decode() if isinstance(v, bytes) else v for v in raw]


def check_rank(rank: int, size: int) -> ValueError | None:
    """Why ``rank`` cannot be a rank of a group of ``size`` (None: it can)."""
    if size < 1:
        return ValueError(f"mccl: world size {size} is not a positive number of ranks")
    if not 0 <= rank < size:
        return ValueError(f"mccl: rank {rank} is out of range for world size {size} (ranks "
                          f"count from 0 to {size - 1}): is RANK or WORLD_SIZE wrong there?")
    return None


def agree_world_size(store: Store, group_name: str, global_rank: int, size: int) -> None:
    """The first rank to get here records its world size; one that passed another raises,
    naming both (it would wait for a rank that never comes, or leave one out, and the others'
    error would read as ranks that never connected). Skipped for a store without
    ``compare_set``."""
    key = f"{namespace(group_name)}world_size"
    try:
        got = store.compare_set(key, "", f"{size} {global_rank}")
    except (RuntimeError, NotImplementedError):  # torch: "Not implemented."
        return
    first, first_rank = (got.decode() if isinstance(got, bytes) else str(got)).split()
    if first != str(size):
        raise ValueError(f"mccl group '{group_name}': rank {global_rank} was started with world "
                         f"size {size}, but rank {first_rank} with world size {first}: every "
                         "rank must be given the same WORLD_SIZE")


def agree_members(store: Store, global_rank: int, members: list[int], group_name: str,
                  timeout_s: float) -> None:
    """Check that every rank of the group was created with the same member list (global
    ranks). torch names groups by a counter, so ranks that passed different lists to
    ``new_group`` share a name and would otherwise be paired with whoever took their group
    rank. Each rank publishes its list under its global rank (so nothing is overwritten)
    and reads those of the ranks it lists; a difference raises at once, naming both."""
    if len(members) == 1:
        return
    mine = ",".join(map(str, members))
    others = [g for g in members if g != global_rank]
    lists = _exchange(store, namespace(group_name), "members", global_rank, mine, others,
                      timeout_s, label="global rank(s)", among=members)
    for g, theirs in zip(others, lists, strict=True):
        if theirs != mine:
            raise ValueError(
                f"mccl group '{group_name}': rank {global_rank} created it with ranks "
                f"[{mine.replace(',', ', ')}], but rank {g} with [{theirs.replace(',', ', ')}]; "
                "every member must pass new_group the same ranks, and the ranks must create "
                "their groups in the same order")


def cores_per_rank(store: Store, rank: int, size: int, group_name: str,
                   timeout_s: float, members: Sequence[int] | None = None) -> float:
    """The fewest cores any rank of the group can count on (``fewest_cores``): each rank
    publishes its ``machine_facts`` and reads everyone's, so every rank computes the same
    value. A key left by an earlier group of the same name holds the same rank's facts."""
    mine = machine.machine_facts()
    if size == 1:
        return machine.fewest_cores([mine])
    facts = [mine]
    for v in _exchange(store, namespace(group_name), "cores", rank, " ".join(map(str, mine)),
                       [r for r in range(size) if r != rank], timeout_s, members):
        host, total, own = v.split()
        facts.append((host, int(total), int(own)))
    return machine.fewest_cores(facts)
