"""Emulated multi-host cluster on one Linux box: network namespaces, a bridge, tc tbf shaping.

Why: collectives over TCP are bound by link bandwidth and per-hop latency, and loopback has
neither a realistic rate nor a shared uplink. Each emulated host is a network namespace
(``<prefix>-h<i>``) with one veth (``eth0``) plugged into a Linux bridge that lives in its own
switch namespace (``<prefix>-sw``). Both directions of every link are shaped with ``tbf``
(host egress on ``eth0``, switch egress on the switch port), like a full-duplex NIC on a
non-blocking switch. Shaped links also get receive steering (``RPS_GLOB``), so each flow
arrives in order, as through a NIC. Nothing is created in the root namespace, so deleting our
namespaces removes every veth and the bridge with them.

Linux-only, needs root and iproute2 (``ip``/``tc``); point ``MCCL_IP``/``MCCL_TC`` at custom
binaries (see ``scripts/iproute2_env.sh``). Anything missing raises :class:`ClusterUnavailable`
with a one-line reason so callers/tests can skip cleanly.

CLI: ``python -m mccl.cluster up --hosts 4 --rate 1gbit | down | status | exec HOST -- cmd...``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..transport.tcp import data_congestion_control
from .cli import add_rx_steering, interrupt_on_sigterm, steering
from .report import CC_PATH, default_cc, parse_size, plural, read_proc

log = logging.getLogger(__name__)

ENV_IP = "MCCL_IP"  # path to a custom `ip` binary/wrapper
ENV_TC = "MCCL_TC"  # path to a custom `tc` binary/wrapper
DEFAULT_PREFIX = "mccl"
DEFAULT_SUBNET = "10.77.0"  # host i gets <subnet>.<i+1>/24
PREFIX_LEN = 24
MAX_HOSTS = 250
HOST_IFACE = "eth0"  # name of the veth end inside each host namespace
BRIDGE = "br0"
DEFAULT_HOSTS = 4
DEFAULT_RATE = "1gbit"
DEFAULT_MTU = 1500
# tbf sizing (measured here with one Python TCP stream: 1 ms of tokens at >=128 KiB reaches
# >=99.9% of the payload ceiling at 1gbit and 10gbit; the bucket must hold a 64 KiB GSO skb).
TBF_BURST_SECONDS = 1e-3
TBF_MIN_BURST = 128 * 1024
# The smallest bucket a caller may ask for: one 64 KiB GSO packet and its headers. A bucket
# holds what a link may send at veth speed after idling, which a real switch port cannot (it
# never sends faster than line rate), so a smaller one hands back less of a link's idle time
# (ninth session, benchmarks/results/h200: gloo's lead over mccl shrank with it). Too small a
# bucket starves TCP instead: 66 KiB at 1 Gbit halved a 4-rank ring's throughput here.
TBF_MIN_GSO_BURST = 66 * 1024
TBF_LIMIT_SECONDS = 10e-3  # queue: ~10 ms at rate, enough for one stream's cwnd without drops
TBF_MIN_LIMIT = 1 << 20
# Known artefact: a full bucket lets a message smaller than `burst` through at veth speed (a
# 64 KiB message after idle: ~270 us here vs 548 us of wire time at 1gbit), so mid-size
# points can read a little above the ceiling. A peak bucket (peakrate 1.05x, mtu 66000) fixes
# that for one stream but halved ring/bidirectional throughput in tests here, so it is not used.
# Per-packet bytes tbf counts (Ethernet header) and TCP/IP headers (IPv4+TCP+timestamps).
ETH_HEADER = 14
TCPIP_HEADERS = 52
CMD_TIMEOUT_S = 30.0
#: The congestion controls the kernel has. ``Cluster(cc=...)`` sets one as every host's
#: (``report.CC_PATH``: Linux >= 4.15 keeps it per network namespace, a new one starts with
#: the machine's), so a run can emulate hosts whose kernel differs from this machine's (BBR
#: here, CUBIC on most Linux distributions), for every backend and the ceiling alike.
CC_AVAILABLE = "/proc/sys/net/ipv4/tcp_available_congestion_control"
#: A namespace other than the first may only pick one of these; the cluster adds its ``cc``
#: for the run and puts the list back at ``down`` (it is the machine's, not a namespace's).
CC_ALLOWED = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"
#: Receive Packet Steering of every veth end (``Cluster(steer=True)``). A veth hands each
#: packet to the receive queue of the CPU that sent it, and a shaped link's packets leave its
#: tbf queue on whichever CPU runs that qdisc (the sender's, an ACK's, a timer's): two CPUs
#: then deliver one flow's packets in parallel and some arrive out of order, which a real
#: NIC (one flow, one queue) never does. Loss-based congestion control (CUBIC, Reno) takes
#: such reordering for loss and shrinks its window. Steering by flow hash puts every packet
#: of a flow on one CPU's queue, in order (twenty-fifth session: CUBIC hosts at 10 Gbit went
#: from up to a thousand retransmits per link in 12 all-reduces to none; results/h200).
RPS_GLOB = "/sys/class/net/{dev}/queues/rx-*/rps_cpus"
#: Present where the kernel has RPS (CONFIG_RPS, every mainstream distribution's).
RPS_PROBE = "/sys/class/net/lo/queues/rx-0/rps_cpus"
# Who owns a prefix: a live owner means another run is using it (do not tear it down); a dead
# one means whatever exists is a crashed run's leftovers (remove them). A run records its pid
# before it makes anything, so namespaces with no owner recorded, or PERSISTENT_OWNER, were
# made to stay (``python -m mccl.cluster up``, or by hand): a run refuses to replace them.
OWNER_DIR = "/run"
PERSISTENT_OWNER = "persistent"
KILL_WAIT_S = 5.0

_RATE_UNITS = {"": 1, "bit": 1, "k": 1e3, "kbit": 1e3, "m": 1e6, "mbit": 1e6, "g": 1e9,
               "gbit": 1e9, "t": 1e12, "tbit": 1e12}


class ClusterError(RuntimeError):
    """A cluster command failed (bring-up, teardown, exec)."""


class ClusterUnavailable(ClusterError):
    """This machine cannot host an emulated cluster (not Linux, not root, no iproute2...)."""


def parse_rate(rate: str | int | float | None) -> int | None:
    """Parse a tc-style bit rate ('1gbit', '100mbit', '10g', 1e9) to bits/s; None = unshaped."""
    if rate is None:
        return None
    if isinstance(rate, int | float):
        bits = float(rate)
    else:
        text = rate.strip().lower()
        if text in ("", "none", "0", "off", "unshaped"):
            return None
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]*)", text)
        if not m or m.group(2) not in _RATE_UNITS:
            raise ValueError(f"bad rate {rate!r}: use e.g. 1gbit, 10gbit, 100mbit or 'none'")
        bits = float(m.group(1)) * _RATE_UNITS[m.group(2)]
    if bits <= 0:
        return None
    if bits < 1:  # tc cannot shape below 1 bit/s; silently unshaped would mislead
        raise ValueError(f"bad rate {rate!r}: below 1 bit/s (use e.g. 100mbit, or 'none' "
                         "for unshaped links)")
    return int(bits)


def format_rate(bits_per_s: int | None) -> str:
    """Human form of a bit rate, e.g. 1000000000 -> '1gbit'."""
    if bits_per_s is None:
        return "none"
    for unit, scale in (("tbit", 1e12), ("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits_per_s >= scale:
            return f"{bits_per_s / scale:g}{unit}"
    return f"{bits_per_s}bit"


def rps_mask(cpus: int) -> str:
    """The rps_cpus value naming CPUs 0..cpus-1: hex, in 32-bit groups joined by commas."""
    bits = (1 << cpus) - 1
    groups = []
    while True:
        groups.append(bits & 0xFFFFFFFF)
        bits >>= 32
        if not bits:
            break
    return ",".join(f"{g:x}" if i == 0 else f"{g:08x}" for i, g in enumerate(reversed(groups)))


def tbf_params(bits_per_s: int, burst: int | None = None) -> tuple[int, int]:
    """(burst, limit) in bytes for tbf at this rate; see the TBF_* constants for why.
    ``burst``: the bucket's size instead of the default (at least TBF_MIN_GSO_BURST)."""
    bytes_per_s = bits_per_s / 8
    if burst is None:
        burst = max(int(bytes_per_s * TBF_BURST_SECONDS), TBF_MIN_BURST)
    elif burst < TBF_MIN_GSO_BURST:
        raise ValueError(f"tbf burst must be at least {TBF_MIN_GSO_BURST} bytes (one 64 KiB "
                         f"GSO packet with headers), got {burst}")
    limit = max(int(bytes_per_s * TBF_LIMIT_SECONDS), TBF_MIN_LIMIT, 4 * burst)
    return burst, limit


