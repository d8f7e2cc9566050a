"""The wire under attack and failure, in one process: listener hardening during group setup,
fuzzed handshake and frame parsers, random bytes from a fake peer, and the transport's
failure paths (silent peer, dead bystander, error frames, probes, abort).

No torch processes here, so these run in seconds.
"""

from __future__ import annotations

import os
import random
import select
import signal
import socket
import struct
import threading
import time

import numpy as np
import pytest
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mccl.algorithms.base import MAX_CHUNK_BYTES
from mccl.device.cpu import CpuHandoff
from mccl.transport import framing, handshake
from mccl.transport.framing import (
    BYE,
    DATA,
    ERROR,
    HEADER_SIZE,
    MAX_ERROR_BYTES,
    MAX_UNEXPECTED_BYTES,
    P2P,
    STATE,
    STATE_PAYLOAD,
    FrameError,
    Signature,
    pack_header,
    unpack_header,
)
from mccl.transport.mesh import POLL_STASH_MAX, Mesh, MismatchError
from mccl.transport.posted import PostedRecv, PostedRecvs
from mccl.transport.rendezvous import _dial, connect_mesh, group_hash, namespace
from mccl.transport.tcp import PeerError, seconds_text
from tests.threads import in_thread, on_thread, released

FUZZ = settings(max_examples=1000, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])
#: Plain seeded random inputs on top of hypothesis's (cheap, so many more).
BULK = 20_000
SIG = Signature(1, 1, 0, 0, 4)
GROUP = 0x1234


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Two ends of a loopback TCP connection (Mesh wants TCP, not a socketpair)."""
    with socket.socket() as lst:
        lst.bind(("127.0.0.1", 0))
        lst.listen(1)
        a = socket.create_connection(lst.getsockname())
        b, _ = lst.accept()
    return a, b


def make_mesh(size: int = 2, timeout_s: float = 5.0, probe_s: float = 0.05):
    """Mesh of rank 0 whose peers are fake: returns (mesh, {rank: far-end socket})."""
    mine, far = {}, {}
    for r in range(1, size):
        mine[r], far[r] = tcp_pair()
    return Mesh(0, size, GROUP, mine, timeout_s, "test", probe_s=probe_s), far


def mesh_in_threads(store, ranks, world: int, name: str, timeout_s: float,
                    join_s: float = 60) -> dict:
    """``connect_mesh`` for ``ranks`` of a ``world``-rank group, one thread each, started
    together: {rank: (group hash, sockets) or the exception it raised}."""
    results: dict = {}

    def rank_fn(r: int) -> None:
        try:
            results[r] = connect_mesh(store, r, world, name, timeout_s, "127.0.0.1")
        except BaseException as e:  # noqa: BLE001
            results[r] = e

    threads = [threading.Thread(target=rank_fn, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)
    return results


# ---------------------------------------------------------------- listener hardening

def _closed_by_listener(s: socket.socket) -> bool:
    s.settimeout(15)
    try:
        return s.recv(100) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_listener_drops_intruders_during_setup() -> None:
    """Port scans, random bytes, wrong secrets and another job hit rank 0's listener while it
    waits for its peers; the job still connects, with the right sockets."""
    store = dist.HashStore()
    world, name = 3, "attacked"
    results: dict[int, tuple] = {}
    errors: dict[int, BaseException] = {}

    def rank_fn(r: int) -> None:
        try:
            results[r] = connect_mesh(store, r, world, name, 60.0, "127.0.0.1")
        except BaseException as e:  # noqa: BLE001
            errors[r] = e

    threads = [threading.Thread(target=rank_fn, args=(0,), daemon=True)]
    threads[0].start()
    ns = namespace(name)
    host, port = store.get(ns + "addr/0").decode().rsplit(":", 1)
    target = (host, int(port))
    secret = bytes.fromhex(store.get(ns + "secret/0").decode())
    group = group_hash(name)
    other = os.urandom(32)

    for _ in range(20):  # port scan
        socket.create_connection(target).close()
    slow = socket.create_connection(target)  # slowloris: half a hello, then silence
    slow.sendall(os.urandom(handshake.HELLO_SIZE // 2))
    # A hello that would be valid for another connection's challenge: a recorded one, replayed.
    recorded = handshake.make_hello(secret, group, 1, 0, challenge=os.urandom(16))[0]

    def hello(key: bytes, g: int, src: int, dst: int):
        return lambda chal: handshake.make_hello(key, g, src, dst, challenge=chal)[0]

    attacks = [
        lambda chal: os.urandom(handshake.HELLO_SIZE),
        lambda chal: os.urandom(4096),
        lambda chal: b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(handshake.HELLO_SIZE),
        lambda chal: recorded,  # replayed
        hello(other, group, 1, 0),  # wrong secret
        hello(other, 0xBEEF, 1, 0),  # another job's group and secret
        hello(secret, group ^ 1, 1, 0),  # right secret, other group
        hello(secret, group, 7, 0),  # rank outside the group
        hello(secret, group, 1, 2),  # addressed to another rank
    ]
    socks = []
    for make in attacks:
        s = socket.create_connection(target)
        s.settimeout(15)
        chal = handshake.parse_challenge(handshake.read_exact(s, handshake.CHALLENGE_SIZE))
        s.sendall(make(chal))
        socks.append(s)
    assert all(_closed_by_listener(s) for s in socks), "an intruder was not dropped"
    for s in socks:
        s.close()
    # A second job whose rank 1 dials this port with its own secret is refused too.
    with pytest.raises(TimeoutError):
        _dial(f"{host}:{port}", other, group, 1, 0, time.monotonic() + 1.0)

    for r in (1, 2):
        threads.append(threading.Thread(target=rank_fn, args=(r,), daemon=True))
        threads[-1].start()
    for t in threads:
        t.join(60)
    slow.close()
    assert not errors, errors
    assert sorted(results) == [0, 1, 2]

    # The sockets really lead to the right ranks: every rank sends its rank to every peer.
    meshes = {r: Mesh(r, world, results[r][0], results[r][1], 10.0, name) for r in results}
    for r, m in meshes.items():
        for q in range(world):
            if q != r:
                m.send(q, DATA, SIG, 1, np.full(4, r, dtype=np.int32))
    for r, m in meshes.items():
        for q in range(world):
            if q != r:
                buf = np.zeros(4, dtype=np.int32)
                m.recv_data(q, 1, SIG, buf)
                assert (buf == q).all()
    for m in meshes.values():
        m.dispose()


def test_restart_attempt_ignores_the_dead_attempts_keys(monkeypatch) -> None:
    """torchrun keeps its store across restarts (pytorch#135712): attempt 1 must not read the
    secret and addresses attempt 0 left there. Rank 1 starts first, so without per-attempt
    keys it would read rank 0's stale address and fail."""
    store = dist.HashStore()
    name = "elastic"
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    ns0 = namespace(name)
    with socket.socket() as dead:  # attempt 0's rank 0: published, then died
        dead.bind(("127.0.0.1", 0))
        store.set(ns0 + "secret/0", os.urandom(32).hex())
        store.set(ns0 + "addr/0", f"127.0.0.1:{dead.getsockname()[1]}")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert namespace(name) != ns0
    results: dict = {}

    def rank_fn(r: int) -> None:
        try:
            results[r] = connect_mesh(store, r, 2, name, 20.0, "127.0.0.1")
        except BaseException as e:  # noqa: BLE001
            results[r] = e

    threads = [threading.Thread(target=rank_fn, args=(r,), daemon=True) for r in (1, 0)]
    threads[0].start()
    time.sleep(0.3)
    threads[1].start()
    for t in threads:
        t.join(60)
    assert all(isinstance(results.get(r), tuple) for r in (0, 1)), results
    for r in (0, 1):
        for sock in results[r][1].values():
            sock.close()


def test_ranks_that_never_connected_are_told_apart_by_their_published_address() -> None:
    """Rank 1 never reaches the set-up (killed before it published its address); rank 2 did,
    and waits for rank 1's address before it dials anyone. Rank 0 sees neither connect: its
    error named both alike, a live rank beside the dead one; it now says which never
    published an address and which did and may be waiting."""
    results = mesh_in_threads(dist.HashStore(), (0, 2), 3, "half-published", 1.5, join_s=30)
    assert isinstance(results.get(0), TimeoutError), results
    said = str(results[0])
    assert "ranks [1, 2] never connected to rank 0" in said, said
    assert "rank(s) [1] never published an address" in said, said
    assert "rank(s) [2] did and may still wait for it" in said, said
    assert isinstance(results.get(2), TimeoutError) and "[1] did not join" in str(results[2])


# ---------------------------------------------------------------- parser fuzzing

@FUZZ
@given(st.binary(min_size=0, max_size=2 * HEADER_SIZE))
def test_unpack_header_random_bytes(raw: bytes) -> None:
    try:
        hdr = unpack_header(raw)
    except FrameError:
        return
    assert hdr.length <= MAX_UNEXPECTED_BYTES


_header_fields = st.tuples(
    st.sampled_from([framing.MAGIC, b"MX", b"\0\0"]),
    st.sampled_from([framing.VERSION, 0, 2, 255]),
    st.integers(0, 255),  # kind
    st.integers(0, 255), st.integers(0, 255), st.integers(0, 255),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1),
    st.one_of(st.integers(0, 2**64 - 1), st.integers(0, 1 << 20),
              st.sampled_from([0, 4, MAX_ERROR_BYTES, MAX_ERROR_BYTES + 1,
                               MAX_UNEXPECTED_BYTES, MAX_UNEXPECTED_BYTES + 1])),
)
_HDR = struct.Struct("<2sBBBBBxiIQQQ")


