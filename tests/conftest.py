"""Suite-wide settings.

A guard: a test that failed with a forked child still running must not keep the test
run from exiting (multiprocessing joins its children at interpreter exit). The event
loops of the async tests: those marked ``@pytest.mark.anyio`` run on asyncio and trio.
And the groups ``make test`` keeps together when it runs the suite in two processes
(pytest-xdist, ``--dist loadgroup``): the tests sharing a costly service (Spark,
CephFS and GlusterFS, a RabbitMQ broker, a power-cut filesystem, a browser) run in one
process, which starts the service once.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

_HERE = Path(__file__).parent

_DIRECTORY_GROUPS = {"spark": "spark", "dfs": "dfs", "powercut": "powercut"}
"""Tests under these directories, by group: the Spark tests share a local session and a
standalone cluster, the distributed-filesystem tests CephFS and GlusterFS (their Spark
test starts a cluster of its own in that process)."""

_FIXTURE_GROUPS = {"rabbitmq": "rabbitmq", "chromium": "browser"}
"""Tests using these session fixtures, by group."""


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = None
        parts = item.path.relative_to(_HERE).parts
        if len(parts) > 1:
            group = _DIRECTORY_GROUPS.get(parts[0])
        if group is None:
            fixtures = getattr(item, "fixturenames", ())
            group = next((g for f, g in _FIXTURE_GROUPS.items() if f in fixtures), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


_WORKER_LINES: list[str] = []
"""Summary lines the pytest-xdist workers sent (e.g. the power-cut totals)."""


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    _WORKER_LINES.extend(getattr(node, "workeroutput", {}).get("summary_lines", ()))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _WORKER_LINES:
        terminalreporter.write_line(line)


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
