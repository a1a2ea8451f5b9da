"""Suite-wide settings.

A guard: a test that failed with a forked child still running must not keep the test
run from exiting (multiprocessing joins its children at interpreter exit). And the event
loops of the async tests: those marked ``@pytest.mark.anyio`` run on asyncio and trio.
"""

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


@pytest.fixture(scope="module", params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """The event loops that tests marked ``@pytest.mark.anyio`` run on: each such test runs
    once on asyncio and once on trio. Tests of asyncio-only clients (aio-pika in
    tests/amqp_gateway, the interop peers) stay on pytest-asyncio's ``@pytest.mark.asyncio``."""
    return str(request.param)