@FUZZ
@given(_header_fields)
def test_unpack_header_structured(fields: tuple) -> None:
    raw = _HDR.pack(*fields)
    try:
        hdr = unpack_header(raw)
    except FrameError:
        return
    assert hdr.kind in (DATA, P2P, ERROR, STATE, BYE)
    assert hdr.length <= MAX_UNEXPECTED_BYTES
    if hdr.kind == ERROR:
        assert hdr.length <= MAX_ERROR_BYTES
    if hdr.kind == STATE:
        assert hdr.length == STATE_PAYLOAD.size
    if hdr.kind == BYE:
        assert hdr.length == 0


@pytest.mark.parametrize("kind", [DATA, P2P])
def test_frames_of_tensors_past_16_gib_are_accepted(kind: int) -> None:
    """A 17.5 GB point-to-point message goes in one frame (gloo moves it); its header was
    refused as malformed, which broke the group."""
    n = 17_500_000_000
    assert unpack_header(pack_header(kind, SIG, GROUP, 1, n)).length == n


@FUZZ
@given(st.binary(min_size=0, max_size=2 * handshake.HELLO_SIZE))
def test_parse_hello_random_bytes(raw: bytes) -> None:
    with pytest.raises(handshake.HandshakeError):
        handshake.parse_hello(raw, b"s" * 32, 1, 0, 4, challenge=b"c" * 16)


@FUZZ
@given(st.binary(min_size=0, max_size=2 * handshake.CHALLENGE_SIZE))
def test_parse_challenge_random_bytes(raw: bytes) -> None:
    """Anything but an mccl listener's challenge is refused before a hello is sent."""
    if raw[:8] == handshake.CHALLENGE_MAGIC and len(raw) == handshake.CHALLENGE_SIZE:
        assert handshake.parse_challenge(raw) == raw[8:]
        return
    with pytest.raises(handshake.HandshakeError):
        handshake.parse_challenge(raw)


@FUZZ
@given(st.binary(min_size=0, max_size=2 * handshake.ACK_SIZE))
def test_check_ack_random_bytes(raw: bytes) -> None:
    with pytest.raises(handshake.HandshakeError):
        handshake.check_ack(raw, b"s" * 32, b"n" * 16, 1, 1, 0)


def test_parsers_bulk_random_inputs() -> None:
    """Many more plain random inputs: random bytes, and valid headers and hellos with random
    bytes overwritten."""
    rng = random.Random(6)
    secret = b"s" * 32
    good_hdr = pack_header(DATA, SIG, GROUP, 1, 16)
    chal = b"c" * 16
    good_hello = handshake.make_hello(secret, 1, 1, 0, challenge=chal)[0]
    for _ in range(BULK):
        raw = bytearray(good_hdr if rng.random() < 0.5 else rng.randbytes(HEADER_SIZE))
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(HEADER_SIZE)] = rng.randrange(256)
        try:
            assert unpack_header(bytes(raw)).length <= MAX_UNEXPECTED_BYTES
        except FrameError:
            pass
        hello = bytearray(good_hello if rng.random() < 0.5 else
                          rng.randbytes(handshake.HELLO_SIZE))
        hello[rng.randrange(len(hello))] ^= 1 << rng.randrange(8)
        with pytest.raises(handshake.HandshakeError):
            handshake.parse_hello(bytes(hello), secret, 1, 0, 2, challenge=chal)


