"""``python -m mccl doctor``: what this machine offers mccl, then a local end-to-end self-test.

Why: a Mac user's one command to know whether mccl will work here before a multi-host job:
which torch and devices, whether the MPS shared-memory alias exists (unified hand-off) or
staging copies are used, which interfaces and addresses peers could reach, the socket buffer
limits, and two local processes all-reducing on the best device through both hand-off paths
with the results checked. Exit status 0 only when every check passed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import queue
import socket
import subprocess
import sys
import time
import traceback
from datetime import timedelta
from typing import Any

import torch

from . import __version__, config
from .bench.cli import CliError, check_device, local_ranks, report
from .bench.report import prepare_output
from .bench.spawn import free_port
from .device.mps import ALIAS_API, alias_api
from .transport import fdlimit
from .transport.address import choose_address, interface_names, ipv4_address, route_address
from .transport.ifaddrs import ipv6_addresses

SELFTEST_TIMEOUT_S = 180.0
RING_ELEMS = 4 << 20  # 16 MB float32: the ring path, big enough to see a bandwidth


# ---- capabilities ----

def best_device() -> str:
    """mps on a Mac with MPS, else cuda, else cpu."""
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def _interfaces() -> list[dict[str, Any]]:
    return [{"name": name, "ipv4": ipv4_address(name), "ipv6": ipv6_addresses(name)}
            for name in interface_names()]


def _sysctl(names: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for n in names:
        try:
            r = subprocess.run(["sysctl", "-n", n], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.SubprocessError):
            continue
        if r.returncode == 0:
            out[n] = r.stdout.strip()
    return out


def socket_limits() -> dict[str, Any]:
    """Kernel socket buffer limits (they cap what one TCP stream can keep in flight)."""
    from .transport.tcp import (
        SOCKET_BUFFER_BYTES,
        _buffer_cap_allows,
        probe_data_congestion_control,
    )

    limits: dict[str, Any] = {}
    if sys.platform.startswith("linux"):
        for key in ("net/core/rmem_max", "net/core/wmem_max", "net/ipv4/tcp_rmem",
                    "net/ipv4/tcp_wmem", "net/ipv4/tcp_congestion_control"):
            try:
                with open(f"/proc/sys/{key}") as f:
                    limits[key.replace("/", ".")] = " ".join(f.read().split())
            except OSError:
                pass
        if cc := probe_data_congestion_control():  # BBR is left where the kernel allows
            limits["mccl_data_congestion_control"] = cc
    elif sys.platform == "darwin":
        limits.update(_sysctl(["kern.ipc.maxsockbuf", "net.inet.tcp.sendspace",
                               "net.inet.tcp.recvspace", "net.inet.tcp.autorcvbufmax",
                               "net.inet.tcp.autosndbufmax", "net.inet.tcp.cc.algorithm"]))
    limits["mccl_requested_bytes"] = SOCKET_BUFFER_BYTES
    limits["mccl_sets_buffers"] = _buffer_cap_allows(SOCKET_BUFFER_BYTES)
    return limits


def capabilities() -> dict[str, Any]:
    """What this machine offers mccl; ``env_error`` names a bad mccl environment variable
    (every process group would refuse to start with it)."""
    master = os.environ.get("MASTER_ADDR")
    try:
        cfg: config.Config | None = config.load()
        env_error = None
    except ValueError as exc:
        cfg, env_error = None, str(exc)
    address = None
    if cfg is not None:
        try:  # the address every group would listen on
            address = choose_address(cfg.socket_ifname, master)
        except ValueError as exc:  # MCCL_SOCKET_IFNAME names no interface with IPv4 here
            env_error = str(exc)
    mps_built = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_built())
    mps_avail = bool(mps_built and torch.backends.mps.is_available())
    has_alias = alias_api() is not None
    if not has_alias:
        handoff = f"staging (torch {torch.__version__} has no torch.mps.{ALIAS_API}; >= 2.13)"
    elif cfg is None:
        handoff = "unknown (bad mccl environment)"
    elif not cfg.unified:
        handoff = f"staging ({config.UNIFIED_ENV}=0)"
    else:
        handoff = "unified (in place in shared memory)"
    if not mps_avail:  # what a Mac with this torch and these settings would use
        handoff = f"none here (no MPS device); on a Mac it would be {handoff}"
    cuda = []
    if torch.cuda.is_available():
        cuda = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    if address is None:
        address = route_address(master)
    return {
        "mccl": __version__,
        "python": sys.version.split()[0],
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "torch": torch.__version__,
        "numpy": __import__("numpy").__version__,
        "devices": {"cpu": True, "cuda": cuda, "mps_built": mps_built, "mps": mps_avail},
        "best_device": best_device(),
        "mps_alias_api": has_alias,
        "mps_handoff": handoff,
        "cuda_handoff": "staging via pinned host buffers on a side stream" if cuda else None,
        "env": {k: os.environ.get(k) for k in config.ENV_DOCS},
        "env_error": env_error,
        "hostname": socket.gethostname(),
        "address_to_master" if master else "default_address": address,
        "interfaces": _interfaces(),
        "socket_limits": socket_limits(),
        "open_files": fdlimit.summary(),
    }


# ---- self-test ----

def _check(name: str, ok: bool, failures: list[str]) -> None:
    if not ok:
        failures.append(name)


def _selftest_rank(rank: int, world: int, port: int, device: str, unified: bool | None,
                   q) -> None:
    """One rank of the self-test (a spawned process); ``unified`` None: as configured."""
    if unified is not None:
        os.environ[config.UNIFIED_ENV] = "1" if unified else "0"
    try:
        import torch.distributed as dist

        import mccl  # noqa: F401

        torch.set_num_threads(1)
        if device == "cuda":
            dev = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(dev)
        else:
            dev = torch.device(device)
        dist.init_process_group("mccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=60))

        def sync() -> None:
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            elif dev.type == "mps":
                torch.mps.synchronize()

        fails: list[str] = []
        total = world * (world + 1) / 2
        small = torch.full((1000,), float(rank + 1), device=dev)
        dist.all_reduce(small)
        _check("all_reduce small float32", bool((small == total).all().item()), fails)
        big = torch.full((RING_ELEMS,), float(rank + 1), device=dev)
        dist.all_reduce(big)
        _check("all_reduce 16 MB float32 (ring)", bool((big == total).all().item()), fails)
        half = torch.full((300_000,), 0.5 * (rank + 1), dtype=torch.bfloat16, device=dev)
        dist.all_reduce(half)
        _check("all_reduce bfloat16", bool((half.float() == 0.5 * total).all().item()), fails)
        out = torch.empty(world * 1000, device=dev)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(out, torch.full((1000,), float(rank), device=dev))
        want = torch.arange(world, device=dev).float().repeat_interleave(1000)
        _check("all_gather_into_tensor", bool(torch.equal(out, want)), fails)
        b = torch.full((100_000,), float(rank), device=dev)
        dist.broadcast(b, src=world - 1)
        _check("broadcast", bool((b == world - 1).all().item()), fails)
        # async + wait, the way DDP-style overlap uses it
        works = [dist.all_reduce(torch.ones(50_000, device=dev), async_op=True)
                 for _ in range(4)]
        for w in works:
            w.wait()
        times = []
        for _ in range(5):
            sync()
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(big)
            sync()
            times.append(time.perf_counter() - t0)
        pg = dist.group.WORLD
        adapter = getattr(pg, "_adapters", {}).get(str(dev) if dev.type != "cpu" else "cpu")
        path = type(adapter).__name__ if adapter is not None else "?"
        if adapter is not None and hasattr(adapter, "unified"):
            path += " unified" if adapter.unified else " staging"
        dist.destroy_process_group()
        q.put((rank, {"failures": fails, "path": path, "best_s": min(times)}))
    except BaseException:  # noqa: BLE001 - the parent reports it
        q.put((rank, {"failures": ["exception"], "error": traceback.format_exc()}))


def selftest(device: str, unified: bool | None, world: int = 2,
             timeout: float = SELFTEST_TIMEOUT_S) -> dict[str, Any]:
    """Run the self-test on ``world`` local processes; returns a result dict with ``ok``.
    ``unified``: force the MPS hand-off path (None: as configured; only MPS tensors use it)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_selftest_rank, args=(r, world, port, device, unified, q),
                         daemon=True) for r in range(world)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    results: dict[int, dict[str, Any]] = {}
    deadline = t0 + timeout
    while len(results) < world and time.monotonic() < deadline:
        try:
            rank, res = q.get(timeout=1.0)
            results[rank] = res
        except queue.Empty:
            if all(not p.is_alive() for p in procs) and q.empty():
                break
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
    missing = sorted(set(range(world)) - set(results))
    failures = sorted({f for r in results.values() for f in r["failures"]})
    errors = [r["error"] for r in results.values() if "error" in r]
    if missing:
        failures.append(f"ranks {missing} did not finish within {timeout:.0f}s")
    best = max((r.get("best_s", 0.0) for r in results.values()), default=0.0)
    nbytes = RING_ELEMS * 4
    busbw = 2 * (world - 1) / world * nbytes / best / 1e9 if best > 0 else None
    return {"device": device, "unified_env": unified, "ok": not failures,
            "failures": failures, "errors": errors,
            "path": sorted({r.get("path", "?") for r in results.values()}),
            "all_reduce_16MB_s": best or None, "busbw_GBps": busbw,
            "wall_s": time.monotonic() - t0}


