"""pytest plugin shipped with fsbus: a fresh bus per test, no broker to start.

Installing fsbus registers this module through the ``pytest11`` entry point, so a
test suite gets these fixtures without any ``conftest.py``:

``fsbus_root``
    A fresh, empty directory under ``tmp_path`` for the bus.
``fsbus_config``
    The :class:`~fsbus.BusConfig` the bus fixtures use (``None``: defaults).
    Override it in a ``conftest.py`` to change options for some tests.
``fsbus_blocking_bus``
    An open :class:`~fsbus.BlockingBus` on ``fsbus_root``, closed after the test.
``fsbus_amqp_url``
    The URL of an AMQP 0-9-1 gateway on ``fsbus_root`` (a free port of 127.0.0.1):
    code that talks to RabbitMQ through pika, aio-pika or kombu runs on the bus unchanged.
``fsbus_bus``
    An open :class:`~fsbus.Bus` on ``fsbus_root``, closed after the test. It is an
    async fixture run by pytest-asyncio (mark the test ``@pytest.mark.asyncio`` in
    strict mode) or by the anyio pytest plugin for tests marked ``@pytest.mark.anyio``,
    on asyncio or trio.

The helpers to await messages live in :mod:`fsbus.testing`.

fsbus itself is imported only when a fixture is used, so loading the plugin costs
nothing for test suites that never touch a bus.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from fsbus import BlockingBus, Bus, BusConfig

__all__ = ["fsbus_amqp_url", "fsbus_blocking_bus", "fsbus_bus", "fsbus_config", "fsbus_root"]


@pytest.fixture
def fsbus_root(tmp_path: Path) -> Path:
    """A fresh, empty directory for a bus, inside the test's ``tmp_path``."""
    root = tmp_path / "fsbus"
    root.mkdir()
    return root


@pytest.fixture
def fsbus_config() -> BusConfig | None:
    """The configuration of ``fsbus_bus`` and ``fsbus_blocking_bus``; override to change it."""
    return None


@pytest.fixture
def fsbus_blocking_bus(fsbus_root: Path, fsbus_config: BusConfig | None) -> Iterator[BlockingBus]:
    """An open :class:`fsbus.BlockingBus` on ``fsbus_root``, closed after the test."""
    from fsbus import BlockingBus

    with BlockingBus(fsbus_root, config=fsbus_config) as bus:
        yield bus


async def _open_bus(root: Path, config: BusConfig | None) -> AsyncIterator[Bus]:
    """Open a Bus in a task of its own and hand it out until the fixture is torn down.

    pytest-asyncio runs an async fixture's set-up and tear-down in two different
    tasks, while a Bus owns a task group that must be left in the task that entered
    it. So one task holds the Bus open from start to end and the fixture only waits
    on it.
    """
    from fsbus import Bus

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not asyncio: trio, whose test runners (the anyio plugin,
        # pytest-trio) run a fixture's set-up and tear-down in one task
        async with Bus(root, config=config) as bus:
            yield bus
        return
    opened: asyncio.Future[Bus] = loop.create_future()
    done = asyncio.Event()

    async def hold() -> None:
        try:
            async with Bus(root, config=config) as bus:
                opened.set_result(bus)
                await done.wait()
        except BaseException as exc:
            if not opened.done():
                opened.set_exception(exc)
                return
            raise

    holder = loop.create_task(hold(), name=f"fsbus_bus holder for {root}")
    try:
        bus = await opened
    except BaseException:
        await holder
        raise
    try:
        yield bus
    finally:
        done.set()
        await holder


def _async_fixture() -> Callable[[Any], Any]:
    try:
        import pytest_asyncio
    except ImportError:  # the anyio plugin (or none) will run it
        return pytest.fixture
    return pytest_asyncio.fixture


@_async_fixture()
async def fsbus_bus(fsbus_root: Path, fsbus_config: BusConfig | None) -> AsyncIterator[Bus]:
    """An open :class:`fsbus.Bus` on ``fsbus_root``, closed after the test."""
    async for bus in _open_bus(fsbus_root, fsbus_config):
        yield bus


@pytest.fixture
def fsbus_amqp_url(fsbus_root: Path, fsbus_config: BusConfig | None) -> Iterator[str]:
    """The URL of an AMQP 0-9-1 gateway on the test's bus (``fsbus_root``), on a free
    port of 127.0.0.1, served from a thread: RabbitMQ clients (pika, aio-pika, kombu)
    connect to it unchanged. Works in plain and async tests."""
    from fsbus.amqp import running

    with running(fsbus_root, config=fsbus_config) as gateway:
        yield gateway.url
