"""TCP payload ceiling of one link: what a single plain Python TCP stream can move per second.

Why: every bandwidth the benchmark reports is shown as a percentage of this number, so it has
to be measured the same way the backend moves bytes (one stream, ``sendall`` of a big
memoryview, ``recv_into`` a preallocated buffer) on the same path (host0 -> host1 of the
emulated cluster, or loopback without one). The first part of the transfer (TCP slow start)
is excluded, and the reported rate is the 90th percentile of 0.25 s windows, so a shared box's
other work does not pull the reference down (the mean is recorded too).

The sender/receiver roles run as separate processes started by file path, so they import
only the standard library (no torch start-up cost). Usage of the measuring side:
``python -m mccl.bench.ceiling [--cluster --rate 1gbit] [--seconds 3]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mccl.bench.cluster import Cluster

log = logging.getLogger(__name__)

CHUNK_BYTES = 4 << 20  # one sendall / recv_into buffer
DEFAULT_SECONDS = 3.0
WARMUP_FRACTION = 0.2  # leading part of the transfer ignored (slow start, buffer growth)
MAX_WARMUP_S = 1.0
ACCEPT_TIMEOUT_S = 30.0
IO_TIMEOUT_S = 15.0
PROCESS_SLACK_S = 40.0  # on top of the transfer time before the measurement is killed
WINDOW_S = 0.25  # per-window rates after warm-up
WINDOW_PERCENTILE = 90.0
MIN_WINDOWS = 4  # fewer (very short runs): report the mean
LOOPBACK = "127.0.0.1"
READY = "READY"


def _receive(bind: str, warmup_s: float) -> dict[str, Any]:
    """Accept one stream, read it to EOF; rates after warmup_s: mean and per-window.

    bytes_per_s is the WINDOW_PERCENTILE of WINDOW_S windows: the link's sustained rate, robust
    to other processes briefly stealing the CPU on a shared box (the mean is kept as well).
    """
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((bind, 0))
    srv.listen(1)
    srv.settimeout(ACCEPT_TIMEOUT_S)
    print(f"{READY} {srv.getsockname()[1]}", flush=True)
    conn, _ = srv.accept()
    srv.close()
    conn.settimeout(IO_TIMEOUT_S)
    buf = memoryview(bytearray(CHUNK_BYTES))
    total = 0
    t_first = t_mark = None
    mark_bytes = 0
    windows: list[float] = []
    win_t, win_bytes = 0.0, 0
    while True:
        n = conn.recv_into(buf)
        if n == 0:
            break
        now = time.perf_counter()
        if t_first is None:
            t_first = now
        total += n
        if t_mark is None and now - t_first >= warmup_s:
            t_mark, mark_bytes = now, total
            win_t, win_bytes = now, total
        elif t_mark is not None and now - win_t >= WINDOW_S:
            windows.append((total - win_bytes) / (now - win_t))
            win_t, win_bytes = now, total
        t_last = now
    conn.close()
    if t_first is None:
        raise RuntimeError("sender sent nothing")
    if t_mark is None or t_last <= t_mark:  # too short to skip warm-up: use everything
        t_mark, mark_bytes = t_first, 0
    dt = max(t_last - t_mark, 1e-9)
    mean = (total - mark_bytes) / dt
    best = _percentile(windows, WINDOW_PERCENTILE) if len(windows) >= MIN_WINDOWS else mean
    return {"bytes_per_s": best, "mean_bytes_per_s": mean, "window_s": WINDOW_S,
            "windows": len(windows), "bytes": total, "measured_bytes": total - mark_bytes,
            "measured_s": dt, "total_s": t_last - t_first}


def _percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (no numpy: this runs in the bare child process)."""
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[k]


def _send(host: str, port: int, seconds: float) -> None:
    """Stream CHUNK_BYTES buffers to host:port for `seconds`, then close."""
    conn = socket.create_connection((host, port), timeout=IO_TIMEOUT_S)
    buf = memoryview(bytearray(CHUNK_BYTES))
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        conn.sendall(buf)
    conn.shutdown(socket.SHUT_WR)
    conn.close()


def _role_argv(*args: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), *args]