# ---- CLI ----

def _print_caps(caps: dict[str, Any]) -> None:
    d = caps["devices"]
    print(f"mccl {caps['mccl']}  python {caps['python']}  torch {caps['torch']}  "
          f"numpy {caps['numpy']}  ({caps['platform']})")
    mps = "available" if d["mps"] else ("built, not available" if d["mps_built"] else "no")
    print(f"devices: cpu, cuda: {', '.join(d['cuda']) or 'none'}, mps: {mps}"
          f"  -> self-test on {caps['best_device']}")
    print(f"MPS alias API torch.mps.{ALIAS_API}: {'present' if caps['mps_alias_api'] else 'absent'}"
          f"; MPS hand-off: {caps['mps_handoff']}")
    if caps["cuda_handoff"]:
        print(f"CUDA hand-off: {caps['cuda_handoff']}")
    env = ", ".join(f"{k}={v}" for k, v in caps["env"].items() if v is not None) or "none set"
    print(f"mccl env: {env}")
    if caps["env_error"]:
        print(f"FAILED: bad mccl environment: {caps['env_error']}")
    addr_key = "address_to_master" if "address_to_master" in caps else "default_address"
    print(f"host {caps['hostname']}, {addr_key.replace('_', ' ')}: {caps[addr_key]}")
    print("interfaces: " + ", ".join(
        f"{i['name']}={'/'.join(([i['ipv4']] if i['ipv4'] else []) + i['ipv6']) or '-'}"
        for i in caps["interfaces"]))
    lim = caps["socket_limits"]
    print("socket buffers: " + ", ".join(f"{k}={v}" for k, v in lim.items()))
    files = caps["open_files"]
    if files["soft"] is not None:
        largest = files["largest_group"]
        print(f"open files: {files['open']} open, limit {files['soft']} (hard {files['hard']}); "
              + (f"a group of up to {largest} ranks fits (mccl raises the soft limit as needed)"
                 if largest is not None else "no limit"))


