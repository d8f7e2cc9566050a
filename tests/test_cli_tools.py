"""The command-line tools refuse bad input in one line before any rank starts, clean up on
SIGTERM as on Ctrl-C, keep what was measured, and leave a user's cluster alone.

No timing thresholds: every wait is for a condition, under a generous deadline; every
subprocess has a timeout. Cluster tests skip without root and iproute2.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mccl.bench import cli
from mccl.bench import cluster as cl
from mccl.bench.report import (
    format_size,
    plural,
    prepare_output,
    size_range,
    write_json,
)
from mccl.transport import fdlimit
from tests.hosts import cluster_or_skip, worker_prefix

REPO = Path(__file__).resolve().parents[1]
PREFIX = worker_prefix("mcclcli")  # neither a user's "mccl" cluster nor the other tests' prefix
RUN_TIMEOUT_S = 120
#: Exits before any rank starts: the bench's plan is checked first.
QUICK = ["--ceiling-seconds", "0", "--world-sizes", "2", "--sizes", "8", "--backends", "gloo",
         "--iters", "1", "--warmup", "0", "--time-budget", "0", "--min-sample", "0"]


def _run(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S, env=env)


def _one_line_error(res: subprocess.CompletedProcess, status: int, text: str) -> None:
    assert res.returncode == status, res.stderr[-2000:]
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    assert text in res.stderr, res.stderr[-2000:]


def _parse(*argv: str) -> argparse.Namespace:
    from mccl.bench.__main__ import build_parser

    return build_parser().parse_args(list(argv))


def _remove_test_cluster(ip: str | None) -> None:
    if ip:
        cl.remove_namespaces(ip, PREFIX)
    cl._set_owner(PREFIX, None)


# -- 1: SIGTERM ends train as Ctrl-C does ------------------------------------------------
_SLEEPER = """
import os, pathlib, sys, time
pathlib.Path(sys.argv[-1], os.environ["RANK"]).write_text(str(os.getpid()))
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.timeout(150)
@pytest.mark.parametrize("on_cluster", [False, True], ids=["loopback", "cluster"])
def test_train_sigterm_kills_ranks_and_removes_the_cluster(tmp_path: Path,
                                                           on_cluster: bool) -> None:
    """Before: SIGTERM killed train at once and left its ranks (own sessions) running, and
    with --cluster the namespaces and the owner file."""
    ip = cluster_or_skip(2, None, PREFIX).ip if on_cluster else None
    script, pids = tmp_path / "sleeper.py", tmp_path / "pids"
    script.write_text(_SLEEPER)
    pids.mkdir()
    argv = [sys.executable, "-m", "mccl.bench.train", "--world-size", "2", "--backend", "gloo",
            "--script", str(script), *(["--cluster", "--prefix", PREFIX] if on_cluster else []),
            "--", str(pids)]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 90
        while len(ranks) < 2:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "ranks did not start"
            time.sleep(0.2)
            ranks = [int(p.read_text()) for p in pids.iterdir() if p.read_text()]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert "cluster removed" in err if on_cluster else "cluster" not in err
        deadline = time.monotonic() + 15  # killed and reaped by train before it exits
        while any(_alive(p) for p in ranks) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in ranks)
        if on_cluster:
            assert cl.list_namespaces(ip, PREFIX) == []
            assert not os.path.exists(cl._owner_file(PREFIX))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        for pid in ranks:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if on_cluster:
            _remove_test_cluster(ip)


# -- 2: a cluster made to stay is not a crashed run's leftovers ---------------------------
def test_owner_record_tells_leftovers_from_clusters_made_to_stay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cl, "OWNER_DIR", str(tmp_path))
    assert not cl.is_run_leftover(PREFIX)  # nothing recorded: made by hand or by `up`
    cl._set_owner(PREFIX, cl.PERSISTENT_OWNER)
    assert not cl.is_run_leftover(PREFIX) and cl.owner_pid(PREFIX) is None
    cl._set_owner(PREFIX, os.getpid())  # this process made it
    assert cl.is_run_leftover(PREFIX)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    cl._set_owner(PREFIX, gone.pid)  # a crashed run
    assert cl.is_run_leftover(PREFIX)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        cl._set_owner(PREFIX, live.pid)  # another run, still going
        assert not cl.is_run_leftover(PREFIX) and cl.owner_pid(PREFIX) == live.pid
    finally:
        live.kill()
        live.wait(timeout=10)


