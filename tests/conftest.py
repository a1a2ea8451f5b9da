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
import os
from collections.abc import Generator
from pathlib import Path

import pytest

_HERE = Path(__file__).parent

_DIRECTORY_GROUPS = {"dfs": "dfs", "powercut": "powercut", "amqp_gateway": "rabbitmq"}
"""Tests under these directories, by group: the distributed-filesystem tests share
CephFS and GlusterFS (their Spark test starts a cluster of its own in that process), the
gateway's tests a rabbitmq-server. tests/spark/conftest.py groups the Spark tests, by
session."""

LONG = "FSBUS_LONG_TESTS"
"""Set (or ``--long``) to run the tests marked ``long`` too (``make test-long``)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--long",
        action="store_true",
        default=False,
        help=f"also run the tests marked long (also {LONG}=1)",
    )


_FIXTURE_GROUPS = {"chromium": "browser"}
"""Tests using these session fixtures, by group."""

_FIRST = ("spark-cluster", "dfs", "spark-local", "powercut", "rabbitmq")
"""The longest groups, longest first: ``make test`` hands them out in this order (its
``--no-loadscope-reorder``), so that the longest starts at once, and the short tests
fill in around them."""


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> Generator[None, None, None]:
    # before the other hooks (pytest-xdist reads the groups in its own)
    long = config.getoption("--long") or os.environ.get(LONG, "") not in ("", "0")
    for item in items:
        if not long and item.get_closest_marker("long") is not None:
            item.add_marker(pytest.mark.skip(reason="a long run: make test-long runs it"))
        group = None
        parts = item.path.relative_to(_HERE).parts if item.path.is_relative_to(_HERE) else ()
        if len(parts) > 1:
            group = _DIRECTORY_GROUPS.get(parts[0])
        if group is None:
            fixtures = getattr(item, "fixturenames", ())
            group = next((g for f, g in _FIXTURE_GROUPS.items() if f in fixtures), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    yield
    # after them (the Spark tests' groups are marked by tests/spark/conftest.py)
    if getattr(config.option, "loadgroup", False):  # in a pytest-xdist worker

        def rank(item: pytest.Item) -> int:
            mark = item.get_closest_marker("xdist_group")
            group = mark.args[0] if mark is not None else None
            return _FIRST.index(group) if group in _FIRST else len(_FIRST)

        items.sort(key=rank)  # stable: each group keeps its order


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