def tbf_spec(bits_per_s: int, burst: int | None = None) -> str:
    """The tc arguments after 'root' for one shaped link direction."""
    burst, limit = tbf_params(bits_per_s, burst)
    return f"tbf rate {bits_per_s}bit burst {burst} limit {limit}"


def available_cc() -> list[str]:
    """The congestion controls this kernel has loaded."""
    return read_proc(CC_AVAILABLE).split()


def tcp_payload_ceiling(bits_per_s: int, mtu: int = DEFAULT_MTU) -> float:
    """Best possible TCP payload bytes/s through a tbf link (headers eat into the rate)."""
    return bits_per_s / 8 * (mtu - TCPIP_HEADERS) / (mtu + ETH_HEADER)


def resolve_tool(name: str, explicit: str | None, env_var: str) -> str | None:
    """Find an iproute2 binary: explicit arg, then $env_var, then PATH (+ /sbin dirs)."""
    cand = explicit or os.environ.get(env_var)
    if cand:
        path = shutil.which(cand) or (cand if os.access(cand, os.X_OK) else None)
        return os.path.abspath(path) if path else None
    extra = os.pathsep.join(["/usr/sbin", "/sbin", "/usr/local/sbin"])
    return shutil.which(name, path=os.environ.get("PATH", "") + os.pathsep + extra)