def test_hello_every_bit_flip_is_refused() -> None:
    secret = b"k" * 32
    chal = b"c" * 16
    hello, nonce = handshake.make_hello(secret, 5, 1, 0, challenge=chal)
    assert handshake.parse_hello(hello, secret, 5, 0, 2, challenge=chal) == (1, nonce)
    with pytest.raises(handshake.HandshakeError, match="replayed"):  # another connection's
        handshake.parse_hello(hello, secret, 5, 0, 2, challenge=b"d" * 16)
    for i in range(len(hello) * 8):
        bad = bytearray(hello)
        bad[i // 8] ^= 1 << (i % 8)
        with pytest.raises(handshake.HandshakeError):
            handshake.parse_hello(bytes(bad), secret, 5, 0, 2, challenge=chal)
    ack = handshake.make_ack(secret, nonce, 5, 1, 0)
    handshake.check_ack(ack, secret, nonce, 5, 1, 0)
    for i in range(len(ack) * 8):
        bad = bytearray(ack)
        bad[i // 8] ^= 1 << (i % 8)
        with pytest.raises(handshake.HandshakeError):
            handshake.check_ack(bytes(bad), secret, nonce, 5, 1, 0)


# A valid-looking header (random kind, seq, signature, length) followed by random bytes, or
# plain random bytes: what a confused or hostile peer could send.
_frame_bytes = st.one_of(
    st.binary(max_size=256),
    st.builds(
        lambda kind, seq, sig, length, tail: pack_header(kind, sig, GROUP, seq, length) + tail,
        st.integers(1, 5),
        st.integers(0, 3),
        st.builds(Signature, st.integers(0, 2), st.integers(0, 2), st.integers(0, 1),
                  st.integers(-1, 1), st.integers(0, 8)),
        st.one_of(st.integers(0, 64), st.integers(0, 1 << 32)),
        st.binary(max_size=128),
    ),
)


def _feed(data: bytes, receive) -> None:
    mesh, far = make_mesh(2)
    try:
        far[1].sendall(data)
        far[1].shutdown(socket.SHUT_WR)
        try:
            receive(mesh)
        except (PeerError, MismatchError):
            pass
    finally:
        far[1].close()
        mesh.dispose(join_s=0.1)


@settings(FUZZ, max_examples=600)
@given(st.lists(_frame_bytes, min_size=1, max_size=3).map(b"".join))
def test_recv_random_bytes_from_fake_peer(data: bytes) -> None:
    """recv_data and a posted p2p receive on garbage: a PeerError or MismatchError (or, for a
    valid frame, data), never another exception, a crash or a huge allocation."""
    _feed(data, lambda m: m.recv_data(1, 1, SIG, np.zeros(4, dtype=np.int32)))
    _feed(data, _posted_receive)


def _posted_receive(mesh) -> None:
    """Post a p2p receive and serve the sockets until it is filled, serving raises, or a
    large frame of a later collective is left in the socket for its op (the receive would
    then fail at the group timeout)."""
    filled: list = []
    mesh.post_recv(1, 0, np.zeros(16, dtype=np.uint8), filled.append)
    wake, other = socket.socketpair()
    try:
        for _ in range(50):
            if filled or mesh._held:
                return
            mesh.serve(0.05, wake)
        raise AssertionError("a posted receive was neither filled nor failed")
    finally:
        wake.close()
        other.close()


# ---------------------------------------------------------------- transport failure paths

def test_silent_peer_times_out() -> None:
    mesh, far = make_mesh(2, timeout_s=0.5, probe_s=0.05)
    t, out = in_thread(lambda: mesh.recv_data(1, 1, SIG, np.zeros(4, dtype=np.int32)))
    t.join(30)
    assert not t.is_alive()
    assert isinstance(out.get("error"), PeerError)
    assert "no data from rank 1" in str(out["error"]) and out["error"].culprit == 1
    mesh.dispose()


@pytest.mark.parametrize("peer_seq, we_send, hint", [
    (0, False, True),   # the peer waits for us in a p2p op while we wait in op #1: ordering
    (1, False, False),  # both in op #1: bytes lost on the way, not an ordering
    (0, True, False),   # we sent the peer something after its report: it may have moved on
])
def test_timeout_says_when_the_silent_peer_waits_for_us(peer_seq: int, we_send: bool,
                                                        hint: bool) -> None:
    mesh, far = make_mesh(2, timeout_s=0.5, probe_s=0.05)
    mesh.begin_op(1, SIG)
    t, out = in_thread(lambda: mesh.recv_data(1, 1, SIG, np.zeros(4, dtype=np.int32)))
    far[1].sendall(pack_header(STATE, SIG if peer_seq else Signature(0), GROUP, peer_seq, 4)
                   + STATE_PAYLOAD.pack(0))
    if we_send:
        time.sleep(0.2)  # the receive has read the STATE frame by now
        mesh.send(1, DATA, SIG, 2, np.zeros(4, dtype=np.int32))
    t.join(30)
    err = out.get("error")
    assert isinstance(err, PeerError) and "group timeout" in str(err), err
    assert ("each waits for the other" in str(err)) == hint, err
    mesh.dispose()


def test_close_unblocks_blocked_receive_and_later_sends() -> None:
    mesh, far = make_mesh(3, timeout_s=60.0)
    t, out = in_thread(lambda: mesh.recv_data(1, 1, SIG, np.zeros(4, dtype=np.int32)))
    time.sleep(0.2)
    mesh.close()
    t.join(30)
    assert not t.is_alive() and isinstance(out.get("error"), PeerError)
    with pytest.raises(PeerError):
        mesh.send(2, DATA, SIG, 1, np.zeros(1 << 20, dtype=np.uint8))  # queued path
    assert mesh.peer(2).marker().is_set()  # nothing can wait on a stopped sender
    mesh.dispose()


def test_small_sends_never_block_on_a_peer_that_does_not_read() -> None:
    """Inline writes of small frames must not block the comm thread: a ring whose ranks all
    write a segment of small chunks before reading deadlocks otherwise. The frames that do
    not fit the socket buffers are queued, in order, and arrive intact."""
    mesh, far = make_mesh(2, timeout_s=60.0)
    n_frames, size = 64, 64 << 10  # 4 MiB, far beyond what the kernel buffers hold unread
    frames = [np.full(size, i, dtype=np.uint8) for i in range(n_frames)]
    t, out = in_thread(lambda: [mesh.send(1, DATA, SIG, 7, f) for f in frames])
    t.join(20)
    assert not t.is_alive(), "a small send blocked on a peer that is not reading"
    assert out.get("value") == [True] * n_frames  # each copied or written: reusable at once
    for f in frames:
        f[:] = 255  # the caller may reuse its buffers now
    reader = far[1]
    reader.settimeout(20)
    for i in range(n_frames):
        hdr = bytearray(HEADER_SIZE)
        reader.recv_into(hdr, HEADER_SIZE, socket.MSG_WAITALL)
        assert unpack_header(bytes(hdr)).length == size
        body = bytearray(size)
        got = 0
        while got < size:
            got += reader.recv_into(memoryview(body)[got:], size - got)
        assert body == bytes([i]) * size, f"frame {i} corrupted or out of order"
    mesh.flush([1])
    mesh.dispose()


def _read_frame(reader: socket.socket) -> tuple[int, bytes]:
    hdr = bytearray(HEADER_SIZE)
    reader.recv_into(hdr, HEADER_SIZE, socket.MSG_WAITALL)
    n = unpack_header(bytes(hdr)).length
    body = bytearray(n)
    got = 0
    while got < n:
        got += reader.recv_into(memoryview(body)[got:], n - got)
    return n, bytes(body)


def test_an_ops_first_large_send_is_written_at_once_and_the_rest_queued_in_order() -> None:
    """``start``: the calling thread writes what the idle socket takes, without blocking on a
    peer that does not read, and queues the rest as a view (False: keep the buffer until
    flush). A frame queued by another thread meanwhile, and the op's later frames, arrive
    after it, each intact."""
    mesh, far = make_mesh(2, timeout_s=60.0)
    big = np.arange(8 << 20, dtype=np.uint8)  # 8 MiB: more than the socket buffers hold
    t, out = in_thread(lambda: mesh.send_frame(
        1, pack_header(DATA, SIG, GROUP, 7, big.nbytes), big, big.nbytes, start=True))
    t.join(20)
    assert not t.is_alive(), "the first large send blocked on a peer that is not reading"
    assert out.get("value") is False  # partly queued: the buffer must stay until flush
    assert mesh.peer(1)._pending == 1
    # another thread's frame (a p2p send) and a later chunk go behind the queued rest
    later = np.full(100 << 10, 3, dtype=np.uint8)
    p2p = np.full(1000, 9, dtype=np.uint8)
    mesh.send(1, DATA, SIG, 8, p2p)
    assert mesh.send_frame(1, pack_header(DATA, SIG, GROUP, 7, later.nbytes), later,
                           later.nbytes, start=True) is False  # busy: queued, not written
    reader = far[1]
    reader.settimeout(20)
    assert _read_frame(reader) == (big.nbytes, big.tobytes())
    assert _read_frame(reader) == (p2p.nbytes, p2p.tobytes())
    assert _read_frame(reader) == (later.nbytes, later.tobytes())
    mesh.flush([1])
    # an idle socket takes a frame that fits whole: written, reusable at once
    small_big = np.full(200 << 10, 5, dtype=np.uint8)
    assert mesh.send_frame(1, pack_header(DATA, SIG, GROUP, 9, small_big.nbytes), small_big,
                           small_big.nbytes, start=True) is True
    assert _read_frame(reader) == (small_big.nbytes, small_big.tobytes())
    mesh.dispose()


def test_a_ticket_passes_once_the_frames_before_it_are_written() -> None:
    """``Peer.ticket``/``passed`` (reduce-scatter reuses a buffer only after the check): a
    frame queued behind a peer that does not read has not passed, nor has one queued after
    it; once the peer reads, both pass, and a ticket taken on an idle connection passes at
    once."""
    mesh, far = make_mesh(2, timeout_s=60.0)
    p = mesh.peer(1)
    assert p.passed(p.ticket())  # nothing queued
    big = np.arange(24 << 20, dtype=np.uint8)  # far more than the socket buffers hold unread
    second = np.full(300 << 10, 4, dtype=np.uint8)
    assert mesh.send_frame(1, pack_header(DATA, SIG, GROUP, 7, big.nbytes), big, big.nbytes,
                           start=True) is False
    first = p.ticket()
    mesh.send_frame(1, pack_header(DATA, SIG, GROUP, 7, second.nbytes), second,
                    second.nbytes)
    after = p.ticket()
    assert after > first
    time.sleep(0.2)  # the sender thread is blocked on the full socket
    assert not p.passed(first) and not p.passed(after)
    reader = far[1]
    reader.settimeout(20)
    assert _read_frame(reader) == (big.nbytes, big.tobytes())
    assert _read_frame(reader) == (second.nbytes, second.tobytes())
    mesh.flush([1])
    assert p.passed(first) and p.passed(after)
    mesh.dispose()


@pytest.mark.skipif(not hasattr(socket, "TCP_NOTSENT_LOWAT"), reason="no TCP_NOTSENT_LOWAT")
def test_data_sockets_hold_little_unsent_data() -> None:
    """Every data connection caps its unsent backlog (the kernel takes a quarter MiB at a
    time), and a frame much larger than that still goes through whole and in order."""
    from mccl.transport.tcp import NOTSENT_LOWAT_BYTES

    mesh, far = make_mesh(2, timeout_s=60.0)
    sock = mesh.peer(1).sock
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT) == NOTSENT_LOWAT_BYTES
    big = np.arange(3 << 20, dtype=np.uint8)
    mesh.send(1, DATA, SIG, 7, big)
    mesh.send(1, DATA, SIG, 7, big[::-1].copy())
    far[1].settimeout(20)
    assert _read_frame(far[1]) == (big.nbytes, big.tobytes())
    assert _read_frame(far[1]) == (big.nbytes, big[::-1].tobytes())
    mesh.flush([1])
    mesh.dispose()


def test_dead_bystander_is_noticed_while_blocked() -> None:
    """Rank 0 waits for rank 1; rank 2 dies (EOF without BYE): rank 0 fails naming rank 2."""
    mesh, far = make_mesh(3, timeout_s=60.0)
    t, out = in_thread(lambda: mesh.recv_data(1, 1, SIG, np.zeros(4, dtype=np.int32)))
    far[2].close()
    t.join(30)
    assert not t.is_alive()
    err = out.get("error")
    assert isinstance(err, PeerError) and err.peer == 2 and "rank 2 closed" in str(err)
    mesh.dispose()


def test_bystander_saying_bye_is_not_a_failure() -> None:
    mesh, far = make_mesh(3, timeout_s=60.0)
    mesh.begin_op(1, SIG)
    t, out = in_thread(lambda: mesh.recv_data(1, 1, SIG, np.arange(4, dtype=np.int32)))
    far[2].sendall(pack_header(BYE, Signature(0), GROUP, 0, 0))
    far[2].close()
    time.sleep(0.3)  # several probe intervals: the EOF after BYE must be ignored
    payload = np.arange(4, dtype=np.int32)
    far[1].sendall(pack_header(DATA, SIG, GROUP, 1, payload.nbytes) + payload.tobytes())
    t.join(30)
    assert not t.is_alive() and "error" not in out, out
    mesh.dispose()


STALL_TEXT = b"mccl all_reduce (op #1) on rank 2 failed: no data from rank 3"
MISMATCH_TEXT = (b"collective mismatch: rank 1 issued op #1 broadcast(...), but rank 0 issued "
                 b"op #1 all_reduce(...)")


ERROR_FRAMES = [
    # A bystander (rank 2) reports that rank 3 stalled: rank 3 is the culprit.
    (2, 3, STALL_TEXT, "reported by rank 2"),
    # The others gave up on rank 0 itself (say its link broke): the fault is rank 0's, not
    # that of the rank whose error frame happened to arrive first (seen on the H200: rank 1
    # named rank 0, a bystander, for the link it had cut itself).
    (1, 0, STALL_TEXT, "gave up on rank 0"),
    # A mismatch that names rank 0: nothing broke there, the report says what differed.
    (1, 0, MISMATCH_TEXT, "reported by rank 1: collective mismatch"),
]


@pytest.mark.parametrize("sender, blamed, text, phrase", ERROR_FRAMES)
def test_error_frame_names_the_culprit(sender: int, blamed: int, text: bytes,
                                       phrase: str) -> None:
    mesh, far = make_mesh(4, timeout_s=60.0)
    t, out = in_thread(lambda: mesh.recv_data(1, 1, SIG, np.zeros(4, dtype=np.int32)))
    far[sender].sendall(pack_header(ERROR, Signature(0, root=blamed), GROUP, 1, len(text))
                        + text)
    t.join(30)
    err = out.get("error")
    assert isinstance(err, PeerError) and err.peer == sender and err.culprit == blamed, err
    assert phrase in str(err) and err.origin == text.decode()
    mesh.dispose()


@pytest.mark.parametrize("sender_issued, blamed, culprit", [
    (Signature(2, 1, 0, 0, 12), 0, 1),  # rank 1 issued another op and names us: it is odd here
    (SIG, 3, 3),                        # rank 1 issued op #1 as we did: the one it names is odd
    (Signature(2, 1, 0, 0, 12), 3, 1),  # rank 1 differs from us, whoever it names
])
def test_a_mismatch_report_names_the_rank_that_issued_the_op_otherwise_than_this_one(
        sender_issued: Signature, blamed: int, culprit: int) -> None:
    """Seen with 3 ranks, one of them odd: a rank that issued the op as most did was told
    "blamed on this rank" (the odd rank names whoever it met first)."""
    mesh, far = make_mesh(4, timeout_s=60.0)
    mesh.begin_op(1, SIG)
    t, out = in_thread(lambda: mesh.recv_data(2, 1, SIG, np.zeros(4, dtype=np.int32)))
    header, text = framing.error_frame(MISMATCH_TEXT.decode(), GROUP, 1, blamed, sender_issued)
    far[1].sendall(header + text)
    t.join(30)
    err = out.get("error")
    assert isinstance(err, PeerError) and err.culprit == culprit, err
    assert "reported by rank 1: collective mismatch" in str(err)
    mesh.dispose()


@pytest.mark.parametrize("sender, blamed, text, phrase", ERROR_FRAMES)
def test_check_open_reports_an_error_frame_as_a_receive_does(sender: int, blamed: int,
                                                             text: bytes, phrase: str) -> None:
    """A send's look at its peer (``check_open``) may meet the error frame first: it blames
    and forwards the same as a receive (a reason without ``origin`` was forwarded wrapped in
    the reporting rank's own message, and the next rank's nested it again)."""
    mesh, far = make_mesh(4, timeout_s=60.0)
    far[sender].sendall(pack_header(ERROR, Signature(0, root=blamed), GROUP, 1, len(text))
                        + text)
    time.sleep(0.1)
    with pytest.raises(PeerError) as info:
        mesh.check_open(sender)
    err = info.value
    assert err.peer == sender and err.culprit == blamed, err
    assert phrase in str(err) and err.origin == text.decode()
    mesh.dispose()


def test_probe_of_a_different_op_is_a_mismatch() -> None:
    """Rank 0 waits in op #1 for rank 1; rank 2 reports it is blocked in op #1 of another
    kind: a mismatch, found although no data frame will ever arrive."""
    mesh, far = make_mesh(3, timeout_s=60.0)
    mesh.begin_op(1, SIG)
    t, out = in_thread(lambda: mesh.recv_data(1, 1, SIG, np.zeros(4, dtype=np.int32)))
    other = Signature(2, 1, 0, 0, 4)
    far[2].sendall(pack_header(STATE, other, GROUP, 1, 4) + STATE_PAYLOAD.pack(0))
    t.join(30)
    err = out.get("error")
    assert isinstance(err, MismatchError) and err.peer == 2
    assert "op #1" in str(err) and "rank 2" in str(err)
    mesh.dispose()


def test_seconds_text_spells_sub_second_durations() -> None:
    """Before, a 300 ms group timeout read "no data from rank 1 for 0s"."""
    assert [seconds_text(s) for s in (0.3, 0.25, 0.05, 0.999, 1.0, 2.4, 60.0)] == [
        "0.3s", "0.25s", "0.05s", "1s", "1s", "2s", "60s"]


def test_a_probe_reads_the_probe_a_peer_sent_first_and_answers_it() -> None:
    """Rank 0 waits in op #1 for rank 1 and rank 2 waits for rank 0: both probe at about the
    same moment. Rank 2's probe is in rank 0's socket, unread, when rank 0 probes: it is read
    and rank 2 gets rank 0's probe (before, a peer with unread bytes was skipped, so rank 2
    heard nothing before its timeout and named rank 0; seen on the H200's suite runs)."""
    mesh, far = make_mesh(3, timeout_s=60.0)
    mesh.begin_op(1, SIG)
    far[2].sendall(pack_header(STATE, SIG, GROUP, 1, 4) + STATE_PAYLOAD.pack(0))
    deadline = time.monotonic() + 10
    while not mesh.peer(2).has_unread() and time.monotonic() < deadline:
        time.sleep(0.01)
    mesh._probe(1)
    assert mesh.peer(2).state == (1, SIG, 0)
    far[2].settimeout(10)
    raw = far[2].recv(HEADER_SIZE, socket.MSG_WAITALL)
    hdr = unpack_header(raw)
    assert (hdr.kind, hdr.seq) == (STATE, 1), hdr
    assert STATE_PAYLOAD.unpack(far[2].recv(STATE_PAYLOAD.size, socket.MSG_WAITALL)) == (1,)
    mesh.dispose()


def test_unread_at_shutdown_reports_strays_and_not_departures() -> None:
    """``Mesh.unread`` after this rank's BYE: a peer that says BYE, exits without one, or
    reports its own failure (it raised that to its caller) is no finding; a probe for an op
    this rank never issued is. A peer that stays silent is given up on after the grace
    period."""
    mesh, far = make_mesh(6, timeout_s=60.0)
    mesh.begin_op(1, SIG)
    mesh.end_op()
    bye = pack_header(BYE, Signature(0), GROUP, 0, 0)
    far[1].sendall(bye)
    far[2].close()
    far[3].sendall(pack_header(STATE, SIG, GROUP, 5, 4) + STATE_PAYLOAD.pack(0) + bye)
    far[4].sendall(pack_header(ERROR, Signature(0, root=4), GROUP, 1, 4) + b"boom")
    # far[5] stays open and silent
    found = on_thread(lambda: mesh.unread(0.3))
    assert len(found) == 1, found
    assert "rank 3 issued op #5" in found[0] and "never issued" in found[0], found
    mesh.dispose()


def _serve_until(mesh, done: list, rounds: int = 200) -> None:
    wake, other = socket.socketpair()
    try:
        for _ in range(rounds):
            if done:
                return
            mesh.serve(0.05, wake)
    finally:
        wake.close()
        other.close()


def _p2p_frame(tag: int, payload: np.ndarray) -> bytes:
    return pack_header(P2P, Signature(0, root=tag), GROUP, 0, payload.nbytes) + payload.tobytes()


@FUZZ
@given(st.lists(st.tuples(st.booleans(), st.sampled_from([None, 1, 2, 3]), st.integers(0, 2)),
                max_size=40))
def test_posted_receives_know_which_sources_they_ask_for(steps) -> None:
    """``PostedRecvs.asks_for`` follows every add and remove (it decides whether a large
    message nobody asked for may stay in its socket)."""
    posted, live = PostedRecvs(), []
    for add, src, tag in steps:
        if add or not live:
            pr = PostedRecv(src, tag, memoryview(b""), 0.0, lambda _: None)
            posted.add(pr)
            live.append(pr)
        else:
            pr = live.pop(tag % len(live))
            posted.remove(pr)
        for peer in (1, 2, 3):
            assert posted.asks_for(peer) == any(q.src in (peer, None) for q in live)
    assert len(posted) == len(live)


def test_a_large_message_nobody_asked_for_stays_in_its_socket_until_asked() -> None:
    """While the comm thread serves other receives, a large message that no receive wants
    yet is left in its socket and read straight into the receive posted for it later (a ring
    of send/recv pairs whose senders ran a step ahead stashed and copied such messages); but
    where a posted receive may want a later message of that peer (naming it, or from any
    peer), the large one is stashed so that the later one can be read."""
    mesh, far = make_mesh(3, timeout_s=20.0, probe_s=10.0)
    big = np.arange((POLL_STASH_MAX >> 2) * 3, dtype=np.int32)  # over the stash limit
    small = np.arange(5, dtype=np.int32)
    mesh.post_recv(2, 0, np.zeros(1, dtype=np.int32), lambda pr: None)  # keeps serve busy

    def send(*frames: bytes) -> threading.Thread:
        t = threading.Thread(target=far[1].sendall, args=(b"".join(frames),), daemon=True)
        t.start()
        return t

    def receive(src, tag: int, like: np.ndarray) -> np.ndarray:
        got, filled = np.zeros_like(like), []
        mesh.post_recv(src, tag, got, filled.append)
        on_thread(lambda: _serve_until(mesh, filled))
        assert filled
        return got

    writer = send(_p2p_frame(0, big))
    time.sleep(0.2)
    on_thread(lambda: _serve_until(mesh, [], rounds=5))
    assert not mesh.peer(1).p2p_stash and mesh.peer(1).has_unread()  # left in the socket
    assert np.array_equal(receive(1, 0, big), big)
    writer.join(10)
    for src in (1, None):
        writer = send(_p2p_frame(0, big), _p2p_frame(3, small))
        assert np.array_equal(receive(src, 3, small), small)
        assert len(mesh.peer(1).p2p_stash) == 1  # the big one, read past
        assert np.array_equal(receive(1, 0, big), big)
        writer.join(10)
        assert not writer.is_alive()
    mesh.dispose()
    for sock in far.values():
        sock.close()


def test_a_receive_that_times_out_names_the_messages_with_other_tags() -> None:
    """Sender and receiver disagree on a tag: the timeout says what did come."""
    mesh, far = make_mesh(2, timeout_s=0.3, probe_s=0.05)
    payload = np.arange(4, dtype=np.int32)
    far[1].sendall(pack_header(P2P, Signature(0, root=5), GROUP, 0, payload.nbytes)
                   + payload.tobytes())
    mesh.post_recv(1, 6, np.zeros(4, dtype=np.int32), lambda pr: None)
    with pytest.raises(PeerError, match="no message with tag 6 from rank 1") as exc:
        _serve_until(mesh, [])
    assert "messages that no receive asked for wait here from rank 1 with tag 5" in str(
        exc.value)
    mesh.dispose()


def test_a_blocked_rank_does_not_probe_a_peer_whose_bytes_it_has_not_read() -> None:
    """Rank 2 sent a message too large to read ahead, said BYE and closed. A probe written to
    it would make its kernel reset the connection, which drops the message still unread here;
    so while rank 0 waits for rank 1, only rank 1 is probed, and the message arrives whole."""
    mesh, far = make_mesh(3, timeout_s=60.0)
    payload = np.arange(600_000, dtype=np.int32)  # 2.4 MB: more than is read ahead
    far[2].sendall(pack_header(P2P, Signature(0, root=7), GROUP, 0, payload.nbytes)
                   + payload.tobytes() + pack_header(BYE, Signature(0), GROUP, 0, 0))
    far[2].close()
    mesh.begin_op(1, SIG)
    t, out = in_thread(lambda: mesh.recv_data(1, 1, SIG, np.zeros(4, dtype=np.int32)))
    far[1].settimeout(30)
    raw = far[1].recv(HEADER_SIZE + STATE_PAYLOAD.size, socket.MSG_WAITALL)
    assert unpack_header(raw[:HEADER_SIZE]).kind == STATE
    time.sleep(0.3)  # more probe intervals: rank 2 must stay unprobed in all of them
    data = np.arange(4, dtype=np.int32)
    far[1].sendall(pack_header(DATA, SIG, GROUP, 1, data.nbytes) + data.tobytes())
    t.join(30)
    assert not t.is_alive() and "error" not in out, out
    mesh.end_op()
    got = np.zeros_like(payload)
    filled: list = []
    mesh.post_recv(2, 7, got, filled.append)
    _serve_until(mesh, filled)
    assert filled and np.array_equal(got, payload)
    mesh.dispose()


def test_a_closing_rank_drops_what_it_did_not_read_so_the_peer_gets_its_last_bytes() -> None:
    """A socket closed with unread bytes in it resets the connection, and the reset throws away
    what this rank's kernel still held of its last frames (the peer reads slowly here)."""
    mesh, far = make_mesh(2, timeout_s=60.0)
    far[1].setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
    far[1].sendall(pack_header(STATE, SIG, GROUP, 3, 4) + STATE_PAYLOAD.pack(0))
    last = np.arange(50_000, dtype=np.int32)  # 200 KB: more than the peer takes in at once
    mesh.send(1, P2P, Signature(0), 0, last, tag=1)
    mesh.flush([1])  # all of it in the kernel now; the probe above arrived, unread
    mesh.dispose()
    far[1].settimeout(30)
    got = bytearray()
    while True:
        chunk = far[1].recv(1 << 20)  # a reset raises ConnectionResetError here
        if not chunk:
            break
        got += chunk
    assert len(got) == HEADER_SIZE + last.nbytes and bytes(got[HEADER_SIZE:]) == last.tobytes()


def test_blocked_rank_announces_what_it_waits_for() -> None:
    mesh, far = make_mesh(3, timeout_s=60.0)
    mesh.begin_op(7, SIG)
    t, out = in_thread(lambda: mesh.recv_data(1, 7, SIG, np.zeros(4, dtype=np.int32)))
    for r in (1, 2):
        far[r].settimeout(30)
        raw = far[r].recv(HEADER_SIZE + STATE_PAYLOAD.size, socket.MSG_WAITALL)
        hdr = unpack_header(raw[:HEADER_SIZE])
        assert (hdr.kind, hdr.seq, hdr.sig) == (STATE, 7, SIG)
        assert STATE_PAYLOAD.unpack(raw[HEADER_SIZE:]) == (1,)
    mesh.close()
    t.join(30)
    mesh.dispose()


@pytest.mark.parametrize("abort", [False, True])
def test_shutdown_and_abort_fail_everything_queued(abort: bool) -> None:
    """A posted receive nobody answers, an op blocked on data nobody sends and an op queued
    behind it: shutdown (bounded drain) or abort completes every Work with an error, and
    later submits raise at once."""
    from mccl import CollectiveError
    from mccl.device.cpu import CpuHandoff
    from mccl.engine import Engine, Job
    from mccl.work import Work

    mesh, far = make_mesh(2, timeout_s=60.0)
    engine = Engine(mesh, "t", MAX_CHUNK_BYTES)

    def job(name: str, body, collective: bool = True) -> Job:
        return Job(name, SIG, body, Work(name), CpuHandoff([]), collective=collective)

    posted = job("recv", None, False)  # parked: a message nobody sends
    posted.park = lambda ch, h, done: mesh.post_recv(1, 0, bytearray(4), lambda pr: done())
    posted = engine.submit(posted)
    stuck = engine.submit(job("all_reduce", lambda ch, h: mesh.recv_data(1, 2, SIG,
                                                                         bytearray(4))))
    behind = engine.submit(job("all_reduce", lambda ch, h: None))
    engine.shutdown(abort=abort, drain_s=0.5)
    for w in (posted, stuck, behind):
        assert w.is_completed()
        with pytest.raises(CollectiveError, match="aborted" if abort else "shut down"):
            w.wait()
    with pytest.raises(CollectiveError, match="aborted" if abort else "shut down"):
        engine.submit(job("barrier", lambda ch, h: None))
    for s in far.values():
        s.close()


def test_shutdown_waits_for_ops_that_keep_finishing() -> None:
    """Queued ops that take longer in all than ``drain_s`` but keep finishing, and a blocking
    op a caller's thread runs inline, all complete before shutdown cuts anything (it cut the
    connections after a fixed 5 s, so ranks kept different results)."""
    from mccl.device.cpu import CpuHandoff
    from mccl.engine import Engine, Job
    from mccl.work import Work

    mesh, far = make_mesh(2, timeout_s=60.0)
    engine = Engine(mesh, "t", MAX_CHUNK_BYTES)

    def slow(ch, h) -> None:
        time.sleep(0.2)
        if mesh.closed:
            raise RuntimeError("the connections were cut under the op")
        try:
            far[1].recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        raise RuntimeError("the peer was told goodbye under the op")

    def job(name: str) -> Job:
        return Job(name, SIG, slow, Work(name), CpuHandoff([]))

    inline = Work("inline")
    caller = threading.Thread(
        target=lambda: engine.submit(Job("inline", SIG, slow, inline, CpuHandoff([])),
                                     inline=True))
    caller.start()
    time.sleep(0.05)  # the inline op is running on the caller's thread
    queued = [engine.submit(job(f"all_reduce{i}")) for i in range(6)]  # 1.2 s in all
    engine.shutdown(drain_s=0.5)
    caller.join(10)
    for w in [inline, *queued]:
        assert w.is_completed()
        w.wait()
    for s in far.values():
        s.close()


class _SpyHandoff(CpuHandoff):
    """A CPU hand-off that notes the thread that acquires it and each ``queued`` call."""

    def __init__(self, fail: BaseException | None = None):
        super().__init__([])
        self.queued_on: list[threading.Thread] = []
        self.acquired_on: threading.Thread | None = None
        self.fail = fail

    def queued(self) -> None:
        self.queued_on.append(threading.current_thread())
        if self.fail is not None:
            raise self.fail

    def acquire(self) -> list:
        self.acquired_on = threading.current_thread()
        return super().acquire()


def test_an_op_prepared_inline_is_told_on_the_callers_thread_when_it_is_queued() -> None:
    """A blocking op (``inline``) runs on the caller's thread while the group is idle, its
    hand-off never told otherwise; behind a running op it goes to the comm thread, and its
    hand-off hears ``queued`` first, on the caller's thread (CUDA then moves its copies from
    the caller's stream to the side stream). An op not prepared inline never hears it, and a
    ``queued`` that raises fails that op in its turn instead of leaving the queue stuck."""
    from mccl import CollectiveError
    from mccl.engine import Engine, Job
    from mccl.work import Work

    mesh, far = make_mesh(2, timeout_s=60.0)
    engine = Engine(mesh, "t", MAX_CHUNK_BYTES)
    me = threading.current_thread()
    try:
        def submit(handoff: _SpyHandoff, inline: bool, body=lambda ch, h: None) -> Work:
            return engine.submit(Job("all_reduce", SIG, body, Work("all_reduce"), handoff),
                                 inline=inline)

        idle = _SpyHandoff()
        submit(idle, inline=True).wait()
        assert idle.acquired_on is me and idle.queued_on == []

        release = threading.Event()
        running = submit(_SpyHandoff(), inline=False,
                         body=lambda ch, h: release.wait(10))
        behind, plain = _SpyHandoff(), _SpyHandoff()
        works = [submit(behind, inline=True), submit(plain, inline=False)]
        assert behind.queued_on == [me]  # told before the comm thread can take it
        release.set()
        for w in (running, *works):
            w.wait()
        assert behind.acquired_on is engine._thread and plain.queued_on == []

        release.clear()
        running = submit(_SpyHandoff(), inline=False, body=lambda ch, h: release.wait(10))
        broken = submit(_SpyHandoff(fail=RuntimeError("no side stream")), inline=True)
        release.set()
        running.wait()
        with pytest.raises(CollectiveError, match="no side stream"):
            broken.wait()
    finally:
        engine.shutdown(abort=True)
        for s in far.values():
            s.close()


def test_abort_cuts_a_shutdown_that_is_draining() -> None:
    """A shutdown waits for an op blocked on a silent peer (here for up to a minute); an abort
    from another thread meanwhile fails it at once (it did nothing: the group was stopped)."""
    from mccl import CollectiveError
    from mccl.device.cpu import CpuHandoff
    from mccl.engine import Engine, Job
    from mccl.work import Work

    mesh, far = make_mesh(2, timeout_s=60.0)
    engine = Engine(mesh, "t", MAX_CHUNK_BYTES)
    stuck = engine.submit(Job("all_reduce", SIG,
                              lambda ch, h: mesh.recv_data(1, 1, SIG, bytearray(4)),
                              Work("all_reduce"), CpuHandoff([])))
    draining = threading.Thread(target=engine.shutdown)
    draining.start()
    time.sleep(0.3)
    assert draining.is_alive()
    engine.shutdown(abort=True)
    draining.join(20)
    assert not draining.is_alive(), "the shutdown still drains after the abort"
    with pytest.raises(CollectiveError, match="aborted"):
        stuck.wait()
    for s in far.values():
        s.close()


def test_shutdowns_in_a_row_share_one_wait() -> None:
    """Groups shut down one after another (torch's destroy, the exit) share each wait's
    deadline, so a stalled peer costs it once, not once per group; a shutdown that comes
    later gets a deadline of its own."""
    from mccl import engine as eng

    clock = [100.0]
    shared = eng._SharedDeadline(1.0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(eng.time, "monotonic", lambda: clock[0])
        assert shared.left() == 1.0  # the first group waits the whole second
        clock[0] += 1.0
        assert shared.left() == 0.0  # the next group, right after: nothing left to wait
        clock[0] += 0.1
        assert shared.left() == 0.0
        clock[0] += 5.0  # a destroy much later: a new deadline
        assert shared.left() == 1.0


def test_exit_says_bye_on_every_group_before_waiting_for_any() -> None:
    """At interpreter exit every group is stopped (BYE sent) before any waits for its peers'
    BYE: group by group in a set's order, which differs between ranks, each wait could last
    the whole grace period."""
    from mccl import engine as eng

    calls: list[tuple[str, str]] = []

    class Fake:
        def __init__(self, label: str) -> None:
            self.label = label

        def stop(self, abort: bool) -> bool:
            calls.append(("stop", self.label))
            return self.label != "stopped before"

        def close(self) -> None:
            calls.append(("close", self.label))

    fakes = [Fake(n) for n in ("a", "stopped before", "b")]
    saved = set(eng._LIVE)
    eng._LIVE.clear()
    try:
        for f in fakes:
            eng._LIVE.add(f)
        eng._shut_down_at_exit()
    finally:
        eng._LIVE.clear()
        for e in saved:
            eng._LIVE.add(e)
    kinds = [k for k, _ in calls]
    assert kinds == ["stop"] * 3 + ["close"] * 2, calls
    assert ("close", "stopped before") not in calls


def test_a_failed_send_reports_the_error_frame_the_peer_left() -> None:
    """The peer reported why it gave up, then closed: sending to it fails with a broken pipe,
    but the op's error carries the peer's reason (read from the socket), not the pipe."""
    mesh, far = make_mesh(2)
    reason = b"collective mismatch: rank 1 issued something else"
    far[1].sendall(pack_header(ERROR, Signature(0, root=-1), GROUP, 1, len(reason)) + reason)
    far[1].close()
    time.sleep(0.2)
    mesh.begin_op(1, SIG)
    with pytest.raises(PeerError, match="collective mismatch") as info:
        for _ in range(100):  # the first writes may still be taken by the socket buffer
            mesh.send(1, DATA, SIG, 1, np.zeros(1 << 15, dtype=np.uint8))
            time.sleep(0.01)
    assert "reported by rank 1" in str(info.value), info.value
    mesh.dispose()


def test_a_failed_send_reports_the_mismatch_the_peers_data_shows() -> None:
    """The peer sent data of another op at this op's number (then its error frame, which
    comes after), and left: the send's error is the mismatch, not the broken pipe (found
    by a hunt: 5 of 60 runs named the pipe where a rank exited right after a mismatch)."""
    mesh, far = make_mesh(2)
    other = Signature(2, 1, 0, 0, 4)
    reason = b"collective mismatch: rank 1 issued something else"
    far[1].sendall(pack_header(DATA, other, GROUP, 1, 16) + bytes(16)
                   + pack_header(ERROR, Signature(0, root=-1), GROUP, 1, len(reason)) + reason)
    far[1].close()
    time.sleep(0.2)
    mesh.begin_op(1, SIG)
    with pytest.raises((PeerError, MismatchError), match="collective mismatch"):
        for _ in range(100):  # the first writes may still be taken by the socket buffer
            mesh.send(1, DATA, SIG, 1, np.zeros(1 << 15, dtype=np.uint8))
            time.sleep(0.01)
    mesh.dispose()


def test_a_send_to_a_peer_that_left_raises_before_it_is_lost() -> None:
    """``check_open`` (what a CPU p2p send looks at first, from the caller's thread): a
    peer's BYE or error frame waiting in the socket, or the end of its stream, raises."""
    for frame, words in ((pack_header(BYE, Signature(0), GROUP, 0, 0), "shut the group down"),
                         (pack_header(ERROR, Signature(0), GROUP, 0, 4) + b"oops", "oops"),
                         (b"", "closed the connection")):
        mesh, far = make_mesh(2)
        mesh.check_open(1)  # nothing there yet: fine
        far[1].sendall(frame)
        far[1].close()
        time.sleep(0.1)
        with pytest.raises(PeerError, match=words):
            mesh.check_open(1)
        mesh.dispose()


def _read_slowly(sock: socket.socket, got: bytearray, n: int) -> None:
    sock.settimeout(5)
    while len(got) < n:
        chunk = sock.recv(1 << 20)
        if not chunk:
            return
        got.extend(chunk)
        time.sleep(0.02)  # about 50 MB/s


def test_a_large_frame_that_keeps_moving_outlasts_the_send_timeout() -> None:
    """A 40 MB frame to a peer that reads steadily but slowly takes longer than the send
    timeout: it must not fail (each blocking call writes one piece, so only a call that
    stalls near the timeout counts); to a peer that stops reading it fails."""
    from mccl.transport.tcp import Peer, tune_socket

    for reader in ("slow", "stopped"):
        mine, far = tcp_pair()
        tune_socket(mine, 0.25)  # sends give up after 0.5 s without progress
        p = Peer(1, mine, 0.25, "test")
        got = bytearray()

        t = threading.Thread(target=_read_slowly, args=(far, got, 40 << 20), daemon=True)
        if reader == "slow":
            t.start()
        payload = np.ones(40 << 20, dtype=np.uint8)
        try:
            p._write(b"", payload)
            outcome = "written"
        except OSError as e:
            outcome = type(e).__name__
        if reader == "slow":
            t.join(10)
            assert outcome == "written" and len(got) == 40 << 20, (outcome, len(got))
        else:
            assert outcome in ("TimeoutError", "BlockingIOError"), outcome
        mine.close()
        far.close()


def test_check_open_reads_no_header_while_a_reader_may_be_inside_a_frame() -> None:
    """While an op reads the sockets on another thread, the bytes at the head of a peer's
    stream may be the middle of a frame (a payload can hold anything, a BYE header too):
    ``check_open`` then only looks for the end of the stream. The op's own thread reads whole
    frames, so between its reads (where its sends check their peer) the head starts one."""
    mesh, far = make_mesh(2)
    far[1].sendall(pack_header(BYE, Signature(0), GROUP, 0, 0))
    time.sleep(0.1)
    t, out = in_thread(lambda: mesh.begin_op(1, SIG) or time.sleep(1.0))
    time.sleep(0.3)
    mesh.check_open(1)  # no error: this could be payload
    t.join(10)
    assert "error" not in out, out
    mesh.begin_op(2, SIG)
    with pytest.raises(PeerError, match="shut the group down"):
        mesh.check_open(1)  # the op's own thread
    mesh.end_op()
    with pytest.raises(PeerError, match="shut the group down"):
        mesh.check_open(1)  # no op
    mesh.dispose()


def test_a_peer_blocked_one_op_behind_on_a_third_rank_is_not_blamed() -> None:
    """Rank 0 waits in op #2 for rank 1, which reported it is still blocked in op #1 on rank
    2 (rank 0 had all it needed of op #1 and went on). Rank 1 is given time, and the report of
    rank 2's neighbour (an error frame blaming rank 2) is what rank 0 raises."""
    mesh, far = make_mesh(3, timeout_s=1.0, probe_s=0.05)
    mesh.begin_op(2, SIG)
    t, out = in_thread(lambda: mesh.recv_data(1, 2, SIG, np.zeros(4, dtype=np.int32)))
    far[1].sendall(pack_header(STATE, SIG, GROUP, 1, 4) + STATE_PAYLOAD.pack(2))
    time.sleep(1.4)  # past one group timeout, well within two
    text = b"no data from rank 2 for 1s (group timeout)"
    far[2].sendall(pack_header(ERROR, Signature(0, root=2), GROUP, 1, len(text)) + text)
    t.join(30)
    err = out.get("error")
    assert isinstance(err, PeerError) and err.culprit == 2, err
    mesh.dispose()


def test_a_send_to_a_peer_whose_end_was_dropped_says_so() -> None:
    """A peer process killed mid-stream resets the connection: the sender's error says what
    that likely means, as a receive's does, not only the errno."""
    import socket
    import struct

    from mccl.transport.tcp import Peer, tune_socket

    mine, far = tcp_pair()
    tune_socket(mine, 5.0)
    far.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    mine.sendall(b"x" * 10)  # unread at the far end: closing it sends a reset
    far.close()
    time.sleep(0.1)
    p = Peer(1, mine, 5.0, "test")
    try:
        for _ in range(100):
            p._write(b"", np.ones(1 << 16, dtype=np.uint8))
    except OSError as e:
        p.send_error = e
    assert p.send_error is not None
    msg = str(p.send_failure())
    assert "sending to rank 1 failed" in msg, msg
    assert "process exited, was killed or aborted the group?" in msg, msg
    mine.close()


@pytest.mark.timeout(30)
def test_a_coalesced_wait_has_one_timeout_for_the_whole_group() -> None:
    """``wait(timeout)`` on a coalesced group's Work bounds the whole wait (it gave each
    member the full timeout: 150 members of 0.2 s each would wait 30 s)."""
    from datetime import timedelta

    from mccl.errors import CollectiveError
    from mccl.work import GroupWork, Work

    done = Work("all_reduce")
    done.complete()
    group = GroupWork("coalesced", [done] + [Work("all_reduce") for _ in range(150)])
    with pytest.raises(CollectiveError, match="coalesced: wait\\(\\) timed out after 0.2s"):
        group.wait(timedelta(seconds=0.2))
    finished = GroupWork("coalesced", [done, done])
    assert finished.wait(timedelta(seconds=0.2)) is True


def test_a_bounded_store_call_gives_up_and_later_calls_fail_at_once() -> None:
    import threading

    from mccl.transport.rendezvous import BoundedStore

    release = threading.Event()

    class Store:
        host = "store-host"

        def check(self, keys):
            return keys == ["k"]

        def get(self, key):
            raise KeyError(key)

        def add(self, key, amount):
            release.wait(30)
            return amount

    s = BoundedStore(Store(), 0.1)
    assert s.host == "store-host" and s.check(["k"]) is True
    with pytest.raises(KeyError):  # the store's own errors pass through
        s.get("x")
    with pytest.raises(TimeoutError, match="gave no answer to add"):
        s.add("n", 1)
    with pytest.raises(TimeoutError, match="an earlier add"):  # queued behind it anyway
        s.check(["k"])
    release.set()


def test_a_timeout_says_when_no_other_peer_was_heard_either() -> None:
    """A rank whose own link went down hears nobody: its timeout says so (the peers stalled
    in the op tell every rank what they wait for, so a rank with a working link hears
    them), while the peer it waited for stays the one named."""
    mesh, far = make_mesh(size=3, timeout_s=0.3, probe_s=0.05)
    try:
        with pytest.raises(PeerError, match="nothing came from any other rank either") as e:
            mesh.recv_data(1, 1, SIG, bytearray(8), b"")
        assert e.value.peer == 1 and "no data from rank 1" in str(e.value)
        stalled = time.monotonic()
        mesh.peer(2).heard_at = stalled + 3600  # rank 2 was heard during the stall
        with pytest.raises(PeerError, match="no data from rank 1") as e:
            mesh.recv_data(1, 2, SIG, bytearray(8), b"")
        assert "any other rank" not in str(e.value)
    finally:
        mesh.close()
        for s in far.values():
            s.close()


@pytest.mark.skipif(not hasattr(socket, "TCP_CONGESTION"), reason="no per-socket congestion "
                    "control here (Linux only)")
def test_data_sockets_leave_bbr_and_keep_what_the_kernel_refuses(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """BBR's PROBE_RTT stalls a ring's always-busy flows: a data socket on BBR moves to
    CUBIC where the kernel lets this process pick it; other congestion controls stay; a swap
    the kernel refuses leaves the socket as it was, without an error."""
    from mccl.transport import tcp

    with socket.socket() as probe:
        try:
            probe.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"cubic")
            cubic_allowed = True
        except OSError:  # not loaded, or not allowed to this (unprivileged) process
            cubic_allowed = False

    def tuned(system: bytes) -> str:
        mine, far = tcp_pair()
        try:
            try:
                mine.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, system)
            except OSError:
                pytest.skip(f"{system.decode()} is not available here")
            tcp.tune_socket(mine, 5.0)
            return tcp.congestion_control(mine)
        finally:
            mine.close()
            far.close()

    assert tuned(b"bbr") == ("cubic" if cubic_allowed else "bbr")
    assert tuned(b"reno") == "reno"
    assert tcp.data_congestion_control("bbr") == "cubic"
    with socket.socket() as plain:
        system = tcp.congestion_control(plain)
    expected = tcp.data_congestion_control(system) if cubic_allowed else system
    assert tcp.probe_data_congestion_control() == expected  # what the doctor reports
    monkeypatch.setitem(tcp.CONGESTION_CONTROL_SWAPS, b"bbr", b"no-such-cc")
    assert tuned(b"bbr") == "bbr"
    assert tcp.probe_data_congestion_control() == system


@pytest.mark.skipif(not hasattr(socket, "TCP_CONGESTION"), reason="no TCP_CONGESTION here")
def test_data_connections_are_made_on_the_swapped_congestion_control(monkeypatch) -> None:
    """The swap happens before a connection exists: on the dialling socket before connect,
    on the listener before listen (an accepted connection inherits it). A connection moved
    off BBR once made keeps what BBR set up at its start (the kernel's pacing), and read a
    point or more under gloo at 10 Gbit. The sockets the mesh set-up hands over, before
    ``tune_socket`` sees them, are already on the swapped control at both ends."""
    from mccl.transport import tcp

    with socket.socket() as plain:
        system = tcp.congestion_control(plain)
    target = "reno" if system != "reno" else "cubic"
    with socket.socket() as probe:
        try:
            probe.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, target.encode())
        except OSError:
            pytest.skip(f"{target} is not available or not allowed here")
    monkeypatch.setitem(tcp.CONGESTION_CONTROL_SWAPS, system.encode(), target.encode())
    world = 3
    results = mesh_in_threads(dist.HashStore(), range(world), world, "swapped-early", 30.0)
    try:
        assert all(isinstance(results.get(r), tuple) for r in range(world)), results
        got = {(r, p): tcp.congestion_control(s) for r, (_, socks) in results.items()
               for p, s in socks.items()}
        assert len(got) == world * (world - 1)
        assert set(got.values()) == {target}, got
    finally:
        for done in results.values():
            if isinstance(done, tuple):
                for s in done[1].values():
                    s.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")
