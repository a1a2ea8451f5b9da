"""Consumers of one queue in several processes split its buckets (fsbus/_bus/share.py).

Each Bus below stands for a process: it hosts the queue's bus and holds a consumer file
of its own, flocked, as a process does. What the split must never change: every message
is delivered once, and a consumer that holds its messages (hung) or has died holds back
no others.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from fsbus import Bus, BusConfig, Message
from fsbus._bus import engine

from .conftest import WAIT, Inbox, wait_until


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


@pytest.mark.anyio
async def test_a_consumer_of_this_process_that_comes_during_a_look_is_not_another(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look at a queue's live consumers takes this process's own on the event loop
    and the others' files in a thread. A consumer of this process that comes meanwhile
    (its file made between the two) is one of its own: with no other process there,
    the process still lists every bucket. (It was counted as another: the process
    then listed half the buckets first, and left the other half's fresh work for
    _STEAL_AGE_MS, with no one else there to take it.)"""
    monkeypatch.setattr(engine, "SHARE_EVERY", 30.0)  # (the bus's own looks: its first only)
    async with Bus(root) as bus:
        await bus.declare_queue("work", ["jobs.#"])
        await bus.subscribe(None, Inbox(), queue="work")
        queues = bus._queues
        live = queues.live_consumers
        entered, opened = threading.Event(), threading.Event()

        def gated(name: str, own: Any = ()) -> list[str]:
            entered.set()
            opened.wait(WAIT)
            return live(name, own)

        monkeypatch.setattr(queues, "live_consumers", gated)
        looks: list[frozenset[int] | None] = []

        async def look() -> None:
            looks.append(await bus._share_now("work", 16))

        async with anyio.create_task_group() as tg:
            tg.start_soon(look)
            assert await anyio.to_thread.run_sync(entered.wait, WAIT)
            await bus.subscribe(None, Inbox(), queue="work")  # its file is made now
            opened.set()
        assert looks == [None]


@pytest.mark.anyio
async def test_a_consumer_that_comes_to_a_backlog_takes_its_part_of_it(root: Path) -> None:
    """Each consumer claims from its own part of the buckets first. Before, every
    consumer took the oldest messages first, so one that came to a backlog another was
    draining raced it for the same few at the head and lost every claim: it got nothing
    until the backlog was gone."""
    n = 1200
    gate = anyio.Event()
    one_got: list[bytes] = []

    async def one_handler(msg: Message) -> None:
        one_got.append(msg.payload)
        await gate.wait()  # drains once the other consumer has its part
        await anyio.sleep(0.002)  # (some work per message)

    async def two_handler(msg: Message) -> None:
        two_got.append(msg.payload)
        await anyio.sleep(0.002)

    two_got: list[bytes] = []
    async with Bus(root) as one, Bus(root) as two:
        await one.declare_queue("work", ["jobs.#"])
        for i in range(n):
            await one.publish("jobs.run", str(i).encode())
        await one.subscribe(None, one_handler, queue="work")
        await wait_until(lambda: len(one_got) >= 16)  # one is draining the head
        await two.subscribe(None, two_handler, queue="work")
        await wait_until(lambda: share(one, "work") and share(two, "work"))
        gate.set()
        await wait_until(lambda: one.statistics().acked + two.statistics().acked >= n)
        assert (await one.queue_info("work")).depth == 0
    assert Counter([*one_got, *two_got]) == Counter(str(i).encode() for i in range(n))
    # Half the buckets are two's: it takes a part of them (it took none before). Not
    # always half: once one has drained its own part it takes what is left of two's
    # (old, so not left to two), and the two race for it; under load one has ended
    # with up to four fifths of the 1,200.
    assert len(two_got) >= n // 8, (len(one_got), len(two_got))


@pytest.mark.anyio
async def test_fresh_work_in_another_consumers_part_is_left_to_it_for_a_while(
    root: Path,
) -> None:
    """A consumer with nothing of its own to do leaves a message just published into
    another consumer's part to that consumer (racing it for each one lost most claims)
    and takes it only once it has waited there engine._STEAL_AGE_MS: a consumer that
    holds its part (hung here) holds it back that long, never for good."""
    release = anyio.Event()
    held: list[bytes] = []

    async def hung(msg: Message) -> None:
        held.append(msg.payload)
        await release.wait()

    took: dict[bytes, tuple[str, float]] = {}

    async def other(msg: Message) -> None:
        took[msg.payload] = (msg.bucket, time.time())

    published: dict[bytes, float] = {}
    n = 60
    async with Bus(root) as one, Bus(root) as two:
        await one.declare_queue("work", ["jobs.#"])
        await one.subscribe(None, hung, queue="work", prefetch=1)
        await one.publish("jobs.run", b"first")
        await wait_until(lambda: held == [b"first"])  # one can take nothing more
        await two.subscribe(None, other, queue="work")
        await wait_until(lambda: share(one, "work") and share(two, "work"))
        ones = share(one, "work")
        assert ones is not None
        buckets = one._queue_buses["work"].bus.layout.buckets
        for i in range(n):
            body = str(i).encode()
            published[body] = time.time()
            await one.publish("jobs.run", body)
        await wait_until(lambda: len(took) == n)
        release.set()
        await wait_until(lambda: one.statistics().acked + two.statistics().acked >= n + 1)
    mine = [b for b, (bucket, _) in took.items() if buckets.index(bucket) not in ones]
    theirs = [b for b, (bucket, _) in took.items() if buckets.index(bucket) in ones]
    assert mine
    assert theirs  # 60 messages over 16 buckets: one's half holds some
    age = engine._STEAL_AGE_MS / 1000
    for body in theirs:
        # (millisecond publish times, read by a clock of the same host)
        assert took[body][1] - published[body] >= age - 0.002, body
    assert held == [b"first"]


