"""Helpers of the kombu transport tests (waiting on conditions, the peer's command line)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PEER = HERE / "kombu_peer.py"
WAIT = 30.0
"""Upper bound for any single wait; a healthy run needs a fraction of it."""


def drain_until(conn: Any, done: Callable[[], bool], *, timeout: float = WAIT) -> None:
    """Drain ``conn``'s events until ``done()``; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"condition not met within {timeout} s")
        try:
            conn.drain_events(timeout=min(left, 1.0))
        except TimeoutError:
            pass


def wait_for(check: Callable[[], bool], *, what: str, timeout: float = WAIT) -> None:
    """Poll ``check()`` until it holds (an ack is applied on disk just after it returns)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.01)


def peer_argv(*args: str) -> list[str]:
    """The command line of a kombu consumer process (see kombu_peer.py)."""
    return [sys.executable, str(PEER), *args]