def test_a_forked_child_gets_an_error_from_a_future_made_before_the_fork() -> None:
    """A Work issued before a fork fails in the child when waited on there, and so does the
    Future asked for before the fork. That Future is completed by a worker thread, and a
    worker the parent had idle at the fork was counted as there in the child: the child
    waited for it for good."""
    from mccl import work
    from mccl.work import Work

    warm = Work("warm")
    fut = warm.get_future()
    warm.complete()  # a worker completes it, then idles
    fut.wait()
    deadline = time.monotonic() + 10
    while work._COMPLETER._idle == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    pending = Work("all_reduce")
    asked = pending.get_future()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        said = []
        try:
            for call in (pending.wait, asked.wait):
                try:
                    call()
                    said.append("NO ERROR")
                except Exception as e:  # noqa: BLE001
                    said.append(str(e))
            os.write(w, "\x1e".join(said).encode()[:8000])
        finally:
            os._exit(0)
    os.close(w)
    answered, _, _ = select.select([r], [], [], 20)
    if not answered:  # the child hangs
        os.kill(pid, signal.SIGKILL)
    with os.fdopen(r, "rb") as f:
        said = f.read().decode().split("\x1e") if answered else []
    os.waitpid(pid, 0)
    assert len(said) == 2, f"the forked child answered {said!r} in 20 s"
    for text in said:
        assert "forked child cannot wait for it" in text, said


def test_an_idle_completer_worker_holds_nothing_of_the_last_completion() -> None:
    """A worker waiting for the next completion kept the last one's callable, and with it
    the op's result tensors, for up to ``IDLE_EXIT_S`` (30 s): memory a user had let go of
    stayed allocated."""
    import weakref

    import torch

    from mccl.work import _Completer

    completer = _Completer()
    result = torch.ones(4)
    gone = weakref.ref(result)
    ran = threading.Event()
    completer.run(lambda kept=result: ran.set())  # a completion that holds the result
    del result
    assert ran.wait(10)
    assert released(gone), "the idle worker still holds the last completion's tensors"