@pytest.mark.timeout(180)
def test_runs_refuse_to_replace_a_cluster_made_with_up() -> None:
    """Before: bench --cluster and train --cluster deleted a cluster made with
    `python -m mccl.cluster up` (it records no owner, and was taken for leftovers)."""
    made = cluster_or_skip(2, None, PREFIX)
    try:
        made.up(persist=True)
        names = cl.list_namespaces(made.ip, PREFIX)
        for owner in (cl.PERSISTENT_OWNER, None):  # as `up` records it; as older `up` did
            cl._set_owner(PREFIX, owner)
            run = cl.Cluster(2, None, prefix=PREFIX)
            with pytest.raises(cl.ClusterError, match=f"--prefix {PREFIX} down"):
                run.up()
            run.down()  # a refused run's clean-up leaves it alone too
            assert cl.list_namespaces(made.ip, PREFIX) == names
        res = _run("mccl.bench", "--cluster", "--prefix", PREFIX, *QUICK)
        _one_line_error(res, 3, "already has a cluster that no run owns")
        res = _run("mccl.bench.train", "--cluster", "--prefix", PREFIX, "--backend", "gloo")
        _one_line_error(res, 3, "already has a cluster that no run owns")
        assert cl.list_namespaces(made.ip, PREFIX) == names
    finally:
        _remove_test_cluster(made.ip)


