"""Per-chunk timeline of mccl ring collectives on emulated hosts: where does the link go idle?

    python benchmarks/timeline.py --hosts 4 --rate 10gbit --op all_reduce --size 64M --out DIR

Every rank records, with one system-wide clock, when each op starts and ends, when each chunk
is queued for sending and how many bytes were already waiting in the socket when its receive
began (FIONREAD), when the sender thread writes and how many bytes were still unacknowledged
then (SIOCOUTQ: near zero means the link may have run dry), and TCP_INFO of its two ring
sockets after every op. The summary puts each op's time beside the ideal transfer time (bytes
over the measured single-stream ceiling) and reports where the rest may go: Python before the
first send and after the last receive, the receive rate in the middle of the op, writes that
found the link nearly dry, and per link how much longer its bytes took than they need.
Linux only (FIONREAD and TCP_INFO fields as Linux lays them out); a diagnostic, not a test.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import resource
import socket
import statistics
import struct
import sys
import termios
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mccl.bench.cli import add_rx_steering, steering  # noqa: E402
from mccl.bench.report import parse_size  # noqa: E402
from mccl.bench.spawn import Hosts, run_ranks  # noqa: E402

PG_TIMEOUT_S = 120.0  # torch.distributed timeout inside the ranks

#: struct tcp_info (linux/tcp.h, 4.10+) up to tcpi_snd_wnd: 8 u8, 24 u32, then the 64-bit
#: counters and the chrono stats (tcpi_busy_time = all time with data to send; the rwnd and
#: sndbuf parts of it: limited by the receiver's window, by our send buffer). Older kernels
#: return a shorter struct: the missing fields read 0.
TCP_INFO_FMT = "=8B24I4Q2I4IQ3Q2I2Q2I2I"
TCP_INFO_FIELDS = {"ca_state": 1, "rtt_us": 8 + 15, "snd_cwnd": 8 + 18, "snd_mss": 8 + 2,
                   "unacked": 8 + 4, "sacked": 8 + 5, "lost": 8 + 6, "retrans": 8 + 7,
                   "snd_ssthresh": 8 + 17, "reordering": 8 + 20, "rcv_space": 8 + 22,
                   "total_retrans": 8 + 23, "pacing_rate": 32, "bytes_received": 35,
                   "notsent_bytes": 38, "min_rtt_us": 39, "delivery_rate": 42,
                   "busy_us": 43, "rwnd_limited_us": 44, "sndbuf_limited_us": 45,
                   "bytes_sent": 48, "bytes_retrans": 49, "reord_seen": 51, "snd_wnd": 53}
#: Sampled every SAMPLE_S from the send socket during the trace (both backends).
SAMPLE_FIELDS = ("ca_state", "rtt_us", "snd_cwnd", "unacked", "notsent_bytes", "pacing_rate",
                 "delivery_rate", "app_limited")
SAMPLE_S = 0.005


def tcp_info(sock: socket.socket) -> dict[str, int]:
    size = struct.calcsize(TCP_INFO_FMT)
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, size)
    vals = struct.unpack(TCP_INFO_FMT, raw.ljust(size, b"\0"))
    info = {k: vals[i] for k, i in TCP_INFO_FIELDS.items()}
    info["app_limited"] = vals[7] & 1  # tcpi_delivery_rate_app_limited
    return info


def peer_sockets(addrs: list[str]) -> dict[int, socket.socket]:
    """This process's busiest TCP connection to each other rank's host (``addrs[rank]``):
    gloo keeps its sockets out of Python's reach, so they are found by their file
    descriptors (Linux /proc)."""
    best: dict[int, tuple[int, socket.socket]] = {}
    for fd in Path("/proc/self/fd").iterdir():
        try:
            if not os.readlink(fd).startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(fd.name)))
        except (OSError, ValueError):
            continue
        try:
            if s.family != socket.AF_INET or s.type != socket.SOCK_STREAM:
                raise OSError
            peer = addrs.index(s.getpeername()[0])
            info = tcp_info(s)
            moved = info["bytes_sent"] + info["bytes_received"]
        except (OSError, ValueError):
            s.close()
            continue
        if peer not in best or moved > best[peer][0]:
            if peer in best:
                best[peer][1].close()
            best[peer] = (moved, s)
        else:
            s.close()
    return {peer: s for peer, (_, s) in best.items()}


def _sampler(sock: socket.socket, samples: list, stop: threading.Event) -> None:
    """Samples of the send socket's state (bounded by the trace: ``stop`` ends it)."""
    while not stop.wait(SAMPLE_S):
        info = tcp_info(sock)
        samples.append([time.monotonic()] + [info[k] for k in SAMPLE_FIELDS])