def check_available(ip_bin: str | None, tc_bin: str | None, need_tc: bool = True, *,
                    ip_asked: str | None = None, tc_asked: str | None = None) -> None:
    """Raise ClusterUnavailable (one line) unless namespaces can be made here.
    ``ip_asked``/``tc_asked``: the paths the user gave (--ip/--tc), named if not found."""
    if not sys.platform.startswith("linux"):
        raise ClusterUnavailable(
            f"emulated cluster needs Linux network namespaces (this is {sys.platform}); "
            "run without --cluster")
    if os.geteuid() != 0:
        raise ClusterUnavailable("emulated cluster needs root (netns/veth/tc); run as root")
    if ip_bin is None:
        raise _tool_missing("ip", ip_asked, ENV_IP)
    if need_tc and tc_bin is None:
        raise _tool_missing("tc", tc_asked, ENV_TC)
    for tool in [ip_bin] + ([tc_bin] if need_tc and tc_bin else []):
        try:
            res = subprocess.run([tool, "-V"], capture_output=True, text=True,
                                 timeout=CMD_TIMEOUT_S)
        except OSError as exc:
            raise ClusterUnavailable(f"cannot run {tool}: {exc}") from None
        if res.returncode != 0:
            raise ClusterUnavailable(f"{tool} -V failed: {_first_line(res.stderr)}")


def _tool_missing(name: str, asked: str | None, env_var: str) -> ClusterUnavailable:
    """Why an iproute2 tool was not found, naming the path the user gave, if any."""
    given = asked or os.environ.get(env_var)
    if given:
        source = f"--{name}" if asked else f"${env_var}"
        return ClusterUnavailable(f"iproute2 '{name}' not found at {given} (from {source}): "
                                  "no such executable")
    return ClusterUnavailable(f"iproute2 '{name}' not found; install iproute2 or set {env_var} "
                              "(see scripts/iproute2_env.sh)")


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[0] if lines else "(no output)"