# -- 3: output paths are checked before the run ----------------------------------------
def test_output_paths_are_checked_up_front(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ValueError, match="is a directory"):
        prepare_output(tmp_path, "--json")
    with pytest.raises(ValueError, match="afile is a file, not a folder"):
        prepare_output(afile / "r.json", "--json")
    if sys.platform.startswith("linux"):
        with pytest.raises(ValueError, match="cannot write there"):
            prepare_output("/proc/mccl-test/r.json", "--png")
    prepare_output(tmp_path / "new" / "r.json", "--json")  # makes the folder, leaves no file
    assert list((tmp_path / "new").iterdir()) == []

    def fail(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        write_json(tmp_path / "r.json", {"rows": []})
    assert not (tmp_path / "r.json.tmp").exists()


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_bench_refuses_an_unwritable_json_before_running(tmp_path: Path) -> None:
    """Before: the runs went ahead, then a traceback, results lost, 'X.tmp' left behind."""
    (tmp_path / "isdir").mkdir()
    res = _run("mccl.bench", *QUICK, "--json", str(tmp_path / "isdir"))
    _one_line_error(res, 2, "is a directory")
    assert "started" not in res.stderr and not (tmp_path / "isdir.tmp").exists()


# -- 4, 6: numbers and lists -------------------------------------------------------------
@pytest.mark.parametrize("argv", [("--iters", "0"), ("--iters", "-1"), ("--timeout", "-200"),
                                  ("--timeout", "0"), ("--warmup", "-1"), ("--factor", "1"),
                                  ("--time-budget", "-1"), ("--hosts", "-2"),
                                  ("--iters", "many"), ("--timeout", "nan"),
                                  ("--time-budget", "nan"), ("--factor", "nan")])
def test_bad_numbers_are_usage_errors(argv: tuple[str, str],
                                      capsys: pytest.CaptureFixture) -> None:
    """Before: --iters 0, --timeout -200 ... were accepted and failed inside the ranks
    (and NaN, which no comparison refuses, ran)."""
    with pytest.raises(SystemExit) as exc:
        _parse(*argv)
    assert exc.value.code == 2
    assert f"argument {argv[0]}" in capsys.readouterr().err


def test_a_cluster_of_one_host_is_a_usage_error() -> None:
    """Before: --cluster --hosts 1 brought the host up, then a traceback from the ceiling
    measurement, which needs a link between two hosts."""
    from mccl.bench.__main__ import _plan

    with pytest.raises(ValueError, match="--hosts must be at least 2 with --cluster"):
        _plan(_parse("--cluster", "--hosts", "1", "--world-sizes", "2"))
    _plan(_parse("--cluster", "--hosts", "2", "--world-sizes", "3"))  # ranks share (a note)


def test_cluster_settings_without_cluster_are_usage_errors() -> None:
    """Before: --rate, --hosts ... without --cluster were ignored, and the loopback run that
    followed could pass for one on shaped links."""
    from mccl.bench.__main__ import _plan

    for argv in (("--rate", "1gbit"), ("--hosts", "3"), ("--burst", "64K"), ("--cc", "cubic"),
                 ("--prefix", "other"), ("--rx-steering", "on")):
        with pytest.raises(ValueError, match=f"{argv[0]} set.* only with --cluster"):
            _plan(_parse(*argv, "--world-sizes", "2"))
    args = _parse("--cluster", "--world-sizes", "2")
    _plan(args)
    assert args.rate == "1gbit"  # the cluster's default rate


def test_a_plot_file_matplotlib_cannot_write_is_refused_before_running(tmp_path: Path) -> None:
    """Before: --png plot.txt (or the --json file) ran every size, then a traceback."""
    from mccl.bench.__main__ import _plan

    pytest.importorskip("matplotlib")
    with pytest.raises(ValueError, match=r"matplotlib cannot write \.txt files"):
        _plan(_parse("--png", str(tmp_path / "plot.txt"), "--world-sizes", "2"))
    same = str(tmp_path / "r.png")
    with pytest.raises(ValueError, match="--json and --png name the same file"):
        _plan(_parse("--json", same, "--png", same, "--world-sizes", "2"))
    _plan(_parse("--png", str(tmp_path / "plot.svg"), "--world-sizes", "2"))


def test_lists_are_checked_and_deduplicated() -> None:
    """Before: --ops '' ran nothing and exited 0, --sizes ''/--backends '' fell back to the
    defaults, duplicates ran twice, and a factor near 1 listed 200k sizes."""
    from mccl.bench.__main__ import MAX_SIZES, _plan

    for flag in ("--ops", "--sizes", "--backends", "--world-sizes"):
        with pytest.raises(cli.CliError, match=f"{flag} is empty"):
            _plan(_parse(flag, ""))
    with pytest.raises(cli.CliError, match="--world-sizes: 'x' is not an integer"):
        _plan(_parse("--world-sizes", "x"))
    with pytest.raises(ValueError, match=f"over the limit of {MAX_SIZES}"):
        _plan(_parse("--min", "1", "--max", "1G", "--factor", "1.0001"))
    ops, sizes, worlds, backends = _plan(_parse("--world-sizes", "2,3,2", "--backends",
                                                "gloo,gloo", "--sizes", "8,1K,8"))
    assert (sizes, worlds, backends) == ([8, 1024], [2, 3], ["gloo"])
    assert size_range(1, 20, 1.1) == sorted(set(size_range(1, 20, 1.1)))


# -- 5: devices ----------------------------------------------------------------------------
def test_unavailable_devices_are_refused_up_front() -> None:
    import torch

    cli.check_device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(cli.CliError, match="--device cuda"):
            cli.check_device("cuda")
    if not torch.backends.mps.is_available():
        with pytest.raises(cli.CliError, match="MPS is not available"):
            cli.check_device("mps")
    with pytest.raises(cli.CliError, match="unknown device"):
        cli.check_device("gpu0")


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_bench_refuses_cuda_without_cuda() -> None:
    """Before: ranks were launched and crashed on the device."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    res = _run("mccl.bench", *QUICK, "--device", "cuda")
    _one_line_error(res, 2, "--device cuda")
    assert "started" not in res.stderr


# -- 7, 8: sizes measured once per buffer; sizes an error skipped -------------------------
def test_sizes_that_are_one_buffer_are_measured_once() -> None:
    """Before: 1B, 7B and 8B were three 12-byte all_gathers at 3 ranks; the table kept one."""
    from mccl.bench.runner import BenchConfig, distinct_sizes

    cfg = BenchConfig(ops=["all_gather", "broadcast"], sizes=[1, 7, 8, 3584])
    by_op, notes = distinct_sizes(cfg, 3)
    assert by_op == {"all_gather": [1, 3584], "broadcast": [1, 8, 3584]}
    assert notes == ["all_gather n=3 float32: sizes that are one buffer are measured once "
                     "(1B, 7B, 8B -> 12B)",
                     "broadcast n=3 float32: sizes that are one buffer are measured once "
                     "(1B, 7B -> 4B)"]


@pytest.mark.timeout(150)
def test_an_error_records_the_sizes_it_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: after an error at 8B the op's other sizes vanished without a note."""
    from mccl.bench.runner import BenchConfig, run_job
    from mccl.bench.worker import FAULT_ENV

    cfg = BenchConfig(ops=["all_gather", "all_reduce"], sizes=[8, 1024], iters=1, warmup=0,
                      time_budget=0, min_sample_s=0, stall_timeout=5.0)
    monkeypatch.setenv(FAULT_ENV, "crash:all_gather")
    job = run_job("gloo", 2, cfg)
    assert [(r["op"], r["size"]) for r in job.rows] == [("all_reduce", 8), ("all_reduce", 1024)]
    assert [(e["op"], e["size"], e.get("skipped", False)) for e in job.errors] == [
        ("all_gather", 8, False), ("all_gather", 1024, True)]
    assert job.errors[1]["error"] == "skipped after the error at 8B"


# -- 9: an interrupted bench keeps what it measured ----------------------------------------
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_interrupted_bench_reports_the_rows_it_measured(tmp_path: Path) -> None:
    """Before: Ctrl-C lost the rows of the job it interrupted (JSON: 0 rows, no table) and
    said 'cluster removed' on loopback."""
    from mccl.bench.worker import FAULT_ENV

    out = tmp_path / "r.json"
    argv = [sys.executable, "-m", "mccl.bench", *QUICK, "--ops", "all_reduce,all_gather",
            "--json", str(out)]
    env = dict(os.environ, **{FAULT_ENV: "hang:all_gather"})  # stops after all_reduce's row
    # (SIGINT back to its default: a suite run as a shell's background job ignores it, and
    # the bench would inherit that)
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: list[str] = []
    pump = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    pump.start()
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not any("all_reduce" in ln and "busbw" in ln for ln in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        table = proc.stdout.read()
        assert proc.wait(timeout=60) == 130
        pump.join(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    err = "".join(lines)
    assert "interrupted; ranks killed" in err and "cluster" not in err, err
    assert "# all_reduce" in table
    doc = json.loads(out.read_text())
    assert doc["interrupted"] is True
    assert [(r["op"], r["size"]) for r in doc["rows"]] == [("all_reduce", 8)]


def test_interrupt_before_the_run_exits_130_quietly(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture) -> None:
    from mccl.bench import __main__ as bench

    def interrupted(args: argparse.Namespace) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "_plan", interrupted)
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # keep pytest's SIGTERM handling
    assert bench.main(["--sizes", "8"]) == 130
    assert capsys.readouterr().err == "interrupted\n"


# -- 10, 11: train's one-line errors ------------------------------------------------------
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_train_refuses_bad_settings_in_one_line() -> None:
    """Before: a ValueError traceback for --rate garbage, a rank's traceback for nccl."""
    _one_line_error(_run("mccl.bench.train", "--cluster", "--rate", "garbage"), 2,
                    "bad cluster setting: bad rate 'garbage'")
    _one_line_error(_run("mccl.bench.train", "--backend", "nccl"), 2,
                    "--backend: nccl not usable here")
    _one_line_error(_run("mccl.bench.train", "--timeout", "0"), 2, "argument --timeout")
    _one_line_error(_run("mccl.bench.train", "--world-size", "5000"), 2,
                    "argument --world-size: must be at most")


def test_world_sizes_past_what_this_machine_runs_are_refused() -> None:
    from mccl.bench.__main__ import _plan

    top = cli.local_ranks_limit()
    assert top >= cli.LOCAL_RANKS_FLOOR or top == fdlimit.summary()["largest_group"]
    with pytest.raises(cli.CliError, match=f"--world-sizes: {top + 1} is more than the {top}"):
        _plan(_parse("--world-sizes", f"2,{top + 1}"))
    assert _plan(_parse("--world-sizes", f"2,{top}"))[2] == [2, top]


def test_start_cluster_errors_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(cli.CliError, match="bad cluster setting") as exc:
        cli.start_cluster(2, "garbage", PREFIX)
    assert exc.value.status == 2
    monkeypatch.setattr(cl.os, "geteuid", lambda: 1000)
    with pytest.raises(cli.CliError, match="cluster unavailable") as exc:
        cli.start_cluster(2, "1gbit", PREFIX)
    assert exc.value.status == 3


# -- 12: doctor ----------------------------------------------------------------------------
@pytest.mark.timeout(RUN_TIMEOUT_S * 3)
def test_doctor_checks_its_arguments_and_environment(tmp_path: Path) -> None:
    """Before: --world 0 passed, --json into a missing folder and a bad MCCL_* variable gave
    tracebacks (an interface name that is none here: the self-test's, 30 lines), and without
    MPS the hand-off read 'unified' as if MPS were here."""
    _one_line_error(_run("mccl", "doctor", "--world", "0"), 2, "argument --world")
    # Before: --world 100000 started that many processes.
    _one_line_error(_run("mccl", "doctor", "--world", "100000"), 2,
                    f"must be at most {cli.local_ranks_limit()}")
    out = tmp_path / "x" / "y.json"
    res = _run("mccl", "doctor", "--no-selftest", "--json", str(out))
    assert res.returncode == 0, res.stderr
    assert "capabilities" in json.loads(out.read_text())
    import torch

    if not torch.backends.mps.is_available():
        assert "MPS hand-off: none here (no MPS device); on a Mac it would be" in res.stdout
    for var, value in (("MCCL_UNIFIED_COLLECTIVE", "maybe"), ("MCCL_LOG_LEVEL", "chatty"),
                       ("MCCL_SOCKET_IFNAME", "no-such-if0")):
        bad = _run("mccl", "doctor", env=dict(os.environ, **{var: value}))
        assert bad.returncode == 1 and "Traceback" not in bad.stdout + bad.stderr
        assert f"FAILED: bad mccl environment: {var}='{value}'" in bad.stdout
        assert "self-test: " not in bad.stdout


def test_doctor_labels_what_its_self_test_moves() -> None:
    from mccl.doctor import selftest_variants

    assert [label for _, label in selftest_variants("cpu")] == [
        "cpu tensors (the MPS hand-off paths need an MPS device)"]
    assert [unified for unified, _ in selftest_variants("mps")] == [True, False]


# -- 13, 14: model, mccl, cluster, sizes ----------------------------------------------------
def test_model_cli_reports_an_unreadable_file_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from mccl.bench.model import main as model_main

    (tmp_path / "bad.json").write_text("{bad")
    (tmp_path / "list.json").write_text("[1]")
    for name in ("missing.json", "bad.json", "list.json"):
        assert model_main([str(tmp_path / name)]) == 2
        assert capsys.readouterr().err.startswith(f"error: cannot read {tmp_path / name}")


def test_cosmetics(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from mccl.__main__ import main as mccl_main

    assert mccl_main(["foo"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown command 'foo'\nusage: python -m mccl")
    assert (plural(1, "host"), plural(2, "host")) == ("1 host", "2 hosts")
    assert format_size(65520) == "63.98K" and format_size(1536) == "1.5K"
    assert format_size(64 << 10) == "64K"
    with pytest.raises(ValueError, match="below 1 bit/s"):
        cl.parse_rate("0.5bit")
    assert cl.parse_rate("1.5kbit") == 1500 and cl.parse_rate("0") is None
    monkeypatch.setattr(cl.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cl.sys, "platform", "linux")
    with pytest.raises(cl.ClusterUnavailable, match="not found at /nonexistent/ip .from --ip"):
        cl.Cluster(2, "1gbit", prefix=PREFIX, ip_bin="/nonexistent/ip").check()


def test_train_timeout_message_shows_the_real_value(tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    from mccl.bench.train import launch

    script = tmp_path / "sleeper.py"
    script.write_text(_SLEEPER)
    assert launch(1, "gloo", [str(tmp_path)], script, timeout=0.5) == 124
    assert "within 0.5s" in caplog.text


def test_ceiling_cli_reports_cluster_problems_in_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """It shares bench's cluster bring-up: a cluster it may not have (here: not available)
    is one line and exit 3, not a traceback."""
    from mccl.bench import ceiling, cli

    def unavailable(*args, **kwargs):
        raise cli.CliError("cluster unavailable: emulated cluster needs root", 3)

    monkeypatch.setattr(cli, "start_cluster", unavailable)
    assert ceiling.main(["--cluster", "--seconds", "0.2"]) == 3
    assert capsys.readouterr().err.strip() == "cluster unavailable: emulated cluster needs root"


# -- thirty-fifth session: the model's input, plot names, default result files --------------
def test_model_refuses_bad_flags_rows_and_fits_it_cannot_make(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Before: tracebacks (ZeroDivisionError, KeyError, TypeError) for --hosts 1, rows
    without time_us, rows that are not a list; B = 1e6 GB/s from 8-byte points only, and
    alpha = 0 from points that are all one size on one world size."""
    from mccl.bench.model import main as model_main
    from mccl.bench.model import ring_time

    def doc(rows: object) -> str:
        path = tmp_path / f"r{len(list(tmp_path.iterdir()))}.json"
        path.write_text(json.dumps({"schema": "mccl-bench/1", "rows": rows}))
        return str(path)

    def row(n: int, size: int, t_s: float, **kw: object) -> dict:
        return {"op": "all_reduce", "backend": "mccl", "world_size": n, "size": size,
                "time_us": t_s * 1e6, **kw}

    good = doc([row(n, 1 << k, ring_time(n, 1 << k, 40e-6, 1e8))
                for n in (2, 4) for k in (10, 20, 24)])
    cases = [
        ([good, "--hosts", "1"], "--hosts: 1 is below 2"),
        ([good, "--hosts", "abc"], "--hosts: 'abc' is not an integer"),
        ([good, "--min-size", "1X"], "--min-size: bad size '1X'"),
        ([good, "--png", str(tmp_path / "m.txt")], "cannot write .txt files"),
        ([good, "--backend", "foo"], "no all_reduce rows of backend 'foo'"),
        ([doc([{"op": "all_reduce", "backend": "mccl", "world_size": 2, "size": 8}])],
         "row 0: field 'time_us' is missing"),
        ([doc([row(2, 8, 1e-4, time_us=None)])], "row 0: field 'time_us' is missing"),
        ([doc("oops")], "'rows' is a str"),
        ([doc([1, 2])], "row 0 is a int"),
        ([doc([row(n, 8, 1e-4 * n) for n in (2, 4, 8)] + [row(2, 16, 0.9e-4)])],
         "no bandwidth term"),
        ([doc([row(4, 1 << 20, 0.01)] * 3)], "cannot tell per-hop latency from bandwidth"),
    ]
    for argv, text in cases:
        assert model_main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and text in err and "Traceback" not in err, (argv, err)
    with pytest.raises(SystemExit):
        model_main([good, "--link-gbit", "0"])
    capsys.readouterr()
    assert model_main([good, "--png", str(tmp_path / "noext")]) == 0
    assert f"wrote {tmp_path / 'noext.png'}" in capsys.readouterr().err
    assert (tmp_path / "noext.png").is_file()


def test_bench_writes_its_results_by_default_and_names_the_files_it_wrote(
        tmp_path: Path) -> None:
    """Before: no JSON or PNG without --json/--png, and '--png noext' said it wrote 'noext'
    while matplotlib wrote 'noext.png'."""
    pytest.importorskip("matplotlib")
    run = [sys.executable, "-m", "mccl.bench", *QUICK]
    res = subprocess.run(run, cwd=tmp_path, capture_output=True, text=True,
                         timeout=RUN_TIMEOUT_S)
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads((tmp_path / "mccl-bench.json").read_text())
    assert [r["size"] for r in doc["rows"]] == [8]
    assert (tmp_path / "mccl-bench.png").read_bytes()[:4] == b"\x89PNG"
    assert "wrote mccl-bench.json" in res.stderr and "wrote mccl-bench.png" in res.stderr
    res = subprocess.run([*run, "--json", "none", "--png", str(tmp_path / "sub" / "noext")],
                         cwd=tmp_path / "sub" if (tmp_path / "sub").mkdir() is None else None,
                         capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert res.returncode == 0, res.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["noext.png"]
    assert f"wrote {tmp_path / 'sub' / 'noext.png'}" in res.stderr


@pytest.mark.timeout(150)
def test_sigterm_during_cluster_up_removes_what_it_made() -> None:
    """Before: SIGTERM (what `timeout` sends) mid bring-up left every namespace made so far;
    Ctrl-C removed them."""
    ip = cluster_or_skip(2, None, PREFIX).ip
    proc = subprocess.Popen([sys.executable, "-m", "mccl.cluster", "--prefix", PREFIX, "up",
                             "--hosts", "120"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while len(cl.list_namespaces(ip, PREFIX)) < 3:  # bring-up under way
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no namespace appeared"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 130, err
        assert cl.list_namespaces(ip, PREFIX) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        _remove_test_cluster(ip)
