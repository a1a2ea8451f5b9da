"""Suite-wide guard: a test that failed with a forked child still running must not keep
the test run from exiting (multiprocessing joins its children at interpreter exit)."""

from __future__ import annotations

import multiprocessing

import pytest


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    left = multiprocessing.active_children()
    for child in left:
        child.kill()
        child.join(10)
    if left:
        names = ", ".join(f"{c.name} (pid {c.pid})" for c in left)
        print(f"\nkilled {len(left)} child process(es) a test left running: {names}")
