"""Tests of the measuring instrument (mccl.bench): CLI + JSON, deadlines, cluster, model.

No timing thresholds: only structure, correctness flags and clean-up are asserted. Every
multi-process test has a pytest timeout and subprocess timeouts.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mccl.bench import cluster as cl
from mccl.bench.model import fit_alpha_beta, mccl_steps, mccl_time, report, ring_time
from mccl.bench.ops import bus_factor, canonical_op, element_count
from mccl.bench.report import format_size, parse_size, size_range
from tests.hosts import cluster_or_skip, emulated_hosts, worker_prefix

REPO = Path(__file__).resolve().parents[1]
TEST_PREFIX = worker_prefix("mccltest")  # never touches a user's "mccl" cluster
BENCH_TIMEOUT_S = 150


def _backends() -> list[str]:
    from mccl.bench.runner import available_backends

    return available_backends()


# -- pure helpers ---------------------------------------------------------------------------
def test_sizes_rates_and_factors() -> None:
    assert [parse_size(s) for s in ("8", "8B", "1K", "64M", "1G", "1.5K")] == [
        8, 8, 1024, 64 << 20, 1 << 30, 1536]
    assert size_range(1024, 8192) == [1024, 2048, 4096, 8192]
    assert size_range(8, 1 << 20, 16) == [8, 128, 2048, 32768, 524288]
    assert format_size(64 << 20) == "64M" and format_size(8) == "8B"
    with pytest.raises(ValueError):
        parse_size("12 parsecs")
    assert cl.parse_rate("1gbit") == 10**9 and cl.parse_rate("100mbit") == 10**8
    assert cl.parse_rate("none") is None and cl.parse_rate(None) is None
    with pytest.raises(ValueError):
        cl.parse_rate("1GB/s")
    burst, limit = cl.tbf_params(10**9)
    assert burst >= 64 * 1024 and limit >= 2 * burst
    burst, limit = cl.tbf_params(10**10, 256 << 10)  # a chosen bucket
    assert burst == 256 << 10 and limit >= 4 * burst
    assert bus_factor("all_reduce", 4) == 1.5 and bus_factor("broadcast", 8) == 1.0
    assert bus_factor("all_gather", 4) == bus_factor("all_to_all", 4) == 0.75
    assert element_count("all_gather", 8, 4, 4) == 4  # at least one element per rank
    assert element_count("all_reduce", 1 << 20, 4, 4) == 1 << 18
    assert canonical_op("all_gather_into_tensor") == "all_gather"
    assert canonical_op("alltoall") == "all_to_all"


def test_cluster_burst_is_checked_and_reported(tmp_path: Path) -> None:
    """A tbf bucket too small for one GSO packet is refused before anything is made (by the
    library and by the bench's CLI); a chosen one is what the cluster reports and uses."""
    with pytest.raises(ValueError, match="burst"):
        cl.tbf_params(10**9, 1000)
    with pytest.raises(ValueError, match="burst"):
        cl.Cluster(2, "1gbit", prefix=TEST_PREFIX, burst=1000)
    d = cl.Cluster(2, "10gbit", prefix=TEST_PREFIX, burst=256 << 10).describe()
    assert d["tbf_burst"] == 256 << 10 and f"burst {256 << 10} " in d["tbf"]
    with pytest.raises(ValueError, match="rate"):  # unshaped links have no bucket
        cl.Cluster(2, None, prefix=TEST_PREFIX, burst=256 << 10)
    res = subprocess.run([sys.executable, "-m", "mccl.bench", "--cluster", "--burst", "1K",
                          "--world-sizes", "2", "--sizes", "8", "--json",
                          str(tmp_path / "x.json")],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert res.returncode == 2 and "burst" in res.stderr, res.stderr
    assert not (tmp_path / "x.json").exists()


def test_timeline_finds_a_process_sockets_by_peer_address() -> None:
    """timeline.py reaches gloo's sockets through /proc: the busiest connection per peer."""
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("no /proc/self/fd on this OS")
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import timeline
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    import socket

    with socket.create_server(("127.0.0.1", 0)) as srv:
        quiet = socket.create_connection(srv.getsockname())
        busy = socket.create_connection(srv.getsockname())
        a, _ = srv.accept()
        b, _ = srv.accept()
        try:
            busy.sendall(b"x" * 100_000)
            found = timeline.peer_sockets(["192.0.2.1", "127.0.0.1"])
            assert list(found) == [1]
            info = timeline.tcp_info(found[1])
            assert info["bytes_sent"] + info["bytes_received"] >= 100_000
            for s in found.values():
                s.close()
        finally:
            for s in (quiet, busy, a, b):
                s.close()


def test_cluster_unavailable_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cl.os, "geteuid", lambda: 1000)
    with pytest.raises(cl.ClusterUnavailable, match="root") as exc:
        cl.Cluster(2, "1gbit", prefix=TEST_PREFIX).check()
    assert "\n" not in str(exc.value)
    monkeypatch.setattr(cl.sys, "platform", "darwin")
    with pytest.raises(cl.ClusterUnavailable, match="Linux") as exc:
        cl.Cluster(2, "1gbit", prefix=TEST_PREFIX).check()
    assert "\n" not in str(exc.value)
    monkeypatch.setattr(cl.sys, "platform", "linux")
    monkeypatch.setattr(cl.os, "geteuid", lambda: 0)
    monkeypatch.setenv(cl.ENV_IP, "/nonexistent/ip")
    with pytest.raises(cl.ClusterUnavailable, match="MCCL_IP"):
        cl.Cluster(2, "1gbit", prefix=TEST_PREFIX).check()


# -- benchmark CLI end to end ---------------------------------------------------------------
@pytest.mark.timeout(BENCH_TIMEOUT_S + 30)
def test_bench_cli_writes_wellformed_json(tmp_path: Path) -> None:
    backends = _backends()
    assert "gloo" in backends
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    argv = [sys.executable, "-m", "mccl.bench", "--backends", ",".join(backends),
            "--world-sizes", "2", "--sizes", "8,1K,64K", "--ops", "all_reduce,all_gather",
            "--iters", "3", "--warmup", "1", "--ceiling-seconds", "0.5", "--check", "-q",
            "--json", str(out), "--png", str(png)]
    res = subprocess.run(argv, cwd=REPO, capture_output=True, text=True,
                         timeout=BENCH_TIMEOUT_S)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["schema"] == "mccl-bench/1"
    assert "mccl.bench" in doc["command"] and doc["argv"][:1] == ["--backends"]
    for key in ("hostname", "platform", "python", "torch", "cpu_count"):
        assert key in doc["machine"]
    assert doc["network"]["mode"] == "loopback"
    assert doc["ceiling"]["bytes_per_s"] > 0 and doc["errors"] == []
    assert len(doc["rows"]) == len(backends) * 2 * 3
    for row in doc["rows"]:
        for key in ("backend", "op", "size", "count", "dtype", "world_size", "time_us",
                    "algbw_gbs", "busbw_gbs", "pct_ceiling", "iters"):
            assert key in row, key
        assert row["check"] is True, row
        assert row["time_us"] > 0 and row["iters"] >= 1
        assert math.isclose(row["busbw_gbs"],
                            row["algbw_gbs"] * bus_factor(row["op"], row["world_size"]))
        # the ranks' CPU per op (every thread): spent, and no more cores than the machine has
        assert row["cpu_us"] > 0 and 0 < row["cpu_cores"] <= doc["machine"]["cpu_count"]
    assert {r["backend"] for r in doc["rows"]} == set(backends)
    assert png.stat().st_size > 0
    assert "busbw" in res.stdout and "all_gather" in res.stdout
    # an 8-byte op lasts far less than the default sample: back-to-back runs of it
    assert all(r["reps"] > 1 for r in doc["rows"] if r["size"] == 8)
    assert doc["config"]["min_sample_s"] == 0.05


def _small_bench(out: Path, *args: str,
                 env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """``python -m mccl.bench`` on 2 local ranks, 3 short iterations; (process, JSON)."""
    argv = [sys.executable, "-m", "mccl.bench", "--world-sizes", "2", "--iters", "3",
            "--warmup", "1", "--ceiling-seconds", "0.5", *args, "--json", str(out)]
    res = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=BENCH_TIMEOUT_S)
    assert res.returncode == 0, res.stderr[-3000:]
    return res, json.loads(out.read_text())


def test_table_flags_cells_whose_samples_stalled() -> None:
    """A cell whose slowest sample took over STALL_SPREAD x its fastest is marked '~'; a
    steady one, or one without sample times (older JSON), is not."""
    from mccl.bench import report

    def row(backend: str, lo: float, hi: float | None) -> dict:
        r = {"op": "reduce_scatter", "world_size": 8, "dtype": "float32", "size": 4 << 20,
             "count": 1 << 20, "backend": backend, "time_us": 5145.7, "algbw_gbs": 0.8,
             "busbw_gbs": 0.7}
        if hi is not None:
            r |= {"min_us": lo, "max_us": hi}
        return r

    text = report.format_table([row("mccl", 3031.4, 13829.9), row("gloo", 8700.0, 8900.0)],
                               1.196e9, ["mccl", "gloo"])
    line = next(x for x in text.splitlines() if x.strip().startswith("4M"))
    mccl_cell, gloo_cell = line.split("|")[1:3]
    assert mccl_cell.rstrip().endswith("~") and not gloo_cell.rstrip().endswith("~")
    assert "'~' = slowest sample over 2x the fastest" in text
    assert not report.stalled(row("mccl", 1.0, None))
    assert not report.stalled(row("mccl", 100.0, 200.0))  # exactly 2x: not flagged
    assert report.stalled(row("mccl", 100.0, 200.1))


def test_bench_min_sample_sets_the_ops_per_sample(tmp_path: Path) -> None:
    """--min-sample reaches the ranks: 0 times every op alone (after its barrier)."""
    _, doc = _small_bench(tmp_path / "r.json", "--backends", "mccl", "--sizes", "8", "--ops",
                          "all_reduce", "--min-sample", "0", "-q")
    assert doc["config"]["min_sample_s"] == 0
    assert [r["reps"] for r in doc["rows"]] == [1]


def test_bench_queue_issues_async_ops_and_reports_per_op(tmp_path: Path) -> None:
    """--queue N: N async ops per timed call on N buffer sets, results still checked, times
    per op; the table says so; 0 is refused in one line."""
    res, doc = _small_bench(tmp_path / "q.json", "--backends", "mccl,gloo", "--sizes", "64K",
                            "--ops", "all_reduce,sendrecv", "--queue", "3", "--check")
    assert doc["config"]["queue"] == 3
    assert len(doc["rows"]) == 4 and all(r["queue"] == 3 for r in doc["rows"])
    assert all(r["check"] is True for r in doc["rows"])
    assert "queue=3 (times per op)" in res.stdout
    bad = subprocess.run([sys.executable, "-m", "mccl.bench", "--queue", "0"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--queue must be at least 1" in bad.stderr


@pytest.mark.timeout(120)
def test_hung_and_crashed_ranks_are_killed_and_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from mccl.bench.runner import BenchConfig, run_job
    from mccl.bench.worker import FAULT_ENV

    cfg = BenchConfig(ops=["all_reduce", "all_gather", "broadcast"], sizes=[1024],
                      iters=2, warmup=0, time_budget=0, stall_timeout=5.0)
    monkeypatch.setenv(FAULT_ENV, "hang:all_gather,crash:broadcast")
    job = run_job("gloo", 2, cfg)  # launch 1: row, hang -> killed; launch 2: crash
    assert [r["op"] for r in job.rows] == ["all_reduce"]
    assert [e["op"] for e in job.errors] == ["all_gather", "broadcast"]
    assert "timed out" in job.errors[0]["error"]
    assert "exited with code" in job.errors[1]["error"]


def test_a_rank_that_dies_as_an_op_begins_is_blamed_on_that_op(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0's line naming the op can arrive after another rank's death was seen (on a slow
    machine it did): the runner reads it before giving up, so the error names the op and
    size instead of "startup", and that size is not listed a second time as skipped."""
    from mccl.bench import runner
    from mccl.bench.worker import EVENT_PREFIX

    rank0 = textwrap.dedent(f"""
        import json, time
        print({EVENT_PREFIX!r} + json.dumps({{"event": "init"}}), flush=True)
        time.sleep(0.1)  # the other rank is already dead: within the runner's grace
        print({EVENT_PREFIX!r} + json.dumps({{"event": "start", "op": "broadcast",
                                              "size": 1024}}), flush=True)
        time.sleep(60)
        """)

    class RankOneDied:
        def __init__(self, *args: object) -> None:
            self.procs = [subprocess.Popen([sys.executable, "-c", rank0],
                                           stdout=subprocess.PIPE)]

        def kill(self) -> None:
            for proc in self.procs:
                proc.kill()
                proc.wait()
                if proc.stdout:
                    proc.stdout.close()

        def crashed(self) -> str:
            return "rank 1 exited with code 3"

        def logs_tail(self) -> str:
            return ""

    monkeypatch.setattr(runner, "_Ranks", RankOneDied)
    # a grace far longer than rank 0's 0.1 s, so a loaded machine cannot make the line late
    monkeypatch.setattr(runner, "CRASH_GRACE_S", 2.0)
    cfg = runner.BenchConfig(ops=["broadcast"], sizes=[1024], iters=1, warmup=0, time_budget=0)
    job = runner.run_job("gloo", 2, cfg)
    assert [(e["op"], e["size"]) for e in job.errors] == [("broadcast", 1024)]
    assert "(broadcast size 1024)" in job.errors[0]["error"]
    assert "rank 1 exited" in job.errors[0]["error"]


# -- emulated cluster ---------------------------------------------------------------------
@pytest.fixture
def cluster2():
    with emulated_hosts(2, "1gbit", TEST_PREFIX) as c:
        yield c


_SERVER = textwrap.dedent("""
    import socket, sys
    s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1); s.settimeout(20)
    print(s.getsockname()[1], flush=True)
    c, _ = s.accept(); c.settimeout(20); c.sendall(c.recv(64).upper()); c.close()
""")
_CLIENT = textwrap.dedent("""
    import socket, sys
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20)
    c.sendall(b"ping"); print(c.recv(64).decode())
""")


@pytest.mark.timeout(60)
def test_cluster_up_connect_down(cluster2: cl.Cluster) -> None:
    c = cluster2
    assert c.hosts == [f"{TEST_PREFIX}-h0", f"{TEST_PREFIX}-h1"]
    assert set(cl.list_namespaces(c.ip, TEST_PREFIX)) == {*c.hosts, c.switch}
    st = cl.status(TEST_PREFIX)
    assert st[c.hosts[1]]["addrs"] == [f"{c.addr(1)}/24"] and "tbf" in st[c.hosts[1]]["tbf"]
    assert "tbf" in st[c.switch]["tbf"]
    server = c.popen(1, [sys.executable, "-c", _SERVER, c.addr(1)], stdout=subprocess.PIPE,
                     text=True)
    try:
        port = server.stdout.readline().strip()
        res = c.run(0, [sys.executable, "-c", _CLIENT, c.addr(1), port], timeout=30)
        assert res.stdout.strip() == "PING"
        assert server.wait(timeout=30) == 0
    finally:
        cl.kill_tree(server)
    # the host namespace cannot see the root namespace's interfaces
    res = c.run(0, [c.ip, "-o", "link"], timeout=10)
    assert "eth0" in res.stdout and "ifb0" not in res.stdout


@pytest.mark.timeout(60)
def test_cluster_removes_leftovers_of_a_crashed_run() -> None:
    first = cluster_or_skip(2, None, TEST_PREFIX)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        first.up()  # "crash": never call first.down()
        sleeper = first.popen(0, [sys.executable, "-c", "import time; time.sleep(60)"])
        cl._set_owner(TEST_PREFIX, other.pid)  # pretend another live run owns the prefix
        with pytest.raises(cl.ClusterError, match="in use"):
            cl.Cluster(3, "10gbit", prefix=TEST_PREFIX).up()
        assert sleeper.poll() is None
        other.kill()
        other.wait(timeout=10)  # owner gone: what is left counts as a crashed run
        second = cl.Cluster(3, "10gbit", prefix=TEST_PREFIX).up()
        assert sleeper.wait(timeout=10) != 0  # leftover rank killed
        assert len(cl.list_namespaces(second.ip, TEST_PREFIX)) == 4
        second.down()
    finally:
        other.kill()
        other.wait(timeout=10)
        cl.remove_namespaces(first.ip, TEST_PREFIX)
        cl._set_owner(TEST_PREFIX, None)
    assert cl.list_namespaces(first.ip, TEST_PREFIX) == []


@pytest.mark.timeout(60)
def test_cluster_hosts_run_the_congestion_control_asked_for() -> None:
    """``cc``: every host's sockets default to it (not this machine's), the machine's list
    of allowed ones is put back at down, and a name the kernel lacks is refused first."""
    with pytest.raises(ValueError, match="congestion control"):
        cl.Cluster(2, None, prefix=TEST_PREFIX, cc="cubic; rm")
    c = cluster_or_skip(2, None, TEST_PREFIX)
    with pytest.raises(cl.ClusterUnavailable, match="not available"):
        cl.Cluster(2, None, prefix=TEST_PREFIX, cc="nosuchcc").check()
    wanted = next((n for n in ("cubic", "reno") if n != cl.default_cc()), None)
    if wanted not in cl.available_cc():
        pytest.skip(f"no congestion control other than {cl.default_cc()!r} here")
    allowed = Path(cl.CC_ALLOWED).read_text()
    c = cl.Cluster(2, None, prefix=TEST_PREFIX, cc=wanted)
    probe = ("import socket; s = socket.socket(); "
             "print(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).strip(b'\\0')"
             ".decode())")
    try:
        c.up()
        assert c.describe()["cc"] == wanted
        for i in range(2):
            assert c.run(i, [sys.executable, "-c", probe], timeout=30).stdout.strip() == wanted
    finally:
        c.down()
    assert Path(cl.CC_ALLOWED).read_text() == allowed
    assert cl.list_namespaces(c.ip, TEST_PREFIX) == []


@pytest.mark.timeout(60)
def test_next_up_restores_the_allowed_ccs_a_killed_run_left(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """A run killed before its ``down`` left its congestion control in the machine's
    allowed list: the next ``up`` of that prefix (or ``python -m mccl.cluster down``) puts
    the list back from the run's record."""
    c = cluster_or_skip(2, None, TEST_PREFIX)
    extra = next((n for n in ("cubic", "reno", "bbr") if n in cl.available_cc()
                  and n not in Path(cl.CC_ALLOWED).read_text().split()), None)
    if extra is None:
        pytest.skip("every congestion control here is allowed already")
    monkeypatch.setattr(cl, "OWNER_DIR", str(tmp_path))
    allowed = Path(cl.CC_ALLOWED).read_text()
    run = cl.Cluster(2, None, prefix=TEST_PREFIX, cc=extra)
    after = cl.Cluster(2, None, prefix=TEST_PREFIX)
    try:
        run.up()
        assert extra in Path(cl.CC_ALLOWED).read_text().split()
        run._allowed_before = None  # as if killed: its down() no longer restores the list
        run.down()
        assert extra in Path(cl.CC_ALLOWED).read_text().split()
        after.up()
        assert Path(cl.CC_ALLOWED).read_text() == allowed
        assert not list(tmp_path.glob("*.cc-allowed"))
    finally:
        run.down()
        after.down()
        Path(cl.CC_ALLOWED).write_text(allowed)
    assert cl.list_namespaces(c.ip, TEST_PREFIX) == []


def test_rps_mask_names_every_cpu() -> None:
    assert cl.rps_mask(1) == "1"
    assert cl.rps_mask(16) == "ffff"
    assert cl.rps_mask(33) == "1,ffffffff"
    assert cl.rps_mask(64) == "ffffffff,ffffffff"
    # by default shaped links are steered, unshaped ones (CPU-bound) are not
    assert cl.Cluster(2, "1gbit").steer and not cl.Cluster(2, None).steer
    assert not cl.Cluster(2, "1gbit", steer=False).steer and cl.Cluster(2, None, steer=True).steer


@pytest.mark.timeout(60)
@pytest.mark.parametrize("steer", [True, False])
def test_cluster_steers_each_links_receive_as_asked(steer: bool) -> None:
    """``steer``: every veth end (each host's and each switch port) hands its received
    packets to the CPU its flow hashes to (RPS over every CPU), so no flow is reordered;
    without it they are left to the CPU that sent them (an empty mask)."""
    cluster_or_skip(2, None, TEST_PREFIX)
    c = cl.Cluster(2, "1gbit", prefix=TEST_PREFIX, steer=steer)
    want = (1 << (os.cpu_count() or 1)) - 1 if steer else 0
    try:
        c.up()
        assert c.describe()["rx_steering"] is steer
        ends = [(h, cl.HOST_IFACE) for h in c.hosts] + [(c.switch, f"p{i}") for i in range(2)]
        for ns, dev in ends:
            out = subprocess.run([c.ip, "netns", "exec", ns, "sh", "-c",
                                  f"cat {cl.RPS_GLOB.format(dev=dev)}"],
                                 capture_output=True, text=True, timeout=30)
            masks = out.stdout.split()
            assert out.returncode == 0 and masks, (ns, dev, out.stderr)
            assert [int(m.replace(",", ""), 16) for m in masks] == [want] * len(masks), (ns, dev)
    finally:
        c.down()
    assert cl.list_namespaces(c.ip, TEST_PREFIX) == []


@pytest.mark.timeout(60)
def test_cluster_without_rps_steers_nothing_unless_asked(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """A kernel without RPS: by default the cluster comes up unsteered (and says so in its
    description); asked for steering, it refuses in one line before making anything."""
    cluster_or_skip(2, None, TEST_PREFIX)
    monkeypatch.setattr(cl, "RPS_PROBE", "/nonexistent/rps_cpus")
    with pytest.raises(cl.ClusterUnavailable, match="RPS"):
        cl.Cluster(2, "1gbit", prefix=TEST_PREFIX, steer=True).up()
    c = cl.Cluster(2, "1gbit", prefix=TEST_PREFIX)
    try:
        c.up()
        assert c.describe()["rx_steering"] is False
    finally:
        c.down()
    assert cl.list_namespaces(c.ip, TEST_PREFIX) == []


# -- model ----------------------------------------------------------------------------------
def test_model_fit_recovers_synthetic_parameters() -> None:
    alpha, bw = 80e-6, 1.15e8
    sizes = [1 << k for k in range(10, 27, 2)]
    pts = [(n, s, ring_time(n, s, alpha, bw)) for n in (2, 4, 8) for s in sizes]
    fit = fit_alpha_beta(pts)
    assert math.isclose(fit.alpha_s, alpha, rel_tol=1e-6)
    assert math.isclose(fit.bandwidth_bps, bw, rel_tol=1e-6)
    noisy = [(n, s, t * (1.03 if i % 2 else 0.97)) for i, (n, s, t) in enumerate(pts)]
    fit2 = fit_alpha_beta(noisy)
    assert math.isclose(fit2.bandwidth_bps, bw, rel_tol=0.1)
    assert math.isclose(fit2.alpha_s, alpha, rel_tol=0.2)
    rows = [{"op": "all_reduce", "backend": "mccl", "world_size": n, "size": s,
             "time_us": t * 1e6} for n, s, t in pts]
    text = report({"rows": rows, "ceiling": {"bytes_per_s": 1.19e8}}, "mccl", fit, [24, 200],
                  10e9, [1 << 20, 1 << 26])
    assert " 200 " in text and "alpha" in text
    assert "grid 40x5" in text  # 1 MiB on 200 hosts: what mccl would run
    with pytest.raises(ValueError):
        fit_alpha_beta([(4, 1024, 1e-3)])


def test_model_counts_the_steps_mccl_runs() -> None:
    """A grid's steps where ``grid.columns`` picks one (the same bytes, fewer steps), the
    ring's elsewhere."""
    mb = 1 << 20
    assert mccl_steps(8, mb) == (2 * 3 + 2 * 1, 4)  # 2 rows of 4
    assert mccl_steps(8, 64 * mb) == (14, None)
    assert mccl_steps(3, mb) == (4, None)
    assert mccl_time(16, mb, 30e-6, 1e9) < ring_time(16, mb, 30e-6, 1e9)
    assert mccl_time(8, 64 * mb, 30e-6, 1e9) == ring_time(8, 64 * mb, 30e-6, 1e9)


def test_model_cli_on_saved_results(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pts = [(n, 1 << k, ring_time(n, 1 << k, 50e-6, 1.1e8)) for n in (2, 4) for k in (16, 20, 24)]
    doc = {"schema": "mccl-bench/1", "ceiling": {"bytes_per_s": 1.19e8},
           "rows": [{"op": "all_reduce", "backend": "gloo", "world_size": n, "size": s,
                     "time_us": t * 1e6} for n, s, t in pts]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    from mccl.bench.model import main as model_main

    assert model_main([str(path), "--png", str(tmp_path / "m.png")]) == 0
    assert "alpha = 50.0 us/hop" in capsys.readouterr().out
    assert (tmp_path / "m.png").exists()


def test_timeline_summary_attributes_a_slow_link(tmp_path: Path) -> None:
    """benchmarks/timeline.py's summary on a hand-made trace of 2 ranks and 2 ops: per-op
    overheads, and the excess of the one link that took 3 ms longer than its bytes need."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import timeline
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    mb, bps = 1 << 20, float(1 << 30)  # 1 MiB takes 1/1024 s at the "ceiling"
    need = mb / bps
    traces = {0: [], 1: []}
    for op in range(2):
        t0 = op * 0.1
        for r in (0, 1):
            slow = 0.003 if (op, r) == (1, 0) else 0.0  # op 1: link 1 -> 0 is 3 ms late
            traces[r] += [(t0, "start", op, 0), (t0 + 1e-4, "send", 1 - r, mb),
                          (t0 + 1e-4, "recv", 1 - r, 0),
                          (t0 + 1e-4 + need + slow, "got", 1 - r, mb),
                          (t0 + 2e-4 + need + slow, "end", op, 0)]
    # rank 0's send socket (to rank 1), TCP_INFO before the first op and after the last:
    # between its first start and last end (op 1 ended 3 ms late) it had data to send for
    # 90 ms, 5 ms of them limited by the receiver's window
    info = [{"1": {"busy_us": b, "rwnd_limited_us": w, "sndbuf_limited_us": 0, "rtt_us": 900,
                   "snd_cwnd": 100, "snd_mss": 1448, "snd_wnd": 1 << 22, "total_retrans": 0}}
            for b, w in ((10_000, 1_000), (100_000, 6_000))]
    # its socket sampled four times: once in loss recovery, twice with nothing unsent
    fields = list(timeline.SAMPLE_FIELDS)
    rows = [dict(ca_state=c, rtt_us=rtt, snd_cwnd=100, unacked=u, notsent_bytes=ns,
                 pacing_rate=1_250_000_000, delivery_rate=1_000_000_000, app_limited=al)
            for c, rtt, u, ns, al in ((0, 100, 10, 0, 1), (4, 300, 20, 1000, 0),
                                      (0, 200, 30, 0, 0), (1, 400, 40, 5000, 0))]
    samples = [[0.05] + [row[k] for k in fields] for row in rows]
    for r, ev in traces.items():
        (tmp_path / f"rank{r}.json").write_text(json.dumps(
            {"rank": r, "world": 2, "events": ev, "tcp": info if r == 0 else [],
             "send_peer": 1 - r, "samples": samples if r == 0 else [], "sample_fields": fields}))
    s = timeline.summarize(tmp_path, bps)
    limits = s["send_socket_during_trace"][0]
    span_ms = 1e3 * (0.1 + 2e-4 + need + 0.003)
    assert (limits["busy_pct"], limits["rwnd_limited_pct"]) == (round(9000 / span_ms, 1),
                                                                 round(500 / span_ms, 1))
    assert limits["cwnd_bytes_median"] == 144_800 and limits["send_peer"] == 1
    assert limits["samples"] == 4 and limits["sampled_rtt_us_median"] == 250
    assert limits["sampled_unacked_bytes_median"] == 25 * 1448
    assert (limits["sampled_recovery_pct"], limits["sampled_disorder_or_cwr_pct"],
            limits["sampled_nothing_unsent_pct"], limits["sampled_app_limited_pct"]) == (
        25.0, 25.0, 50.0, 25.0)
    assert limits["sampled_pacing_gbit_median"] == 10.0
    # both ops start together; op 1 ends 3 ms apart; ops are 100 ms apart, so each link
    # waited from its last delivery of op 0 to its sender's first send of op 1
    assert s["start_skew_ms_median"] == 0 and math.isclose(s["end_skew_ms_median"], 1.5)
    gap = round(1e3 * (0.1 - need), 2)
    assert s["link_idle_between_ops_ms_mean"] == {"0->1": gap, "1->0": gap}
    assert s["ops"] == 2 and s["world"] == 2
    assert math.isclose(s["before_first_send_us_median"], 100, rel_tol=1e-6)
    assert math.isclose(s["after_last_recv_us_median"], 100, rel_tol=1e-6)
    assert math.isclose(s["ideal_ms"], 1e3 * need, rel_tol=1e-6)
    assert [round(x, 6) for x in s["link_excess_ms_per_op"]["0->1"]] == [0.0, 0.0]
    assert [round(x, 6) for x in s["link_excess_ms_per_op"]["1->0"]] == [0.0, 3.0]


def test_timeline_comm_thread_summary_counts_free_pool_slots() -> None:
    """The per-rank comm-thread summary: time from a chunk's arrival to the next receive,
    its share of the op, bytes waiting, and (reduce-scatter) how often a pool slot was free."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import timeline
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    ev = [(0.0, "start", 0, 0), (0.0, "recv", 1, 2_000_000), (0.001, "got", 1, 10),
          (0.001, "slot", 1, 1), (0.003, "recv", 1, 4_000_000), (0.004, "got", 1, 10),
          (0.004, "slot", 1, 0), (0.005, "recv", 1, 0), (0.006, "got", 1, 10),
          (0.006, "slot", 1, 1), (0.010, "end", 0, 0)]
    got = timeline._comm_thread([{"rank": 0, "events": ev}, {"rank": 1, "events": []}])
    assert got == {0: {"between_chunks_us_median": 1500, "between_chunks_share_of_ops": 0.3,
                       "waiting_at_recv_mb_median": 2.0, "pool_slot_free_share": 0.67}}


def test_overlap_bound_on_hand_computed_pipelines() -> None:
    """benchmarks/overlap.py's hidden_bound: bucket i's all-reduce starts once it is ready and
    the previous one is done; what runs past the end of compute is exposed."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import overlap
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    # two equal buckets, compute = comm = 2: the second all-reduce ends at 3, 1 of 2 exposed
    assert overlap.hidden_bound([1, 1], 2.0, 2.0) == 0.5
    # twice the compute: only the last bucket's all-reduce (1 of 2) is left exposed
    assert overlap.hidden_bound([1, 1], 4.0, 2.0) == 0.5
    # a big bucket just before a small last one: its all-reduce runs past the compute
    assert overlap.hidden_bound([3, 1], 4.0, 4.0) == 0.25
    # no compute at all hides nothing
    assert overlap.hidden_bound([1, 2, 3], 0.0, 1.0) == 0.0


def test_oppath_stages_in_order_for_each_variant(tmp_path: Path) -> None:
    """benchmarks/oppath.py at 2 ranks, tiny op, two interleaved variants: every stage of the
    path is reported for each, in the order the op passes them; --profile adds rank 0's
    profile."""
    out = tmp_path / "p.json"
    argv = [sys.executable, "benchmarks/oppath.py", "--world", "2", "--op", "reduce_scatter",
            "--size", "64K", "--reps", "8", "--variants", "a:;b:inline_max=4096",
            "--profile", "--json", str(out)]
    res = subprocess.run(argv, cwd=REPO, capture_output=True, text=True,
                         timeout=BENCH_TIMEOUT_S)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["op"] == "reduce_scatter" and doc["world"] == 2
    for rank in doc["stages_us_median"]:
        assert set(rank) == {"a", "b"}
        for stages in rank.values():
            names = ("pg", "submit", "execute", "body", "first_send", "last_got", "released",
                     "called", "returned")
            assert list(stages) == list(names)
            times = [stages[k] for k in names]
            assert times == sorted(times) and times[0] >= 0
    assert "[a]" in res.stdout and "[b]" in res.stdout
    assert "function calls" in res.stdout and "reduce_scatter" in doc["profile"]


def test_mesh_setup_connects_every_rank_in_both_orders(tmp_path: Path) -> None:
    """benchmarks/mesh_setup.py at 6 ranks, both dial orders, a backlog of 2: every rank
    connected in every row."""
    out = tmp_path / "m.json"
    argv = [sys.executable, "benchmarks/mesh_setup.py", "--ranks", "6", "--rounds", "1",
            "--backlog", "2", "--json", str(out)]
    res = subprocess.run(argv, cwd=REPO, capture_output=True, text=True,
                         timeout=BENCH_TIMEOUT_S)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["order"] for r in rows] == ["nearest", "zero"]
    assert all(r["connected"] == 6 and not r["errors"] and r["backlog"] == 2 for r in rows)


def test_a_rank_dials_its_nearest_lower_peer_first() -> None:
    from mccl.transport import rendezvous

    assert list(rendezvous.dial_order(4)) == [3, 2, 1, 0] and not rendezvous.dial_order(0)


def test_ab_settings_apply_and_restore() -> None:
    """The A/B hook (benchmarks/h200/ab/mccl_ab.py) changes a constant and puts it back, and
    refuses a key it does not know."""
    sys.path.insert(0, str(REPO / "benchmarks" / "h200" / "ab"))
    try:
        import mccl_ab
    finally:
        sys.path.remove(str(REPO / "benchmarks" / "h200" / "ab"))
    from mccl.algorithms import base
    from mccl.transport import mesh, tcp

    before = (base.MAX_CHUNK_BYTES, mesh.INLINE_MAX_BYTES)
    undo = mccl_ab.apply("max_chunk=4096,inline_max=128")
    assert (base.MAX_CHUNK_BYTES, mesh.INLINE_MAX_BYTES) == (4096, 128)
    undo()
    assert (base.MAX_CHUNK_BYTES, mesh.INLINE_MAX_BYTES) == before
    # socket-level switches wrap functions; undo puts the originals back
    fns = (mesh.tune_socket, tcp.Peer.recv_exact)
    undo = mccl_ab.apply("quickack=1,notsent=262144,cc=2,clamp=1048576")
    assert (mesh.tune_socket, tcp.Peer.recv_exact) != fns
    undo()
    assert (mesh.tune_socket, tcp.Peer.recv_exact) == fns
    undo = mccl_ab.apply("recv_piece=4096")
    assert tcp.Peer.recv_exact is not fns[1]
    undo()
    assert tcp.Peer.recv_exact is fns[1]
    from mccl import engine

    undo = mccl_ab.apply("early=0")
    assert not engine.EARLY_START
    undo()
    assert engine.EARLY_START
    from mccl.algorithms import ring

    plan = ring.copy_plan
    undo = mccl_ab.apply("whole=1")
    whole = ring.copy_plan(4000, 4, 1, 4, 1000)  # one range per segment, in the ring's order
    assert list(whole.ranges) == [(0, 1000), (3000, 4000), (2000, 3000), (1000, 2000)]
    assert whole.starts[1][0] == whole.ends[1][-1] == 3  # segment 1 is read last
    undo()
    assert ring.copy_plan is plan
    from mccl import collectives

    flat = collectives._flat_ranges
    undo = mccl_ab.apply("flat_ranges=0")
    assert collectives._flat_ranges(1 << 30, 4, 8, 1, 4 << 20) is None
    assert collectives._flat_ranges(1 << 30, 4, 8, 1, 4 << 20, own=True) is None
    undo()
    assert collectives._flat_ranges is flat
    undo = mccl_ab.apply("own_ranges=0")
    assert collectives._flat_ranges(1 << 30, 4, 8, 1, 4 << 20, own=True) is None
    assert collectives._flat_ranges(1 << 30, 4, 8, 1, 4 << 20) == flat(1 << 30, 4, 8, 1,
                                                                         4 << 20)
    undo()
    assert collectives._flat_ranges is flat
    from mccl.device.cuda import CudaOps

    ready = CudaOps.ready
    undo = mccl_ab.apply("ready_spin=1")  # (builds no event: nothing here calls it)
    assert CudaOps.ready is not ready
    undo()
    assert CudaOps.ready is ready
    import torch

    from mccl.device.cuda import CallerStreamHandoff, CudaAdapter

    prepare = CudaAdapter.prepare
    adapter = CudaAdapter(torch.device("cuda", 0))  # (no CUDA call until a copy)
    assert isinstance(adapter.prepare([], [], [], inline=True), CallerStreamHandoff)
    undo = mccl_ab.apply("caller_stream=0")
    assert CudaAdapter.prepare is not prepare
    undo()
    assert CudaAdapter.prepare is prepare
    interval = sys.getswitchinterval()
    undo = mccl_ab.apply("switch=250")
    assert sys.getswitchinterval() == pytest.approx(250e-6)
    undo()
    assert sys.getswitchinterval() == interval
    with pytest.raises(KeyError, match="nope"):
        mccl_ab.apply("nope=1")


def test_ab_cuda_ranks_reaches_the_bench_worker(tmp_path: Path) -> None:
    """``MCCL_AB=cuda_ranks=N`` puts ranks N and up on host tensors inside the bench's own
    rank processes, which run ``mccl.bench.worker`` as ``__main__``: the key's first version
    patched that module's function, which the running worker never called, and a device
    run of it measured the defaults."""
    marks = tmp_path / "marks.txt"
    env = {**os.environ, "MCCL_AB": "cuda_ranks=1", "MCCL_AB_MARKS": str(marks),
           "PYTHONPATH": os.pathsep.join(filter(None, [
               str(REPO / "benchmarks" / "h200" / "ab"), os.environ.get("PYTHONPATH")]))}
    _small_bench(tmp_path / "r.json", "--backends", "mccl", "--sizes", "8", "--ops",
                 "all_gather", "--check", "-q", env=env)
    lines = set(marks.read_text().splitlines())
    assert lines == {"rank 1 benches all_gather on host tensors (asked: cpu)"}, lines


def test_ab_hook_applies_where_mccl_is_not_installed(tmp_path: Path) -> None:
    """A process whose only way to mccl is the A/B folder on PYTHONPATH (the ranks that
    ``multiprocessing`` spawns on the device machine, where mccl is not installed, started
    outside the repo) still applies ``MCCL_AB``: the hook once failed to import mccl there,
    so Python reported it on stderr and timeline variants ran the default code."""
    import numpy
    import torch

    ab = REPO / "benchmarks" / "h200" / "ab"
    # -S: no site, so neither the .pth files of an editable install of mccl nor the hook run
    # at start-up; the child adds the folders holding torch and numpy as plain folders, then
    # imports the hook as site would
    packages = sorted({str(Path(m.__file__).resolve().parents[1]) for m in (torch, numpy)})
    child = textwrap.dedent(f"""
        import sys
        sys.path[:] = [{str(ab)!r}] + [p for p in sys.path if p] + {packages!r}
        try:
            import mccl
        except ImportError:
            print("mccl hidden")
        else:
            print("mccl found at", mccl.__file__)
            sys.exit(0)
        import sitecustomize
        import mccl
        from mccl.algorithms import grid
        print(grid.MIN_RANKS, mccl.__file__)
    """)
    env = {**os.environ, "MCCL_AB": "grid_min=1234"}
    env.pop("PYTHONPATH", None)
    out = subprocess.run([sys.executable, "-S", "-c", child], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    if lines[0].startswith("mccl found"):  # installed beside torch: the case cannot be made
        pytest.skip(lines[0])
    assert lines[0] == "mccl hidden", out.stdout
    value, path = lines[1].split(" ", 1)
    assert value == "1234" and Path(path).resolve().is_relative_to(REPO / "mccl")


def test_ab_report_keeps_the_ops_of_one_run_apart(tmp_path: Path) -> None:
    """An A/B run that benches several ops: the table has a row per op, variant and world
    (it once kept only the op benched last) and names sizes under 1 MB."""
    rows = [{"op": op, "size": size, "pct_ceiling": pct, "cpu_cores": pct / 100}
            for op, size, pct in
            (("all_reduce", 512 << 10, 80.0), ("all_reduce", 1 << 20, 90.0),
             ("all_gather", 512 << 10, 70.0), ("all_gather", 1 << 20, 60.0))]
    (tmp_path / "new-n4.json").write_text(json.dumps({"rows": rows}))
    (tmp_path / "gloo-n4.json").write_text(json.dumps({"rows": rows[:2]}))
    sys.path.insert(0, str(REPO / "benchmarks" / "h200"))
    try:
        import ab_report
    finally:
        sys.path.remove(str(REPO / "benchmarks" / "h200"))
    table = ab_report.table(ab_report.load(tmp_path))
    lines = table.splitlines()
    assert "512K" in lines[0] and "1M" in lines[0], lines[0]
    assert "| all_gather | new | 4 | 70.0 | 60.0 |" in lines, table
    assert "| all_reduce | new | 4 | 80.0 | 90.0 |" in lines, table
    assert "| all_reduce | gloo | 4 | 80.0 | 90.0 |" in lines, table
    assert len(lines) == 2 + 3, table
    ab_report.plot(ab_report.load(tmp_path), tmp_path / "ab.png")
    assert (tmp_path / "ab.png").stat().st_size > 0
    cores = ab_report.table(ab_report.load(tmp_path, "cpu_cores"), 2).splitlines()
    assert "| all_gather | new | 4 | 0.70 | 0.60 |" in cores, cores


@pytest.mark.parametrize("opts", [{}, {"send_piece": 1000}, {"recv_piece": 1200}])
def test_bare_ring_control_reduces_correctly(opts: dict) -> None:
    """benchmarks/bare_ring.py's ring (the control the chunk cap was chosen by) sums right on
    3 threads over socket pairs, with chunks that do not divide the segments and with writes
    or receives in pieces, twice in a row."""
    import socket
    import threading

    import numpy as np

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bare_ring
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    world, n = 3, 10_007
    links = [socket.socketpair() for _ in range(world)]  # link r: rank r -> rank r + 1
    rings = [bare_ring.BareRing(r, world, links[r][0], links[(r - 1) % world][1], chunk=4096,
                                **opts) for r in range(world)]
    arrs = [np.arange(n, dtype=np.float32) % 97 * (r + 1) for r in range(world)]
    errors: list[BaseException] = []

    def run(r: int) -> None:
        try:
            for _ in range(2):  # twice: the second op reuses the sender thread and sockets
                rings[r].all_reduce(arrs[r])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for ring in rings:
        ring.close()
    for a, b in links:
        a.close()
        b.close()
    assert not errors and not any(t.is_alive() for t in threads), errors
    once = np.arange(n, dtype=np.float32) % 97 * sum(range(1, world + 1))
    for a in arrs:
        assert np.array_equal(a, once * world)  # the second op summed the first's results


def test_free_port_skips_taken_ports_and_stays_below_the_ephemeral_range(monkeypatch) -> None:
    """Rendezvous ports come from LOOPBACK_PORTS (a port from the kernel's ephemeral range
    could be handed to another test's socket before the store binds it); one that something
    already holds is skipped."""
    import socket

    from mccl.bench import spawn

    held = socket.socket()
    try:
        for port in range(*spawn.LOOPBACK_PORTS):  # a port in the range this test can hold
            try:
                held.bind(("127.0.0.1", port))
                break
            except OSError:
                continue
        held.listen(1)
        taken = held.getsockname()[1]
        picks = iter([taken, taken, taken + 1 if taken + 1 <= spawn.LOOPBACK_PORTS[1]
                      else taken - 1])
        monkeypatch.setattr(spawn.random, "randint", lambda a, b: next(picks))
        got = spawn.free_port()
        assert got != taken and spawn.LOOPBACK_PORTS[0] <= got <= spawn.LOOPBACK_PORTS[1]
    finally:
        held.close()
    monkeypatch.undo()
    assert all(spawn.LOOPBACK_PORTS[0] <= spawn.free_port() <= spawn.LOOPBACK_PORTS[1]
               for _ in range(20))


def _env_and_sum(rank: int, world: int, names: tuple[str, ...]) -> tuple:
    import os

    import torch
    import torch.distributed as dist

    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    return tuple(os.environ.get(n) for n in names), t.tolist()


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_ranks_get_the_callers_environment_as_it_is_now(method: str, monkeypatch) -> None:
    """The suite's ranks fork from a server started once (conftest), the benchmarks' ranks
    are spawned: either way a rank sees the caller's environment at run_ranks time, variables
    set or removed since the server started included, and ``env`` on top."""
    import multiprocessing as mp

    from mccl.bench import spawn

    if method == "spawn":
        monkeypatch.setattr(spawn, "_context", mp.get_context("spawn"))
    names = ("MCCL_TEST_SET_LATER", "MCCL_TEST_REMOVED_LATER", "MCCL_TEST_GIVEN")
    monkeypatch.setenv("MCCL_TEST_REMOVED_LATER", "old")
    spawn.run_ranks(_env_and_sum, 2, names, timeout=120)  # a fork server runs from here on
    monkeypatch.setenv("MCCL_TEST_SET_LATER", "now")
    monkeypatch.delenv("MCCL_TEST_REMOVED_LATER")
    got = spawn.run_ranks(_env_and_sum, 2, names, env={"MCCL_TEST_GIVEN": "g"}, timeout=120)
    assert got == [(("now", None, "g"), [3.0] * 5)] * 2


def _last_rank_dies_or_hangs(rank: int, world: int, how: str) -> int:
    import os

    if rank == world - 1:
        if how == "dies":
            os._exit(7)
        time.sleep(60)
    return rank


@pytest.mark.parametrize("how", ["dies", "hangs"])
def test_run_ranks_tells_a_rank_that_died_from_one_that_hung(how: str) -> None:
    """A rank that exited without a result was reported as one that "did not finish within"
    the timeout, which sends whoever reads it looking for a hang."""
    from mccl.bench import spawn

    with pytest.raises(spawn.RanksFailed) as caught:
        spawn.run_ranks(_last_rank_dies_or_hangs, 2, how, init=False,
                        timeout=120 if how == "dies" else 3)
    said = str(caught.value)
    if how == "dies":
        assert "rank 1 exited with code 7 without a result" in said, said
        assert "did not finish" not in said, said
    else:
        assert "ranks [1] did not finish within 3s" in said, said