def _ioctl_int(sock: socket.socket, request: int) -> int:
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), request, b"\0" * 4))[0]


def waiting_bytes(sock: socket.socket) -> int:
    """Bytes received and not yet read (FIONREAD)."""
    return _ioctl_int(sock, termios.FIONREAD)


def unacked_bytes(sock: socket.socket) -> int:
    """Bytes written to the socket that the peer has not acknowledged yet (SIOCOUTQ)."""
    return _ioctl_int(sock, termios.TIOCOUTQ)


def softnet_drops() -> int:
    """Packets the kernel dropped because a CPU's input backlog was full (all CPUs:
    /proc/net/softnet_stat, second column). Veth hands every packet to such a backlog, so
    on one box a CPU too busy to drain it loses packets of the emulated links."""
    try:
        lines = Path("/proc/net/softnet_stat").read_text().split("\n")
    except OSError:
        return -1
    return sum(int(ln.split()[1], 16) for ln in lines if ln.strip())


def _sysctl(name: str) -> int | None:
    try:
        return int(Path("/proc/sys", name).read_text())
    except (OSError, ValueError):
        return None


#: A sender-thread write that finds fewer bytes than this in flight may have let the link idle.
DRY_BYTES = 64 << 10


#: TcpExt counters (/proc/net/netstat, per network namespace) reported per trace: how TCP
#: lost, found and undid losses, and how it saw reordering.
NETSTAT_KEYS = ("TCPLostRetransmit", "TCPFastRetrans", "TCPSlowStartRetrans", "TCPTimeouts",
                "TCPLossProbes", "TCPSpuriousRTOs", "TCPDSACKRecv", "TCPDSACKUndo",
                "TCPLossUndo", "TCPSACKReorder", "TCPTSReorder", "TCPOFOQueue", "TCPRcvQDrop",
                "TCPBacklogDrop", "TCPSackRecovery", "TCPSACKReneging")


