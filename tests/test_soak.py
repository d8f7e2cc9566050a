"""A short run of scripts/soak.py: random collectives on 4 ranks, every result checked against
a locally computed reference, file descriptors flat (the full 10,000-op run is manual)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_short_soak() -> None:
    cmd = [sys.executable, str(ROOT / "scripts" / "soak.py"), "--world", "4", "--ops", "300",
           "--max-bytes", "256K", "--seed", "1", "--pg-timeout", "60", "--timeout", "200"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=260)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "wrong results: 0" in proc.stdout and "verdict: OK" in proc.stdout, out
