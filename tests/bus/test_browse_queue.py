"""``browse(queue=...)``: a durable queue's messages listed without consuming them.

Real bus directories, both faces; every message is counted before and after, and a
consumer still gets everything that was browsed.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from fsbus import BlockingBus, Bus, BusConfig, InvalidPattern, QueueNotFound, UsageError

WAIT = 30.0


def _declare_and_publish(bus: BlockingBus) -> None:
    bus.declare_queue("billing", ["orders.*"])
    bus.declare_queue("shipping", ["orders.#"])
    bus.publish("orders.created", "1", headers={"source": "shop"}, priority=3)
    bus.publish("orders.created", "2")
    bus.publish("orders.eu.created", "3", single=True)
    bus.publish("other.topic", "not queued")


def test_lists_each_queue_without_consuming(root: Path) -> None:
    with BlockingBus(root) as bus:
        _declare_and_publish(bus)
        billing = list(bus.browse(queue="billing"))
        shipping = list(bus.browse(queue="shipping"))
        assert sorted(i.topic for i in billing) == ["orders.created", "orders.created"]
        assert sorted(i.topic for i in shipping) == [
            "orders.created",
            "orders.created",
            "orders.eu.created",
        ]
        # a queue's copies are work-queue messages of the queue's own bus
        queue_dir = root / "fsbus" / "queues" / "billing" / "bus"
        for info in billing + shipping:
            assert info.single
            assert not info.locked
            assert Path(info.path).is_file()
        assert all(Path(i.path).is_relative_to(queue_dir) for i in billing)
        # what the publisher gave is there: headers, priority, host
        [first] = [i for i in billing if i.headers]
        assert dict(first.headers) == {"source": "shop"}
        assert first.priority == 3
        assert first.host == socket.gethostname()
        assert first.published_at is not None
        assert abs(first.published_at - time.time()) < WAIT
        # the main bus is browsed as before: its own four messages, none of the copies
        assert len(list(bus.browse())) == 4
        assert not {i.name for i in bus.browse()} & {i.name for i in billing + shipping}
        # nothing was taken
        assert bus.queue_info("billing").depth == 2
        assert bus.queue_info("shipping").depth == 3
        again = {i.name for i in bus.browse(queue="shipping")}
        assert again == {i.name for i in shipping}
        with bus.messages(queue="shipping") as it:
            got = []
            for _ in range(3):
                msg = it.get(timeout=WAIT)
                got.append(msg.text())
                it.ack(msg)
        assert sorted(got) == ["1", "2", "3"]
        assert list(bus.browse(queue="shipping")) == []
        assert len(list(bus.browse(queue="billing"))) == 2


def test_pattern_filters_the_queue_by_topic(root: Path) -> None:
    with BlockingBus(root) as bus:
        _declare_and_publish(bus)
        assert [i.topic for i in bus.browse("orders.eu.#", queue="shipping")] == [
            "orders.eu.created"
        ]
        assert len(list(bus.browse("orders.created", queue="shipping"))) == 2
        assert list(bus.browse("other.#", queue="shipping")) == []
        assert list(bus.browse("orders.eu.#", queue="billing")) == []


def test_a_message_a_consumer_holds_is_listed_as_locked(root: Path) -> None:
    config = BusConfig(locking="flock")  # a held copy stays in its bucket, locked
    with BlockingBus(root, config=config) as bus:
        bus.declare_queue("jobs", ["jobs.#"])
        for i in range(3):
            bus.publish("jobs.resize", f"img-{i}")
        with bus.messages(queue="jobs") as it:
            held = it.get(timeout=WAIT)
            infos = {i.name: i.locked for i in bus.browse(queue="jobs")}
            assert len(infos) == 3
            assert [n for n, locked in infos.items() if locked] == [held.name]
            it.release(held)
        assert bus.queue_info("jobs").depth == 3


def test_expired_copies_are_not_listed(root: Path) -> None:
    with BlockingBus(root) as bus:
        bus.declare_queue("brief", ["t.#"], message_ttl=0.3)
        bus.publish("t.a", "soon gone")
        assert len(list(bus.browse(queue="brief"))) == 1
        deadline = time.monotonic() + WAIT
        while list(bus.browse(queue="brief")):
            assert time.monotonic() < deadline, "the copy never expired"
            time.sleep(0.05)


def test_missing_queue_bad_name_and_bad_pattern(root: Path) -> None:
    with BlockingBus(root) as bus:
        bus.declare_queue("here", ["a.#"])
        with pytest.raises(QueueNotFound, match="declare it first"):
            list(bus.browse(queue="nowhere"))
        with pytest.raises(UsageError):
            list(bus.browse(queue="no/slashes"))
        with pytest.raises(InvalidPattern):
            list(bus.browse("a\x01b", queue="here"))
        bus.delete_queue("here")
        with pytest.raises(QueueNotFound):
            list(bus.browse(queue="here"))
    # browsing created nothing for the missing or deleted queues
    assert not (root / "fsbus" / "queues" / "nowhere").exists()
    assert not (root / "fsbus" / "queues" / "here").exists()


@pytest.mark.anyio
async def test_async_face(root: Path) -> None:
    async with Bus(root) as bus:
        await bus.declare_queue("billing", ["orders.*"])
        await bus.publish("orders.created", "1", headers={"k": "v"})
        await bus.publish("orders.paid", "2")
        infos = [i async for i in bus.browse(queue="billing")]
        assert sorted(i.topic for i in infos) == ["orders.created", "orders.paid"]
        assert [dict(i.headers) for i in infos if i.headers] == [{"k": "v"}]
        paid = [i async for i in bus.browse("orders.paid", queue="billing")]
        assert [i.topic for i in paid] == ["orders.paid"]
        assert (await bus.queue_info("billing")).depth == 2
        with pytest.raises(QueueNotFound):
            [i async for i in bus.browse(queue="nowhere")]
