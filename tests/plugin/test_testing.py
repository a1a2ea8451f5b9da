"""fsbus.testing helpers, exercised through this package's own pytest fixtures."""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
import pytest

from fsbus import BlockingBus, Bus, BusConfig
from fsbus.testing import (
    WaitTimeout,
    collect,
    wait_for_messages,
    wait_for_messages_blocking,
)


def eventually(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Whether ``condition()`` holds within ``timeout`` seconds (checked every 10 ms).

    An acknowledgement is applied to the file shortly after ``ack`` returns.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def fsbus_config() -> BusConfig:
    return BusConfig(retry_interval=0.05)


@pytest.mark.anyio
async def test_wait_for_messages_returns_them(fsbus_bus: Bus) -> None:
    await fsbus_bus.publish("orders.created", "1")  # already on disk: counted (existing=True)
    await fsbus_bus.publish("orders.paid", "2")
    await fsbus_bus.publish("billing.sent", "3")
    msgs = await wait_for_messages(fsbus_bus, "orders.*", 2)
    assert sorted((m.topic, m.text()) for m in msgs) == [
        ("orders.created", "1"),
        ("orders.paid", "2"),
    ]


@pytest.mark.anyio
async def test_timeout_names_what_arrived(fsbus_bus: Bus) -> None:
    await fsbus_bus.publish("a.b", b"x")
    with pytest.raises(WaitTimeout) as caught:
        await wait_for_messages(fsbus_bus, "a.*", 3, timeout=0.3)
    assert str(caught.value) == (
        "expected 3 messages on 'a.*' within 0.3 s, got 1: ['a.b' (multi, 1 B: b'x')]"
    )
    assert isinstance(caught.value, AssertionError)
    assert isinstance(caught.value, TimeoutError)
    assert [m.topic for m in caught.value.received] == ["a.b"]


@pytest.mark.anyio
async def test_long_payloads_and_many_messages_are_shortened(fsbus_bus: Bus) -> None:
    for i in range(12):
        await fsbus_bus.publish(f"many.t{i:02}", b"y" * 100)
    with pytest.raises(WaitTimeout) as caught:
        await wait_for_messages(fsbus_bus, "many.*", 20, timeout=1.0)
    text = str(caught.value)
    assert text.startswith("expected 20 messages on 'many.*' within 1.0 s, got 12: [")
    assert "(multi, 100 B: b'" + "y" * 40 + "...')" in text
    assert text.endswith(", ... (2 more)]")


@pytest.mark.anyio
async def test_existing_false_waits_for_new_messages_only(fsbus_bus: Bus) -> None:
    await fsbus_bus.publish("old.one", "before")
    async with collect(fsbus_bus, "old.*", existing=False) as got:
        await fsbus_bus.publish("old.two", "after")
        [msg] = await got.wait(1)
    assert msg.text() == "after"


@pytest.mark.anyio
async def test_collect_records_until_the_block_ends(fsbus_bus: Bus) -> None:
    async with collect(fsbus_bus, "audit.#") as audit:
        assert len(audit) == 0
        await fsbus_bus.publish("audit.login", "ada")
        await fsbus_bus.publish("audit.logout", "ada")
        first_two = await audit.wait(2)
        snapshot = audit.messages
        snapshot.clear()  # a copy: the collector keeps its own list
    assert len(first_two) == 2
    assert len(audit) == 2
    assert {m.topic for m in audit.messages} == {"audit.login", "audit.logout"}


@pytest.mark.anyio
async def test_single_messages_are_consumed(fsbus_bus: Bus) -> None:
    for i in range(3):
        await fsbus_bus.publish("jobs.run", str(i), single=True)
    msgs = await wait_for_messages(fsbus_bus, "jobs.*", 3)
    assert sorted(m.text() for m in msgs) == ["0", "1", "2"]
    assert all(m.single for m in msgs)
    # Acks reach the files just after the handlers return; no event says when.
    with anyio.fail_after(10):
        while [i async for i in fsbus_bus.browse("jobs.#")]:  # noqa: ASYNC110
            await anyio.sleep(0.01)


@pytest.mark.anyio
async def test_zero_and_negative_counts(fsbus_bus: Bus) -> None:
    assert await wait_for_messages(fsbus_bus, "#", 0) == []
    with pytest.raises(ValueError, match="count must be 0 or more"):
        await wait_for_messages(fsbus_bus, "#", -1)
    with pytest.raises(ValueError, match="timeout must be 0 or more"):
        await wait_for_messages(fsbus_bus, "#", 1, timeout=-1)


def test_blocking_variant(fsbus_blocking_bus: BlockingBus) -> None:
    fsbus_blocking_bus.publish("jobs.email", "hello", single=True)
    [job] = wait_for_messages_blocking(fsbus_blocking_bus, "jobs.*", 1)
    assert job.single
    assert job.text() == "hello"
    assert eventually(lambda: list(fsbus_blocking_bus.browse("jobs.#")) == [])  # consumed


def test_blocking_variant_timeout(fsbus_blocking_bus: BlockingBus) -> None:
    fsbus_blocking_bus.publish("news.flash", "hi")
    with pytest.raises(WaitTimeout) as caught:
        wait_for_messages_blocking(fsbus_blocking_bus, "news.*", 2, timeout=0.3)
    assert str(caught.value) == (
        "expected 2 messages on 'news.*' within 0.3 s, got 1: ['news.flash' (multi, 2 B: b'hi')]"
    )


def test_fixtures_give_a_fresh_directory(fsbus_root, fsbus_blocking_bus: BlockingBus) -> None:  # type: ignore[no-untyped-def]
    assert fsbus_blocking_bus.root == str(fsbus_root)
    assert list(fsbus_blocking_bus.browse()) == []
    assert fsbus_blocking_bus.config.retry_interval == 0.05  # the overridden fsbus_config