@contextlib.asynccontextmanager
async def one_timed_consumer(root: Path) -> AsyncIterator[tuple[Bus, dict[bytes, float]]]:
    """A bus with queue ``work`` (bound ``jobs.#``) and one consumer of it, which notes
    when each payload came (``time.monotonic``); no poll tick lists meanwhile."""
    got: dict[bytes, float] = {}

    async def handler(msg: Message) -> None:
        got[msg.payload] = time.monotonic()

    async with Bus(root, config=BusConfig(poll_interval=30.0)) as bus:
        await bus.declare_queue("work", ["jobs.#"])
        await bus.subscribe(None, handler, queue="work")
        yield bus, got


@pytest.mark.anyio
async def test_a_consumer_that_just_found_work_lists_again_only_after_a_gap(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a busy flow a consumer leaves engine._BATCH_GAP between a listing that found
    work and the next one a filesystem event brings (so each listing finds several
    messages, not one); a message that comes after a quiet spell is listed at once."""
    gap = 1.0
    monkeypatch.setattr(engine, "_BATCH_GAP", gap)
    monkeypatch.setattr(engine, "SHARE_EVERY", 30.0)  # (a look at the consumers lists too)
    async with one_timed_consumer(root) as (bus, got):
        sent = {b"1": time.monotonic()}
        await bus.publish("jobs.run", b"1")
        await wait_until(lambda: b"1" in got)
        sent[b"2"] = time.monotonic()
        await bus.publish("jobs.run", b"2")  # its stamp comes within the gap
        await wait_until(lambda: b"2" in got)
        # listed no sooner than the gap after the listing that found "1"
        assert got[b"2"] - sent[b"1"] >= gap
        await wait_until(lambda: time.monotonic() - got[b"2"] >= gap)
        sent[b"3"] = time.monotonic()
        await bus.publish("jobs.run", b"3")  # the last listing was a gap ago
        await wait_until(lambda: b"3" in got)
        assert got[b"3"] - sent[b"3"] < gap


def hold_back_once(monkeypatch: pytest.MonkeyPatch, gap: float, *, armed: bool) -> list[bool]:
    """Stretch engine._BATCH_GAP to ``gap`` (and the looks at the consumers out of the
    way); while ``hold[0]`` is True (``armed`` to begin with), the next listing that
    finds work items holds every one of them back, as if all were published after it
    began, and sets ``hold[0]`` to False. Returns ``hold``."""
    monkeypatch.setattr(engine, "_BATCH_GAP", gap)
    monkeypatch.setattr(engine, "SHARE_EVERY", 30.0)
    hold = [armed]
    split = engine.split_fresh

    def held_once(entries: Any, horizon_ms: int) -> tuple[list[Any], list[Any]]:
        entries = list(entries)
        if hold[0] and entries:
            hold[0] = False
            return [], entries
        return split(entries, horizon_ms)

    monkeypatch.setattr(engine, "split_fresh", held_once)
    return hold


@pytest.mark.anyio
async def test_work_taken_from_the_held_back_counts_as_found_for_the_gap(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message that its first listing held back (published while that listing ran)
    is work found by the listing that takes it: the next listing a filesystem event
    brings waits engine._BATCH_GAP after that one, as after any listing that found
    work. (The held back were not counted: a consumer in a flow whose messages often
    came during its listings listed at every stamp, as before the gap.)"""
    gap = 1.0
    hold = hold_back_once(monkeypatch, gap, armed=True)
    async with one_timed_consumer(root) as (bus, got):
        sent = time.monotonic()
        await bus.publish("jobs.run", b"1")
        await wait_until(lambda: b"1" in got)
        assert not hold[0]  # the listing that found it held it back
        await bus.publish("jobs.run", b"2")  # its stamp comes within the gap
        await wait_until(lambda: b"2" in got)
        # listed no sooner than the gap after the listing that took "1" (which began
        # after "1" was published)
        assert got[b"2"] - sent >= gap


@pytest.mark.anyio
async def test_work_a_listing_held_back_is_listed_again_at_once_not_after_the_gap(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message published while a listing ran is held back until the next listing,
    which comes within engine._HELD_WAIT; a listing that found nothing else does not
    make it wait engine._BATCH_GAP."""
    gap = 1.0
    hold = hold_back_once(monkeypatch, gap, armed=False)
    async with one_timed_consumer(root) as (bus, got):
        await bus.publish("jobs.run", b"1")
        await wait_until(lambda: b"1" in got)
        await wait_until(lambda: time.monotonic() - got[b"1"] >= gap)
        hold[0] = True
        sent = time.monotonic()
        await bus.publish("jobs.run", b"2")
        await wait_until(lambda: b"2" in got)
        assert not hold[0]  # the listing that found it held it back
        assert got[b"2"] - sent < gap
