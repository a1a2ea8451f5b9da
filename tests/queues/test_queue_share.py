"""Consumers of one queue in several processes split its buckets (fsbus/_bus/share.py).

Each Bus below stands for a process: it hosts the queue's bus and holds a consumer file
of its own, flocked, as a process does. What the split must never change: every message
is delivered once, and a consumer that holds its messages (hung) or has died holds back
no others.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import anyio
import pytest

from fsbus import Bus, BusConfig, Message
from fsbus._bus import engine

from .conftest import Inbox, wait_until


def share(bus: Bus, queue: str) -> frozenset[int] | None:
    hosted = bus._queue_buses.get(queue)
    return None if hosted is None else hosted.bus._share.mine


@pytest.fixture(autouse=True)
def quick_looks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "SHARE_EVERY", 0.05)


@pytest.mark.anyio
async def test_two_consumers_split_the_buckets_and_every_message_arrives_once(
    root: Path,
) -> None:
    one_in, two_in = Inbox(), Inbox()
    async with Bus(root) as one, Bus(root) as two:
        await one.declare_queue("work", ["jobs.#"])
        await one.subscribe(None, one_in, queue="work")
        await two.subscribe(None, two_in, queue="work")
        await wait_until(lambda: share(one, "work") and share(two, "work"))
        a, b = share(one, "work"), share(two, "work")
        assert a is not None
        assert b is not None
        assert not a & b
        assert sorted(a | b) == list(range(16))
        for i in range(400):
            await one.publish("jobs.run", str(i).encode())
        await wait_until(lambda: len(one_in.messages) + len(two_in.messages) >= 400)
        await wait_until(lambda: one.statistics().acked + two.statistics().acked >= 400)
        assert (await one.queue_info("work")).depth == 0
    got = Counter([*one_in.payloads, *two_in.payloads])
    assert got == Counter(str(i).encode() for i in range(400))


@pytest.mark.anyio
async def test_a_hung_consumer_holds_back_only_the_messages_it_holds(root: Path) -> None:
    """One consumer takes two messages and never returns from its handler: its part of
    the buckets is listed by the other, which gets every other message."""
    release = anyio.Event()
    held: list[bytes] = []

    async def hung(msg: Message) -> None:
        held.append(msg.payload)
        await release.wait()

    other = Inbox()
    n = 200
    async with Bus(root) as one, Bus(root) as two:
        await one.declare_queue("work", ["jobs.#"])
        await one.subscribe(None, hung, queue="work", prefetch=2)
        for i in range(2):
            await one.publish("jobs.run", str(i).encode())
        await wait_until(lambda: len(held) == 2)
        await two.subscribe(None, other, queue="work")
        await wait_until(lambda: share(one, "work") and share(two, "work"))
        for i in range(2, n):
            await one.publish("jobs.run", str(i).encode())
        await other.wait_for(n - 2)
        assert len(held) == 2
        release.set()
        await wait_until(lambda: one.statistics().acked + two.statistics().acked >= n)
        assert (await one.queue_info("work")).depth == 0
    got = Counter([*held, *other.payloads])
    assert got == Counter(str(i).encode() for i in range(n))


@pytest.mark.anyio
async def test_a_dead_consumers_file_takes_no_part(root: Path) -> None:
    """A consumer file no process holds (its consumer was killed) counts for nothing: the
    one live consumer lists every bucket, and gets every message."""
    inbox = Inbox()
    async with Bus(root, config=BusConfig()) as bus:
        await bus.declare_queue("work", ["jobs.#"])
        folder = root / "fsbus" / "queues" / "work" / "consumers"
        os.makedirs(folder, exist_ok=True)
        (folder / "1-deadbeef0000").write_bytes(b"")  # no flock on it
        await bus.subscribe(None, inbox, queue="work")
        hosted = bus._queue_buses["work"].bus
        looked = hosted._share.next_look
        await wait_until(lambda: hosted._share.next_look > looked)
        assert share(bus, "work") is None
        for i in range(50):
            await bus.publish("jobs.run", str(i).encode())
        await inbox.wait_for(50)
    assert Counter(inbox.payloads) == Counter(str(i).encode() for i in range(50))