def netstat() -> dict[str, int]:
    """TcpExt counters of this process's network namespace ({} where there are none)."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return {}
    for head, vals in zip(lines[::2], lines[1::2], strict=False):
        if head.startswith("TcpExt:"):
            return dict(zip(head.split()[1:], map(int, vals.split()[1:]), strict=False))
    return {}


def rank_main(rank: int, world: int, op: str, size: int, reps: int, out: str,
              backend: str = "mccl", addrs: list[str] | None = None,
              barrier: bool = False, device: str = "cpu") -> None:
    """One rank (run by run_ranks, group already up): warm up, then trace ``reps`` back-to-back
    ops of ``size`` bytes (all_gather: the gathered output, reduce_scatter: the full input, as
    the bench counts them) and write the trace to ``out``. With gloo the op times, the
    namespace's TCP counters and its sockets' TCP_INFO are recorded (found through ``addrs``,
    the hosts' addresses; its chunks are not reachable). ``barrier``: every op starts after a
    barrier on a separate gloo group, as each of the bench's one-op samples does. ``device``:
    where the tensors live (``cuda``: the GPU of index rank % GPUs, copied through the host
    by the backend; an op's end is when the call returned, as the bench's back-to-back runs
    count it)."""
    import torch
    import torch.distributed as dist

    now = time.monotonic
    events: list[tuple] = []
    dev = torch.device("cpu")
    if device == "cuda":
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    full = torch.ones(size // 4 // world * world, device=dev)
    part = torch.ones(full.numel() // world, device=dev)
    run = {"all_reduce": lambda: dist.all_reduce(full),
           "all_gather": lambda: dist.all_gather_into_tensor(full, part),
           "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, full)}[op]
    tgroup = dist.new_group(backend="gloo") if barrier else None
    for _ in range(3):
        run()
    if backend == "mccl":
        socks, send_peer = _instrument(events, rank, world), (rank + 1) % world
    else:
        socks = peer_sockets(addrs) if addrs else {}
        socks = {r: socks[r] for r in {(rank + 1) % world, (rank - 1) % world} & set(socks)}
        # gloo's all-reduce ring sends to rank - 1, its all-gather ring to rank + 1
        send_peer = (rank + (1 if op == "all_gather" else -1)) % world
    infos: list[dict] = []
    samples: list[list] = []
    stop = threading.Event()
    sampler = None
    if send_peer in socks:
        sampler = threading.Thread(target=_sampler, args=(socks[send_peer], samples, stop),
                                   daemon=True)
    dist.barrier()
    events.clear()
    tcp0, use0, t0 = netstat(), resource.getrusage(resource.RUSAGE_SELF), now()
    infos.append({str(r): tcp_info(s) for r, s in socks.items()})
    if sampler is not None:
        sampler.start()
    for i in range(reps):
        if tgroup is not None:
            dist.barrier(group=tgroup)
        events.append((now(), "start", i, 0))
        run()
        events.append((now(), "end", i, 0))
        infos.append({str(r): tcp_info(s) for r, s in socks.items()})
    stop.set()
    if sampler is not None:
        sampler.join(1.0)
    if device == "cuda":
        torch.cuda.synchronize()
    tcp1, use1, t1 = netstat(), resource.getrusage(resource.RUSAGE_SELF), now()
    cpu = {"wall_s": t1 - t0, "user_s": use1.ru_utime - use0.ru_utime,
           "sys_s": use1.ru_stime - use0.ru_stime,
           "voluntary_switches": use1.ru_nvcsw - use0.ru_nvcsw,
           "involuntary_switches": use1.ru_nivcsw - use0.ru_nivcsw}
    (Path(out) / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "world": world, "events": events, "tcp": infos, "cpu": cpu,
        "send_peer": send_peer, "samples": samples, "sample_fields": SAMPLE_FIELDS,
        "netstat": {k: tcp1.get(k, 0) - tcp0.get(k, 0) for k in NETSTAT_KEYS if k in tcp1}}))


def _instrument(events: list[tuple], rank: int, world: int) -> dict:
    """Patch mccl's channel and sender writes to log chunk events; the ring sockets."""
    import torch.distributed as dist

    from mccl import engine
    from mccl.transport import tcp

    now = time.monotonic
    send0, recv0, write0 = engine.OpChannel.send, engine.OpChannel.recv, tcp.Peer._write

    def send(self, peer, buf):
        events.append((now(), "send", peer, buf.nbytes))
        return send0(self, peer, buf)

    def recv(self, peer, buf):
        events.append((now(), "recv", peer, waiting_bytes(self.mesh.peer(peer).sock)))
        recv0(self, peer, buf)
        events.append((now(), "got", peer, buf.nbytes))

    def write(self, header, payload, last=True):
        events.append((now(), "write", self.rank, unacked_bytes(self.sock)))
        write0(self, header, payload, last)
        events.append((now(), "wrote", self.rank, 0))

    passed0 = engine.OpChannel.passed

    def passed(self, peer, ticket):  # reduce-scatter asks whether a pool slot is free
        ok = passed0(self, peer, ticket)
        events.append((now(), "slot", peer, int(ok)))
        return ok

    engine.OpChannel.send, engine.OpChannel.recv = send, recv
    engine.OpChannel.passed = passed
    tcp.Peer._write = write
    mesh = dist.group.WORLD._engine.mesh
    return {r: mesh.peer(r).sock for r in {(rank + 1) % world, (rank - 1) % world} - {rank}}


def summarize(out: Path, ceiling_bps: float, link_bytes: int = 0) -> dict:
    """Medians over ops and ranks (period, ideal, Python before the first send and after the
    last receive, receive rate mid-op, dry writes), each link's excess per op, retransmits.
    ``link_bytes``: what one link carries per op, for the ideal time of traces without
    chunk events (gloo)."""
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    world = ranks[0]["world"]
    rows = []
    for d in ranks:
        op = None
        for t, kind, a, b in d["events"]:
            if kind == "start":
                op = {"rank": d["rank"], "op": a, "t0": t, "first_send": None, "gots": [],
                      "dry_writes": 0, "dry_gap": 0.0}
                wrote: dict[int, float] = {}
            elif op is None:
                continue
            elif kind == "send" and op["first_send"] is None:
                op["first_send"] = t - op["t0"]
            elif kind == "got":
                op["gots"].append((t, b))
            elif kind == "wrote":
                wrote[a] = t
            elif kind == "write" and b < DRY_BYTES and a in wrote:
                # The socket had (almost) nothing in flight: the link may have idled since
                # the previous write to this peer ended.
                op["dry_writes"] += 1
                op["dry_gap"] += t - wrote[a]
            elif kind == "end":
                gots = op["gots"]
                op["time"] = t - op["t0"]
                op["tail"] = t - gots[-1][0] if gots else 0.0
                nbytes = sum(b for _, b in gots) or link_bytes
                op["ideal"] = nbytes / ceiling_bps
                # Bytes after the first chunk over the time they took: the middle of the op.
                span = gots[-1][0] - gots[0][0] if len(gots) > 1 else 0.0
                op["mid_rate_pct"] = (100.0 * (nbytes - gots[0][1]) / span / ceiling_bps
                                      if span > 0 else None)
                op["first_got"] = gots[0][0] - op["t0"] if gots else None
                rows.append(op)
                op = None
    by_op: dict[int, list[dict]] = {}
    for r in rows:
        by_op.setdefault(r["op"], []).append(r)
    ops = sorted(by_op)
    # Link u -> u+1 in one op: from u's first send to u+1's last receive, minus the time its
    # bytes need at the ceiling. Near zero: the link never waited (skew between the ranks'
    # starts costs nothing by itself); large: that link ran below the ceiling in that op.
    excess: dict[str, list[float]] = {}
    for i in ops:
        ranks_i = {r["rank"]: r for r in by_op[i]}
        for u in range(world):
            src, dst = ranks_i.get(u), ranks_i.get((u + 1) % world)
            if src is None or dst is None or src["first_send"] is None or not dst["gots"]:
                continue
            took = dst["gots"][-1][0] - (src["t0"] + src["first_send"])
            need = sum(b for _, b in dst["gots"]) / ceiling_bps
            excess.setdefault(f"{u}->{(u + 1) % world}", []).append(1e3 * (took - need))
    for r in rows:
        r.pop("gots", None)
    # The op's period: from one op's earliest start to the next's (back to back).
    starts = [min(r["t0"] for r in by_op[i]) for i in ops]
    periods = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    skew = _skew(ranks, world)

    def med(key: str) -> float:
        return statistics.median(r[key] or 0.0 for r in rows)

    tcp_retrans, send_limits = {}, {}
    for d in ranks:
        if d["tcp"]:
            first, last = d["tcp"][0], d["tcp"][-1]
            tcp_retrans[d["rank"]] = {p: last[p]["total_retrans"] - first[p]["total_retrans"]
                                      for p in last}
            send_limits[d["rank"]] = _send_limits(d, world)
    tcp_ext: dict[str, int] = {}
    for d in ranks:
        for k, v in d.get("netstat", {}).items():
            tcp_ext[k] = tcp_ext.get(k, 0) + v
    # each rank's process (all its threads) over the trace: CPU time per op, context switches
    cpu = {d["rank"]: {"cpu_ms_per_op": round(1e3 * (d["cpu"]["user_s"] + d["cpu"]["sys_s"])
                                              / max(1, len(ops)), 2),
                       "sys_share": round(d["cpu"]["sys_s"] / max(1e-9, d["cpu"]["user_s"]
                                                                    + d["cpu"]["sys_s"]), 2),
                       "switches_per_op": round((d["cpu"]["voluntary_switches"]
                                                 + d["cpu"]["involuntary_switches"])
                                                / max(1, len(ops)))}
           for d in ranks if "cpu" in d}
    return {
        "world": world, "ops": len(ops), "ceiling_Bps": ceiling_bps,
        "tcp_ext_all_ranks_during_trace": tcp_ext,
        "cpu_per_rank_during_trace": cpu,
        "period_ms_median": 1e3 * statistics.median(periods) if periods else None,
        **skew,
        "ideal_ms": 1e3 * statistics.median(r["ideal"] for r in rows),
        "op_ms_median": 1e3 * med("time"),
        "op_ms_per_rank_op": [round(1e3 * r["time"], 1) for r in rows],  # rank by rank
        "before_first_send_us_median": 1e6 * med("first_send"),
        "after_last_recv_us_median": 1e6 * med("tail"),
        "first_recv_done_us_median": 1e6 * med("first_got"),
        "mid_op_receive_rate_pct_of_ceiling_median": med("mid_rate_pct"),
        "dry_writes_median": med("dry_writes"),
        "dry_gap_ms_median": 1e3 * med("dry_gap"),
        "link_excess_ms_per_op": {k: [round(x, 2) for x in v] for k, v in excess.items()},
        "comm_thread_per_rank": _comm_thread(ranks),
        "retransmits_during_trace": tcp_retrans,
        "send_socket_during_trace": send_limits,
        "tcp_info_last": {d["rank"]: d["tcp"][-1] if d["tcp"] else {} for d in ranks},
    }


def _comm_thread(ranks: list[dict]) -> dict:
    """Per rank (mccl), what its comm thread does between receives: the median time from a
    chunk's arrival to the next receive (reducing it, handing it to the sender thread), the
    share of the ops' time spent so, and the median bytes already waiting when a receive
    began (megabytes there: the rank falls behind its upstream neighbour), and for a
    reduce-scatter the share of its partial sums that found a cached pool slot free.
    Reduce-scatter's thread was busy about 60 % at 10 Gbit against 20 % in an all-reduce
    (twenty-fifth session, benchmarks/results/h200/call_s25d)."""
    out = {}
    for d in ranks:
        handling, waiting, slots, in_ops = [], [], [], 0.0
        got = t0 = None
        for t, kind, _, b in d["events"]:
            if kind == "slot":
                slots.append(b)
            elif kind == "start":
                got, t0 = None, t
            elif kind == "end" and t0 is not None:
                got, in_ops = None, in_ops + t - t0
            elif kind == "recv":
                waiting.append(b)
                if got is not None:
                    handling.append(t - got)
            elif kind == "got":
                got = t
        if handling and in_ops > 0:
            out[d["rank"]] = {
                "between_chunks_us_median": round(1e6 * statistics.median(handling)),
                "between_chunks_share_of_ops": round(sum(handling) / in_ops, 2),
                "waiting_at_recv_mb_median": round(statistics.median(waiting) / 1e6, 2)}
            if slots:  # reduce-scatter: share of partial sums that found a pool slot free
                out[d["rank"]]["pool_slot_free_share"] = round(sum(slots) / len(slots), 2)
    return out


def _skew(ranks: list[dict], world: int) -> dict:
    """How far apart the ranks start and end each op (both backends), and for mccl how long
    each ring link sat idle between ops: from its last delivery of op i (the receiver's last
    chunk) to its sender's first send of op i + 1. A rank that ends op i late starts op i + 1
    late, so its outgoing link waits that long."""
    bounds: dict[int, dict[int, list]] = {}
    for d in ranks:
        cur: list = []
        for t, kind, a, _ in d["events"]:
            if kind == "start":
                cur = [t, None, None, None]  # start, first send, last got, end
            elif kind == "send" and cur and cur[1] is None:
                cur[1] = t
            elif kind == "got" and cur:
                cur[2] = t
            elif kind == "end" and cur:
                cur[3] = t
                bounds.setdefault(a, {})[d["rank"]] = cur
    full = [b for _, b in sorted(bounds.items()) if len(b) == world]
    if not full:
        return {}
    out = {"start_skew_ms_median": 1e3 * statistics.median(
               max(b[0] for b in op.values()) - min(b[0] for b in op.values()) for op in full),
           "end_skew_ms_median": 1e3 * statistics.median(
               max(b[3] for b in op.values()) - min(b[3] for b in op.values()) for op in full)}
    gaps: dict[str, list[float]] = {}
    for op, nxt in zip(full, full[1:], strict=False):
        for u in range(world):
            v = (u + 1) % world
            if op[v][2] is not None and nxt[u][1] is not None:
                gaps.setdefault(f"{u}->{v}", []).append(1e3 * max(0.0, nxt[u][1] - op[v][2]))
    if gaps:
        out["link_idle_between_ops_ms_mean"] = {k: round(statistics.mean(v), 2)
                                                 for k, v in gaps.items()}
    return out


def _send_limits(d: dict, world: int) -> dict:
    """What held the rank's ring send socket back between the first and the last traced op
    (kernel chrono stats, jiffy resolution: meaningful summed over many ops), as % of that
    time, with the median RTT, congestion window and the receiver's window at op ends."""
    nxt = str(d.get("send_peer", (d["rank"] + 1) % world))
    infos = [i[nxt] for i in d["tcp"] if nxt in i]
    op_bounds = [t for t, kind, *_ in d["events"] if kind in ("start", "end")]
    if len(infos) < 2 or len(op_bounds) < 2:
        return {}
    span_us = 1e6 * (op_bounds[-1] - op_bounds[0])  # first op's start to last op's end
    first, last = infos[0], infos[-1]

    def pct(key: str) -> float:
        return round(100.0 * (last.get(key, 0) - first.get(key, 0)) / span_us, 1)

    def med(key: str) -> float:
        return statistics.median(i.get(key, 0) for i in infos)

    out = {"send_peer": int(nxt), "busy_pct": pct("busy_us"),
           "rwnd_limited_pct": pct("rwnd_limited_us"),
           "sndbuf_limited_pct": pct("sndbuf_limited_us"), "rtt_us_median": med("rtt_us"),
           "min_rtt_us": last.get("min_rtt_us", 0),
           "cwnd_bytes_median": med("snd_cwnd") * last.get("snd_mss", 0),
           "peer_window_bytes_median": med("snd_wnd"),
           "retransmitted_bytes": last.get("bytes_retrans", 0) - first.get("bytes_retrans", 0),
           "reorder_events": last.get("reord_seen", 0) - first.get("reord_seen", 0),
           "reordering_last": last.get("reordering", 0)}
    out.update(_sample_stats(d, last.get("snd_mss", 0)))
    return out


def _sample_stats(d: dict, mss: int) -> dict:
    """The send socket every SAMPLE_S during the trace: medians, and the share of samples in
    loss recovery (TCP_CA_Recovery or Loss), with nothing unsent, or app-limited."""
    fields = d.get("sample_fields") or []
    rows = [dict(zip(["t", *fields], row, strict=False)) for row in d.get("samples") or []]
    if not rows:
        return {}

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    def share(pred) -> float:
        return round(100.0 * sum(1 for r in rows if pred(r)) / len(rows), 1)

    return {"samples": len(rows),
            "sampled_rtt_us_median": med("rtt_us"),
            "sampled_cwnd_bytes_median": med("snd_cwnd") * mss,
            "sampled_unacked_bytes_median": med("unacked") * mss,
            "sampled_notsent_bytes_median": med("notsent_bytes"),
            "sampled_pacing_gbit_median": round(8e-9 * med("pacing_rate"), 3),
            "sampled_delivery_gbit_median": round(8e-9 * med("delivery_rate"), 3),
            "sampled_recovery_pct": share(lambda r: r["ca_state"] >= 3),
            "sampled_disorder_or_cwr_pct": share(lambda r: r["ca_state"] in (1, 2)),
            "sampled_nothing_unsent_pct": share(lambda r: r["notsent_bytes"] == 0),
            "sampled_app_limited_pct": share(lambda r: r["app_limited"]),
            "probe_rtt_spans": _probe_rtt_spans(rows)}


#: BBR's window in its PROBE_RTT phase (tcp_bbr.c, bbr_cwnd_min_target), in packets.
PROBE_RTT_WINDOW_PACKETS = 4


def _probe_rtt_spans(rows: list[dict]) -> list[list[float]]:
    """[start s after the first sample, length ms] of each run of samples whose window sat
    at PROBE_RTT's: BBR holds it there for 200 ms when the flow's minimum RTT went 10 s
    without renewal, and a ring waits for that link meanwhile."""
    spans: list[list[float]] = []
    start = last = None
    for r in rows + [{"t": None, "snd_cwnd": PROBE_RTT_WINDOW_PACKETS + 1}]:
        if r["snd_cwnd"] <= PROBE_RTT_WINDOW_PACKETS:
            start = r["t"] if start is None else start
            last = r["t"]
        elif start is not None:
            spans.append([round(start - rows[0]["t"], 3), round(1e3 * (last - start), 1)])
            start = None
    return spans


def link_bytes(op: str, size: int, world: int) -> int:
    """Bytes one ring link carries in one op of ``size`` (as the bench counts sizes)."""
    return size * (world - 1) // world * (2 if op == "all_reduce" else 1)


def _write_summary(out: Path, summary: dict) -> None:
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "tcp_info_last"}, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--op", default="all_reduce",
                    choices=["all_reduce", "all_gather", "reduce_scatter"])
    ap.add_argument("--size", default="4M")
    ap.add_argument("--backend", default="mccl", choices=["mccl", "gloo"],
                    help="gloo: op times and TCP counters only, for comparison")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="where the tensors live (cuda: through the backend's copies)")
    ap.add_argument("--burst", type=parse_size, default=None,
                    help="tbf bucket in bytes (default: the cluster's)")
    ap.add_argument("--cc", default=None,
                    help="every host's TCP congestion control, e.g. cubic (default: the "
                         "machine's)")
    ap.add_argument("--barrier", action="store_true",
                    help="start every op after a barrier on a separate gloo group, as the "
                         "bench's one-op samples do (default: back to back)")
    add_rx_steering(ap)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--analyze", action="store_true",
                    help="only summarize the traces already in --out (ceiling from its summary)")
    args = ap.parse_args()
    size = parse_size(args.size)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.analyze:  # re-summarize kept traces (rewrites summary.json, keeps the run's fields)
        old = json.loads((args.out / "summary.json").read_text())
        summary = summarize(args.out, old["ceiling_Bps"],
                            link_bytes(old.get("op", ""), old.get("size", 0), old["world"]))
        summary.update({k: v for k, v in old.items() if k not in summary})
        _write_summary(args.out, summary)
        return 0
    from mccl.bench.ceiling import measure_ceiling
    from mccl.bench.cluster import Cluster

    with Cluster(args.hosts, args.rate, burst=args.burst, cc=args.cc,
                 steer=steering(args.rx_steering)) as c:
        bps = measure_ceiling(c)["bytes_per_s"]
        drops0, softnet0 = c.drops(), softnet_drops()
        addrs = [c.addr(i) for i in range(args.hosts)]
        run_ranks(rank_main, args.hosts, args.op, size, args.reps, str(args.out),
                  args.backend, addrs, args.barrier, args.device, backend=args.backend,
                  timeout=args.timeout,
                  pg_timeout_s=PG_TIMEOUT_S, hosts=Hosts(tuple(c.hosts), c.addr(0), c.iface))
        drops1, softnet1 = c.drops(), softnet_drops()
    summary = summarize(args.out, bps, link_bytes(args.op, size, args.hosts))
    summary.update(op=args.op, size=size, rate=args.rate, hosts=args.hosts, backend=args.backend,
                   device=args.device,
                   tbf_burst=args.burst, barrier=args.barrier, cc=c.cc,
                   rx_steering=c.steer,
                   **{f"{where}_drops_during_run": {ns: count - drops0[where].get(ns, 0)
                                                    for ns, count in now.items()}
                      for where, now in drops1.items()},
                   softnet_drops_during_run=softnet1 - softnet0,
                   netdev_max_backlog=_sysctl("net/core/netdev_max_backlog"))
    _write_summary(args.out, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
