"""Running a test's function on another thread (the comm thread's stand-in), and waiting,
bounded, for what another thread lets go of."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any


def in_thread(fn: Callable[[], Any], name: str | None = None) -> tuple[threading.Thread, dict]:
    """Start ``fn`` on a daemon thread; the dict gets its "value" or its "error"."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    return t, out


def on_thread(fn: Callable[[], Any], name: str = "comm", timeout: float = 30.0) -> Any:
    """Run ``fn`` on another thread and wait: its value, or its exception re-raised here."""
    t, out = in_thread(fn, name)
    t.join(timeout)
    assert not t.is_alive(), f"{name} thread still running after {timeout}s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def released(ref: weakref.ref, timeout: float = 10.0) -> bool:
    """Has the object behind ``ref`` been freed, within ``timeout`` seconds (polled)?"""
    deadline = time.monotonic() + timeout
    while ref() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    return ref() is None
