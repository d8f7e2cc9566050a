"""Does a ring of plain TCP streams fill the emulated links as one stream does?

    python benchmarks/ring_ceiling.py --hosts 4 --rate 1gbit --rounds 2 --json OUT

Every host streams to the next one at once (the traffic pattern of a ring all-reduce: each
link carries one flow's data one way and another flow's ACKs the other way), with the same
sender and receiver processes as the single-stream ceiling (``mccl.bench.ceiling``), and the
rates are compared with that ceiling measured in the same run. A diagnostic for reading the
bench's "% of ceiling": if the ring pattern itself fell short of the single stream, no
backend could reach 100 % of it. Linux, root (network namespaces).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mccl.bench.ceiling import _role_argv, measure_ceiling  # noqa: E402
from mccl.bench.cluster import Cluster, kill_tree  # noqa: E402
from mccl.bench.report import parse_size  # noqa: E402

WARMUP_S = 1.0
SLACK_S = 30.0


def ring_streams(c: Cluster, hosts: int, seconds: float) -> list[dict]:
    """Host i streams to host i+1, all at once; each receiver's result, by sender."""
    recvs: list[subprocess.Popen] = []
    sends: list[subprocess.Popen] = []
    try:
        ports = []
        for i in range(hosts):
            dst = (i + 1) % hosts
            r = c.popen(dst, _role_argv("--role", "recv", "--bind", c.addr(dst), "--warmup",
                                        str(WARMUP_S)),
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            recvs.append(r)
            assert r.stdout is not None
            ports.append(r.stdout.readline().split()[1])  # bounded: the receiver times out
        for i in range(hosts):
            dst = (i + 1) % hosts
            sends.append(c.popen(i, _role_argv("--role", "send", "--host", c.addr(dst),
                                               "--port", ports[i], "--seconds",
                                               str(seconds + WARMUP_S)),
                                 stderr=subprocess.PIPE, text=True))
        out = [json.loads(r.communicate(timeout=seconds + SLACK_S)[0].strip().splitlines()[-1])
               for r in recvs]
        for s in sends:
            s.wait(timeout=SLACK_S)
        return out
    finally:
        for p in recvs + sends:
            kill_tree(p)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--burst", type=parse_size, default=None,
                    help="tbf bucket in bytes (default: the cluster's)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rounds = []
    with Cluster(args.hosts, args.rate, burst=args.burst) as c:
        for r in range(args.rounds):
            single = measure_ceiling(c, seconds=args.seconds)
            ring = ring_streams(c, args.hosts, args.seconds)
            ratio = sum(x["bytes_per_s"] for x in ring) / len(ring) / single["bytes_per_s"]
            rounds.append({"single": single, "ring": ring, "ring_over_single": ratio})
            rates = " ".join(f"{x['bytes_per_s'] / 1e9:.4f}" for x in ring)
            print(f"round {r}: single stream {single['bytes_per_s'] / 1e9:.4f} GB/s, ring "
                  f"streams {rates} GB/s, ring / single {ratio:.4f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"hosts": args.hosts, "rate": args.rate,
                                         "burst": args.burst, "seconds": args.seconds,
                                         "rounds": rounds}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