def selftest_variants(device: str) -> list[tuple[bool | None, str]]:
    """(unified setting, label) of each self-test run: both MPS hand-off paths on MPS; one
    run elsewhere, labelled by what it moves (the hand-off setting only applies to MPS)."""
    if torch.device(device).type == "mps":
        return [(True, "mps tensors, unified hand-off"),
                (False, f"mps tensors, staging hand-off ({config.UNIFIED_ENV}=0)")]
    return [(None, f"{device} tensors (the MPS hand-off paths need an MPS device)")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mccl doctor",
                                description="Capabilities of this machine and a local self-test.")
    p.add_argument("--device", default=None, help="self-test device (default: best available)")
    p.add_argument("--world", type=local_ranks(2), default=2,
                   help="local processes in the self-test (at least 2: it tests the network)")
    p.add_argument("--no-selftest", action="store_true", help="only print capabilities")
    p.add_argument("--json", default=None, metavar="PATH", help="also write everything as JSON")
    args = p.parse_args(argv)
    try:
        if args.json is not None:
            prepare_output(args.json, "--json")
        if args.device is not None:
            check_device(args.device)
    except ValueError as exc:
        return report(CliError(f"error: {exc}"))
    except CliError as exc:
        return report(exc)
    caps = capabilities()
    _print_caps(caps)
    doc: dict[str, Any] = {"capabilities": caps, "selftest": []}
    ok = caps["env_error"] is None
    if ok and not args.no_selftest:  # with a bad environment every rank would fail the same
        device = args.device or caps["best_device"]
        for unified, label in selftest_variants(device):
            print(f"self-test: {args.world} processes, {label} ... ", end="", flush=True)
            res = selftest(device, unified, args.world)
            doc["selftest"].append(res)
            ok &= res["ok"]
            if res["ok"]:
                bw = f", busbw {res['busbw_GBps']:.2f} GB/s" if res["busbw_GBps"] else ""
                print(f"ok ({'/'.join(res['path'])}{bw}, {res['wall_s']:.1f} s)")
            else:
                print("FAILED: " + "; ".join(res["failures"]))
                for e in res["errors"][:1]:
                    print(e.rstrip())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=str)
    print("doctor: all checks passed" if ok else "doctor: some checks FAILED")
    return 0 if ok else 1