def measure_ceiling(cluster: Cluster | None = None, seconds: float = DEFAULT_SECONDS,
                    src: int = 0, dst: int = 1) -> dict[str, Any]:
    """Measure one stream src -> dst on the cluster (or loopback if None); bytes/s and context.

    Processes are killed if they exceed the transfer time plus PROCESS_SLACK_S.
    """
    from mccl.bench.cluster import kill_tree, tcp_payload_ceiling  # parent-only dependency

    warmup = min(seconds * WARMUP_FRACTION, MAX_WARMUP_S)
    if cluster is not None:
        dst_addr = cluster.addr(dst)
        recv_argv = _role_argv("--role", "recv", "--bind", dst_addr, "--warmup", str(warmup))
        recv = cluster.popen(dst, recv_argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    else:
        dst_addr = LOOPBACK
        recv_argv = _role_argv("--role", "recv", "--bind", dst_addr, "--warmup", str(warmup))
        recv = subprocess.Popen(recv_argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    send = None
    deadline = time.monotonic() + seconds + warmup + PROCESS_SLACK_S
    try:
        assert recv.stdout is not None
        line = recv.stdout.readline()  # bounded: receiver exits after ACCEPT_TIMEOUT_S
        if not line.startswith(READY):
            err = recv.stderr.read() if recv.stderr else ""
            raise RuntimeError(f"ceiling receiver did not start: {line.strip()} {err.strip()}")
        port = line.split()[1]
        send_argv = _role_argv("--role", "send", "--host", dst_addr, "--port", port,
                               "--seconds", str(seconds + warmup))
        if cluster is not None:
            send = cluster.popen(src, send_argv, stderr=subprocess.PIPE, text=True)
        else:
            send = subprocess.Popen(send_argv, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True)
        out, err = recv.communicate(timeout=max(deadline - time.monotonic(), 1.0))
        send.wait(timeout=max(deadline - time.monotonic(), 1.0))
        if recv.returncode != 0:
            raise RuntimeError(f"ceiling receiver failed: {err.strip().splitlines()[-1:]}")
        result = json.loads(out.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        limit = seconds + warmup + PROCESS_SLACK_S
        raise RuntimeError(f"ceiling measurement timed out after {limit:.0f}s") from None
    finally:
        for proc in (recv, send):
            if proc is not None:
                kill_tree(proc)
    src_addr = cluster.addr(src) if cluster is not None else LOOPBACK
    result.update(mode="cluster" if cluster is not None else "loopback",
                  path=f"{src_addr} -> {dst_addr}", seconds=seconds)
    if cluster is not None and cluster.rate_bps:
        best = tcp_payload_ceiling(cluster.rate_bps, cluster.mtu)
        result.update(rate_bps=cluster.rate_bps, tcp_payload_max=best,
                      pct_of_tcp_payload_max=100.0 * result["bytes_per_s"] / best)
    log.info("ceiling %s: %.1f MB/s", result["path"], result["bytes_per_s"] / 1e6)
    return result


def main(argv: list[str] | None = None) -> int:
    """Child roles (--role recv/send) or a standalone measurement (default)."""
    p = argparse.ArgumentParser(prog="python -m mccl.bench.ceiling",
                                description="Single-stream TCP payload ceiling of one link.")
    p.add_argument("--role", choices=["measure", "recv", "send"], default="measure")
    p.add_argument("--bind", default=LOOPBACK)
    p.add_argument("--host", default=LOOPBACK)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--seconds", type=float, default=DEFAULT_SECONDS)
    p.add_argument("--cluster", action="store_true", help="host0 -> host1 of an emulated cluster")
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--rate", default="1gbit")
    args = p.parse_args(argv)
    if args.role == "recv":
        print(json.dumps(_receive(args.bind, args.warmup)), flush=True)
        return 0
    if args.role == "send":
        _send(args.host, args.port, args.seconds)
        return 0
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if args.cluster:
        from mccl.bench.cli import CliError, report, start_cluster
        from mccl.bench.cluster import DEFAULT_PREFIX

        try:  # bench's one-line errors (a bad rate, no root, a prefix in use)
            cl = start_cluster(max(args.hosts, 2), args.rate, DEFAULT_PREFIX)
        except CliError as exc:
            return report(exc)
        try:
            res = measure_ceiling(cl, args.seconds)
        finally:
            cl.down()
    else:
        res = measure_ceiling(None, args.seconds)
    print(json.dumps(res, indent=1))
    print(f"ceiling {res['path']}: {res['bytes_per_s'] / 1e6:.1f} MB/s"
          + (f" = {res['pct_of_tcp_payload_max']:.2f}% of the TCP payload max "
             f"{res['tcp_payload_max'] / 1e6:.1f} MB/s" if "tcp_payload_max" in res else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