def _run_batches(jobs: Sequence[tuple[list[str], str]], what: str) -> None:
    """Run iproute2 batch commands in parallel (argv, stdin script); raise on any failure."""
    procs = [(argv, subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True))
             for argv, _ in jobs]
    errors = []
    try:
        for (argv, proc), (_, script) in zip(procs, jobs, strict=True):
            try:
                _, err = proc.communicate(script, timeout=CMD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                errors.append(f"{' '.join(argv)}: timed out after {CMD_TIMEOUT_S:.0f}s")
                continue
            if proc.returncode != 0:
                errors.append(f"{' '.join(argv[1:])}: {_first_line(err)}")
    finally:
        for _, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if errors:
        msg = f"{what} failed: {errors[0]}" + (f" (+{len(errors) - 1} more)" if errors[1:] else "")
        if any(s in e for e in errors for s in ("Operation not permitted", "Permission denied")):
            raise ClusterUnavailable(msg)
        raise ClusterError(msg)


def list_namespaces(ip_bin: str, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Names of existing namespaces that belong to a cluster with this prefix."""
    res = subprocess.run([ip_bin, "netns", "list"], capture_output=True, text=True,
                         timeout=CMD_TIMEOUT_S)
    if res.returncode != 0:
        raise ClusterError(f"ip netns list failed: {_first_line(res.stderr)}")
    pat = re.compile(rf"^{re.escape(prefix)}-(sw|h\d+)$")
    names = [ln.split()[0] for ln in res.stdout.splitlines() if ln.strip()]
    return sorted(n for n in names if pat.match(n))


def _kill_ns_processes(ip_bin: str, names: Sequence[str]) -> None:
    """SIGKILL every process still inside our namespaces (ranks of a crashed run)."""
    procs = [subprocess.Popen([ip_bin, "netns", "pids", n], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) for n in names]
    pids: set[int] = set()
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=CMD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            continue
        pids.update(int(tok) for tok in out.split() if tok.isdigit())
    pids.discard(os.getpid())
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if pids:
        log.info("killed %d leftover process(es) in cluster namespaces", len(pids))


def remove_namespaces(ip_bin: str, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Delete every namespace of this prefix (and with it every veth and the bridge)."""
    names = list_namespaces(ip_bin, prefix)
    if not names:
        return []
    _kill_ns_processes(ip_bin, names)
    script = "".join(f"netns del {n}\n" for n in names)
    subprocess.run([ip_bin, "-force", "-batch", "-"], input=script, capture_output=True,
                   text=True, timeout=CMD_TIMEOUT_S)
    left = list_namespaces(ip_bin, prefix)
    if left:
        raise ClusterError(f"could not delete namespaces: {' '.join(left)}")
    return names


def _owner_file(prefix: str) -> str:
    return os.path.join(OWNER_DIR, f"mccl-cluster-{prefix}.pid")


def _owner_record(prefix: str) -> str | None:
    """What the owner file of this prefix says (a pid or PERSISTENT_OWNER); None if none."""
    try:
        with open(_owner_file(prefix)) as f:
            words = f.read().split()
    except OSError:
        return None
    return words[0] if words else None


def owner_pid(prefix: str) -> int | None:
    """PID of the live process that brought this prefix up, if any (not ourselves)."""
    try:
        pid = int(_owner_record(prefix) or "")
    except ValueError:
        return None
    if pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return pid


def is_run_leftover(prefix: str) -> bool:
    """Were this prefix's namespaces made by a run that is gone, or by this process (a pid is
    recorded, and it is ours or no longer exists)? False for a cluster made to stay, which
    records no pid."""
    try:
        int(_owner_record(prefix) or "")
    except ValueError:
        return False
    return owner_pid(prefix) is None


def _cc_record_file(prefix: str) -> str:
    return os.path.join(OWNER_DIR, f"mccl-cluster-{prefix}.cc-allowed")


def _remove_cc_record(prefix: str) -> None:
    try:
        os.unlink(_cc_record_file(prefix))
    except OSError:
        pass


def _write_line(path: str, text: str) -> None:
    """Replace a small file's (or a /proc setting's) content with one line; OSError is the
    caller's to handle."""
    with open(path, "w") as f:
        f.write(f"{text}\n")


def _write_allowed_cc(value: str) -> None:
    try:
        _write_line(CC_ALLOWED, value)
    except OSError as e:
        log.warning("could not restore %s to %r: %s", CC_ALLOWED, value, e.strerror)


def restore_leftover_cc(prefix: str) -> None:
    """Put back the machine's allowed congestion controls as a killed run of this prefix
    found them (its record is left only when it never reached ``down``)."""
    before = read_proc(_cc_record_file(prefix))  # "": no record
    if before:
        log.info("restoring %s to %r, as a killed run of prefix %r found it", CC_ALLOWED,
                 before, prefix)
        _write_allowed_cc(before)
    _remove_cc_record(prefix)


def _set_owner(prefix: str, pid: int | str | None) -> None:
    """Record who owns the prefix: a pid, PERSISTENT_OWNER, or nobody (None)."""
    path = _owner_file(prefix)
    try:
        if pid is None:
            os.unlink(path)
        else:
            _write_line(path, str(pid))
    except OSError:
        pass


class Cluster:
    """N emulated hosts behind one switch; use as a context manager (up on enter, down on exit).

    Rank processes go in with :meth:`popen`/:meth:`run` (``ip netns exec``); :meth:`down` kills
    whatever is still running there and deletes every namespace of the prefix.
    """

    def __init__(self, hosts: int = DEFAULT_HOSTS, rate: str | int | None = DEFAULT_RATE, *,
                 prefix: str = DEFAULT_PREFIX, subnet: str = DEFAULT_SUBNET,
                 mtu: int = DEFAULT_MTU, ip_bin: str | None = None,
                 tc_bin: str | None = None, burst: int | None = None,
                 cc: str | None = None, steer: bool | None = None) -> None:
        if not 1 <= hosts <= MAX_HOSTS:
            raise ValueError(f"hosts must be in 1..{MAX_HOSTS}, got {hosts}")
        if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", prefix):
            raise ValueError(f"prefix must be 1-8 lowercase alphanumerics, got {prefix!r}")
        if not re.fullmatch(r"\d{1,3}\.\d{1,3}\.\d{1,3}", subnet):
            raise ValueError(f"subnet must be the first three octets, e.g. 10.77.0, got {subnet}")
        self.n_hosts = hosts
        self.rate_bps = parse_rate(rate)
        if burst is not None and not self.rate_bps:
            raise ValueError("a tbf burst needs a link rate (unshaped links have no bucket)")
        if self.rate_bps:
            tbf_params(self.rate_bps, burst)  # a bad burst fails here, before anything is made
        self.burst = burst
        if cc is not None and not re.fullmatch(r"[a-z0-9_]{1,15}", cc):
            raise ValueError(f"cc must name a TCP congestion control (e.g. cubic), got {cc!r}")
        self.cc = cc
        # None: on shaped links where the kernel has RPS; unshaped ones measure the CPU, which
        # steering costs 10-15 %
        self._steer_asked = steer
        self.steer = bool(self.rate_bps) if steer is None else steer
        self.prefix = prefix
        self.subnet = subnet
        self.mtu = mtu
        self.ip = resolve_tool("ip", ip_bin, ENV_IP)
        self.tc = resolve_tool("tc", tc_bin, ENV_TC)
        self._tools_asked = {"ip_asked": ip_bin, "tc_asked": tc_bin}
        self.iface = HOST_IFACE
        self.is_up = False
        self._made = False  # up() got past its ownership checks: down() may remove the prefix
        self.bringup_s: float | None = None
        self._procs: list[subprocess.Popen[Any]] = []
        self._allowed_before: str | None = None  # the machine's list, while cc is added to it

    # -- naming -------------------------------------------------------------------------
    @property
    def hosts(self) -> list[str]:
        """Namespace name of each host, index = host number."""
        return [f"{self.prefix}-h{i}" for i in range(self.n_hosts)]

    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    def addr(self, i: int) -> str:
        """IPv4 address of host i (inside its namespace only)."""
        self._check_index(i)
        return f"{self.subnet}.{i + 1}"

    def _check_index(self, i: int) -> None:
        if not 0 <= i < self.n_hosts:
            raise IndexError(f"host {i} out of range 0..{self.n_hosts - 1}")

    def describe(self) -> dict[str, Any]:
        """Settings for reports (JSON)."""
        out: dict[str, Any] = {"hosts": self.n_hosts, "rate": format_rate(self.rate_bps),
                               "rate_bps": self.rate_bps, "mtu": self.mtu,
                               "addrs": [f"{self.subnet}.{i + 1}" for i in range(self.n_hosts)],
                               "bringup_s": self.bringup_s, "cc": self.cc or default_cc(),
                               "mccl_cc": data_congestion_control(self.cc or default_cc()),
                               "rx_steering": self.steer}
        if self.rate_bps:
            burst, limit = tbf_params(self.rate_bps, self.burst)
            out.update(tbf_burst=burst, tbf_limit=limit, tbf=tbf_spec(self.rate_bps, self.burst),
                       tcp_payload_ceiling=tcp_payload_ceiling(self.rate_bps, self.mtu))
        return out

    def drops(self) -> dict[str, dict[str, int]]:
        """Packets dropped so far in each namespace (hosts and switch), by its qdiscs
        (``tc -s``: a full shaping queue) and by its interfaces (``ip -s``: a veth whose
        receiving side cannot keep up drops there, not in a qdisc). TCP retransmits both."""
        out: dict[str, dict[str, int]] = {"qdisc": {}, "link": {}}
        for ns in [*self.hosts, self.switch]:
            q = subprocess.run([self.tc or "tc", "-n", ns, "-s", "qdisc", "show"],
                               capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
            out["qdisc"][ns] = sum(int(d) for d in re.findall(r"dropped (\d+)", q.stdout))
            q = subprocess.run([self.ip, "-n", ns, "-s", "-j", "link", "show"],
                               capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
            try:
                links = json.loads(q.stdout or "[]")
            except ValueError:
                links = []
            out["link"][ns] = sum(link.get("stats64", {}).get(way, {}).get("dropped", 0)
                                  for link in links for way in ("rx", "tx"))
        return out

    # -- lifecycle ----------------------------------------------------------------------
    def check(self) -> None:
        """Raise ClusterUnavailable with a one-line reason if up() cannot work here."""
        check_available(self.ip, self.tc, need_tc=self.rate_bps is not None,
                        **self._tools_asked)
        if self.cc is not None and self.cc not in available_cc():
            raise ClusterUnavailable(f"congestion control {self.cc!r} is not available here "
                                     f"(available: {' '.join(available_cc()) or 'unknown'})")
        if self.steer and not os.path.exists(RPS_PROBE):
            if self._steer_asked:
                raise ClusterUnavailable("receive steering (RPS) is not available in this "
                                         f"kernel (no {RPS_PROBE})")
            log.info("no receive steering: this kernel lacks RPS (no %s)", RPS_PROBE)
            self.steer = False

    def up(self, persist: bool = False) -> Cluster:
        """Create namespaces, veths, bridge, addresses and shaping; replaces leftovers of a
        crashed run with this prefix, refuses while another live process owns it, and (unless
        persist) refuses to replace a cluster made to stay.

        persist=True (CLI `up`): recorded as PERSISTENT_OWNER, the cluster outlives this
        process and later runs leave it alone; `up` again replaces it.
        """
        self.check()
        assert self.ip is not None
        t0 = time.perf_counter()
        existing = list_namespaces(self.ip, self.prefix)
        other = owner_pid(self.prefix)
        if other is not None and existing:
            raise ClusterError(f"prefix {self.prefix!r} is in use by running pid {other}; "
                               "use another prefix or stop that run")
        if existing and not persist and not is_run_leftover(self.prefix):
            raise ClusterError(
                f"prefix {self.prefix!r} already has a cluster that no run owns "
                f"({' '.join(existing)}; `python -m mccl.cluster up` makes one); take it down "
                f"with `python -m mccl.cluster --prefix {self.prefix} down` or use another "
                "prefix")
        self._made = True
        _set_owner(self.prefix, PERSISTENT_OWNER if persist else os.getpid())
        restore_leftover_cc(self.prefix)
        gone = remove_namespaces(self.ip, self.prefix)
        if gone:
            log.info("removed %d leftover namespace(s) of prefix %r", len(gone), self.prefix)
        try:
            self._create()
        except BaseException:
            self.down()
            raise
        self.is_up = True
        self.bringup_s = time.perf_counter() - t0
        log.info("cluster up: %d hosts, rate %s, %.3fs", self.n_hosts,
                 format_rate(self.rate_bps), self.bringup_s)
        return self

    def _create(self) -> None:
        ip, sw = self.ip, self.switch
        assert ip is not None
        root = [f"netns add {sw}"] + [f"netns add {h}" for h in self.hosts]
        root += [f"link add {HOST_IFACE} netns {h} type veth peer name p{i} netns {sw}"
                 for i, h in enumerate(self.hosts)]
        _run_batches([([ip, "-batch", "-"], "\n".join(root) + "\n")], "creating namespaces")

        sw_lines = [f"link add {BRIDGE} type bridge", f"link set {BRIDGE} up", "link set lo up"]
        sw_lines += [f"link set p{i} mtu {self.mtu} master {BRIDGE} up"
                     for i in range(self.n_hosts)]
        jobs = [([ip, "-n", sw, "-batch", "-"], "\n".join(sw_lines) + "\n")]
        for i, h in enumerate(self.hosts):
            lines = ["link set lo up", f"link set {HOST_IFACE} mtu {self.mtu} up",
                     f"addr add {self.addr(i)}/{PREFIX_LEN} dev {HOST_IFACE}"]
            jobs.append(([ip, "-n", h, "-batch", "-"], "\n".join(lines) + "\n"))
        if self.rate_bps:
            assert self.tc is not None
            qd = f"root {tbf_spec(self.rate_bps, self.burst)}"
            sw_tc = [f"qdisc replace dev p{i} {qd}" for i in range(self.n_hosts)]
            jobs.append(([self.tc, "-n", sw, "-batch", "-"], "\n".join(sw_tc) + "\n"))
            for h in self.hosts:
                jobs.append(([self.tc, "-n", h, "-batch", "-"],
                             f"qdisc replace dev {HOST_IFACE} {qd}\n"))
        if self.cc is not None:  # /proc/sys/net is the writing process's namespace's
            self._allow_cc()
            jobs += [([ip, "netns", "exec", h, "sh", "-c", f"cat > {CC_PATH}"], self.cc + "\n")
                     for h in self.hosts]
        if self.steer:  # /sys is the namespace's own under `ip netns exec`
            mask = rps_mask(os.cpu_count() or 1)
            devs = [(h, [HOST_IFACE]) for h in self.hosts]
            devs.append((sw, [f"p{i}" for i in range(self.n_hosts)]))
            for ns, names in devs:
                files = " ".join(RPS_GLOB.format(dev=d) for d in names)
                jobs.append(([ip, "netns", "exec", ns, "sh", "-c",
                              f"read m; for f in {files}; do echo $m > $f || exit 1; done"],
                             mask + "\n"))
        _run_batches(jobs, "configuring links")

    def _allow_cc(self) -> None:
        """Let the hosts pick ``cc``: add it to the machine's allowed list (``down`` restores
        the list; a record of it under OWNER_DIR lets the next ``up`` of this prefix restore
        it after a run that was killed before its ``down``)."""
        allowed = read_proc(CC_ALLOWED).split()
        if self.cc in allowed:
            return
        self._allowed_before = " ".join(allowed)
        try:
            _write_line(CC_ALLOWED, " ".join([*allowed, str(self.cc)]))
        except OSError as e:
            self._allowed_before = None
            raise ClusterUnavailable(f"cannot allow congestion control {self.cc!r} in the "
                                     f"hosts: {e.strerror}") from None
        try:
            _write_line(_cc_record_file(self.prefix), self._allowed_before)
        except OSError:
            pass

    def _restore_allowed_cc(self) -> None:
        if self._allowed_before is None:
            return
        _write_allowed_cc(self._allowed_before)
        self._allowed_before = None
        _remove_cc_record(self.prefix)

    def down(self) -> None:
        """Kill our processes in the namespaces and delete all namespaces of the prefix, if
        up() made them (a refused up() leaves another run's or a user's cluster alone)."""
        for proc in self._procs:
            kill_tree(proc)
        self._procs.clear()
        self._restore_allowed_cc()
        if (self._made and self.ip is not None and sys.platform.startswith("linux")
                and os.geteuid() == 0):
            if owner_pid(self.prefix) is None:  # never tear down another live run's cluster
                remove_namespaces(self.ip, self.prefix)
                _set_owner(self.prefix, None)
            self._made = False
        self.is_up = False

    def __enter__(self) -> Cluster:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- running things inside hosts ----------------------------------------------------
    def ns_argv(self, i: int, argv: Sequence[str]) -> list[str]:
        """argv that runs `argv` inside host i's namespace."""
        self._check_index(i)
        assert self.ip is not None
        return [self.ip, "netns", "exec", self.hosts[i], *argv]

    def popen(self, i: int, argv: Sequence[str], env: Mapping[str, str] | None = None,
              **kwargs: Any) -> subprocess.Popen[Any]:
        """Start argv in host i (own session so kill_tree gets all of it); tracked for down()."""
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(self.ns_argv(i, argv), env=dict(env) if env else None, **kwargs)
        self._procs.append(proc)
        return proc

    def run(self, i: int, argv: Sequence[str], timeout: float = CMD_TIMEOUT_S,
            check: bool = True, env: Mapping[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        """Run argv in host i to completion (bounded by timeout), capturing text output."""
        proc = self.popen(i, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            raise ClusterError(f"host {i}: {' '.join(argv)} timed out after {timeout}s") from None
        finally:
            if proc in self._procs and proc.poll() is not None:
                self._procs.remove(proc)
        res = subprocess.CompletedProcess(list(argv), proc.returncode, out, err)
        if check and proc.returncode != 0:
            raise ClusterError(f"host {i}: {' '.join(argv)} exited {proc.returncode}: "
                               f"{_first_line(err)}")
        return res


#: Where ``ip netns add`` keeps a handle on each named namespace, and setns's flag for one.
NETNS_DIR = "/var/run/netns"
_CLONE_NEWNET = 0x40000000


def enter_netns(name: str) -> None:
    """Move the calling thread (and the threads it starts later) into network namespace
    ``name``, so a Python process can become one emulated host without ``ip netns exec``
    (benchmarks that spawn their ranks with multiprocessing). Linux only; needs root."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def kill_tree(proc: subprocess.Popen[Any], grace_s: float = 0.0) -> None:
    """Kill a process started with start_new_session=True together with its whole group."""
    if proc.poll() is not None:
        return
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = None
    if grace_s > 0:
        _signal_group(proc, pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(proc, pgid, signal.SIGKILL)
    try:
        proc.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        log.warning("pid %d did not die after SIGKILL", proc.pid)


def _signal_group(proc: subprocess.Popen[Any], pgid: int | None, sig: int) -> None:
    try:
        if pgid is not None and pgid == proc.pid:  # only groups we lead (start_new_session)
            os.killpg(pgid, sig)
        else:
            proc.send_signal(sig)
    except ProcessLookupError:
        pass


def status(prefix: str = DEFAULT_PREFIX, ip_bin: str | None = None,
           tc_bin: str | None = None) -> dict[str, Any]:
    """What exists now for this prefix: per-namespace address and root qdisc."""
    ip = resolve_tool("ip", ip_bin, ENV_IP)
    tc = resolve_tool("tc", tc_bin, ENV_TC)
    check_available(ip, tc, need_tc=False, ip_asked=ip_bin, tc_asked=tc_bin)
    assert ip is not None
    out: dict[str, Any] = {}
    for ns in list_namespaces(ip, prefix):
        dev = "" if ns.endswith("-sw") else HOST_IFACE
        addr = subprocess.run([ip, "-n", ns, "-4", "-o", "addr", "show", *(["dev", dev] if dev
                              else [])], capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
        addrs = re.findall(r"inet (\S+)", addr.stdout)
        qdiscs = ""
        if tc:
            q = subprocess.run([tc, "-n", ns, "qdisc", "show", *(["dev", dev] if dev else [])],
                               capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
            qdiscs = "; ".join(ln.strip() for ln in q.stdout.splitlines() if "tbf" in ln)
        out[ns] = {"addrs": [a for a in addrs if not a.startswith("127.")], "tbf": qdiscs}
    return out


def resolve_host(spec: str, prefix: str = DEFAULT_PREFIX) -> str:
    """'2', 'h2' or '<prefix>-h2' -> namespace name; 'sw' -> switch."""
    s = spec.strip()
    if s in ("sw", f"{prefix}-sw"):
        return f"{prefix}-sw"
    m = re.fullmatch(rf"(?:{re.escape(prefix)}-)?h?(\d+)", s)
    if not m:
        raise ValueError(f"bad host {spec!r}: use an index (0), h0 or {prefix}-h0")
    return f"{prefix}-h{int(m.group(1))}"


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mccl.cluster",
                                description="Emulated multi-host cluster (Linux netns + tbf).")
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help="namespace name prefix")
    p.add_argument("--ip", default=None, help=f"ip binary (default ${ENV_IP} or PATH)")
    p.add_argument("--tc", default=None, help=f"tc binary (default ${ENV_TC} or PATH)")
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="create (or recreate) the cluster")
    up.add_argument("--hosts", type=int, default=DEFAULT_HOSTS)
    up.add_argument("--rate", default=DEFAULT_RATE, help="per-link rate, e.g. 1gbit or none")
    up.add_argument("--subnet", default=DEFAULT_SUBNET, help="first three octets of the /24")
    up.add_argument("--mtu", type=int, default=DEFAULT_MTU)
    up.add_argument("--burst", type=parse_size, default=None,
                    help="tbf bucket in bytes, e.g. 128K (default: 1 ms at the rate, >= 128K)")
    add_rx_steering(up)
    sub.add_parser("down", help="delete every namespace of the prefix")
    sub.add_parser("status", help="show namespaces, addresses and shaping")
    ex = sub.add_parser("exec", help="run a command inside a host: exec 0 -- cmd args")
    ex.add_argument("host", help="0, h0 or <prefix>-h0")
    ex.add_argument("argv", nargs=argparse.REMAINDER, help="-- command...")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the process exit status."""
    interrupt_on_sigterm()  # `timeout` or `kill` mid bring-up: removed like after Ctrl-C
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    args = _build_parser().parse_args(argv)
    try:
        if args.cmd == "up":
            cl = Cluster(args.hosts, args.rate, prefix=args.prefix, subnet=args.subnet,
                         mtu=args.mtu, ip_bin=args.ip, tc_bin=args.tc, burst=args.burst,
                         steer=steering(args.rx_steering))
            cl.up(persist=True)
            d = cl.describe()
            print(f"up: {plural(cl.n_hosts, 'host')} behind {cl.switch}, rate {d['rate']}, "
                  f"{d['bringup_s']:.3f}s")
            for name, addr in zip(cl.hosts, d["addrs"], strict=True):
                print(f"  {name}  {addr}/{PREFIX_LEN}  dev {HOST_IFACE}")
            return 0
        ip = resolve_tool("ip", args.ip, ENV_IP)
        if args.cmd == "down":
            check_available(ip, None, need_tc=False, ip_asked=args.ip)
            assert ip is not None
            other = owner_pid(args.prefix)
            if other is not None:
                print(f"warning: pid {other} was using prefix {args.prefix!r}; removing anyway",
                      file=sys.stderr)
            gone = remove_namespaces(ip, args.prefix)
            _set_owner(args.prefix, None)
            restore_leftover_cc(args.prefix)
            print(f"down: removed {len(gone)} namespace(s)" + (f": {' '.join(gone)}" if gone
                                                                 else ""))
            return 0
        if args.cmd == "status":
            st = status(args.prefix, args.ip, args.tc)
            if not st:
                print(f"no cluster with prefix {args.prefix!r}")
            for ns, info in st.items():
                print(f"{ns:12s} {' '.join(info['addrs']) or '-':18s} {info['tbf'] or '-'}")
            return 0
        # exec
        check_available(ip, None, need_tc=False, ip_asked=args.ip)
        assert ip is not None
        cmd = list(args.argv)
        if cmd[:1] == ["--"]:
            cmd = cmd[1:]
        if not cmd:
            print("exec: no command given (exec HOST -- cmd ...)", file=sys.stderr)
            return 2
        ns = resolve_host(args.host, args.prefix)
        if ns not in list_namespaces(ip, args.prefix):
            print(f"exec: no namespace {ns} (is the cluster up?)", file=sys.stderr)
            return 2
        os.execv(ip, [ip, "netns", "exec", ns, *cmd])
    except ClusterUnavailable as exc:
        print(f"cluster unavailable: {exc}", file=sys.stderr)
        return 3
    except (ClusterError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
