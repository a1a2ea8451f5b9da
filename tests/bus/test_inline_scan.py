"""Where a scan lists and reads (``Offload.scan``): on the event loop while the mount is
fast, in a worker thread while it is slow or the bus holds a big backlog, and back.

Which path a scan took is read from the I/O seam: the thread each bucket listing ran on.
The slow mount is a seam whose bucket listings sleep; where a test needs to know that
something happened *during* a listing, the listing waits for it on an event (with a
deadline), never on a timer.
"""

from __future__ import annotations

import functools
import threading
import time
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from fsbus import BlockingBus, Bus, BusConfig, Message
from fsbus._bus import engine, offload
from fsbus._bus.ops import Ops

from .conftest import WAIT, Inbox, message_files

PAYLOAD = b"x" * 100
TRIES = 5000
"""Messages a test may send waiting for the path to change (each a few µs on a fast
mount); only a bus that never changes path gets near it."""


@pytest.fixture(autouse=True)
def thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Thresholds for a busy test machine (as in ``test_async_offload``): a slow listing
    sleeps 30 ms, past ``SLOW`` for certain; a fast one takes microseconds."""
    monkeypatch.setattr(offload, "SLOW", 0.02)
    monkeypatch.setattr(offload, "FAST", 0.005)


class ListingSeam(Ops):
    """Records the thread of every bucket listing; each sleeps ``delay`` seconds while it
    is set. ``inside``: called once in the next listing (then cleared), its result kept."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.listings: list[int] = []  # thread id of each bucket listing, in order
        self.inside: object = None
        self.during: list[object] = []
        self.gate: threading.Event | None = None
        """While set here, a bucket listing waits (at most 10 s) until it is set."""

    def listdir(self, path: str) -> list[str]:
        if "/messages/" in path:
            self.listings.append(threading.get_ident())
            if self.gate is not None:
                self.gate.wait(10)
            if self.delay:
                time.sleep(self.delay)
            if callable(self.inside):
                inside, self.inside = self.inside, None
                self.during.append(inside())
        return super().listdir(path)


async def ping(bus: Bus, inbox: Inbox, topic: str = "t.ping") -> None:
    """Publish one message and wait until the subscriber has it."""
    count = len(inbox.messages)
    await bus.publish(topic, PAYLOAD)
    await inbox.wait_for(count + 1)


async def ping_until_inline(bus: Bus, inbox: Inbox, seam: ListingSeam) -> None:
    """Send messages until one's scan lists its bucket on this (the loop's) thread."""
    me = threading.get_ident()
    for _ in range(TRIES):
        before = len(seam.listings)
        await ping(bus, inbox)
        if me in seam.listings[before:]:
            return
    pytest.fail(f"{TRIES} messages on a fast seam and no scan ran inline")


async def backlog(bus: Bus, inbox: Inbox, total: int) -> None:
    """Publish until the bus has held ``total`` messages, and wait until each arrived."""
    for i in range(total - len(inbox.messages)):
        await bus.publish(f"t.backlog{i}", PAYLOAD)
    await inbox.wait_for(total)


@pytest.mark.anyio
async def test_scans_run_inline_on_a_fast_mount(root: Path) -> None:
    seam = ListingSeam()
    me = threading.get_ident()
    async with Bus(root, ops=seam) as bus:
        inbox = Inbox()
        await bus.subscribe("t.#", inbox)
        assert me not in seam.listings  # the first listing (every bucket) is in the thread
        await ping_until_inline(bus, inbox, seam)
        assert bus._offload.inline_scans >= 1
        sent = len(inbox.messages)
    assert [m.topic for m in inbox.messages] == ["t.ping"] * sent
    assert len(message_files(root)) == sent


@pytest.mark.anyio
async def test_slow_scans_move_to_the_thread_and_back(root: Path) -> None:
    seam = ListingSeam()
    me = threading.get_ident()
    async with Bus(root, ops=seam) as bus:
        inbox = Inbox()
        await bus.subscribe("t.#", inbox)
        await ping_until_inline(bus, inbox, seam)
        seam.delay = 0.03  # every bucket listing now takes 30 ms: a slow scan
        before = len(seam.listings)
        for _ in range(5):
            await ping(bus, inbox)
        slow = seam.listings[before:]
        # Two scans met the slow mount inline (one could be a hiccup); every later
        # listing ran in a worker thread, and publishes moved there too (one policy).
        assert slow.count(me) == 2
        assert all(t != me for t in slow[slow.index(me, slow.index(me) + 1) + 1 :])
        assert not bus._offload.inline
        seam.delay = 0.0
        before = len(seam.listings)
        await ping_until_inline(bus, inbox, seam)  # after a run of fast ones, inline again
        assert seam.listings[before] != me  # the first fast one still went to the thread
        sent = len(inbox.messages)
    # Each message was delivered once, on either path.
    names = [m.name for m in inbox.messages]
    assert len(set(names)) == len(names) == sent
    assert len(message_files(root)) == sent


@pytest.mark.anyio
async def test_a_big_backlog_is_listed_in_the_thread(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "_INLINE_SCAN_NAMES", 50)
    seam = ListingSeam()
    me = threading.get_ident()
    # Two buckets: every message's bucket soon holds more names than the bus lists on the
    # loop. (Each holds about half of the backlog, as the names hash: with 120 one held
    # 50 or fewer in about one run of 15, and the pings that landed there were listed
    # inline; with 240, that is seven standard deviations away.)
    config = BusConfig(bucket_base=2, bucket_num_chars=1)
    async with Bus(root, ops=seam, config=config) as bus:
        inbox = Inbox()
        await bus.subscribe("t.#", inbox)
        await ping_until_inline(bus, inbox, seam)
        await backlog(bus, inbox, 240)
        before = len(seam.listings)
        for _ in range(3):
            await ping(bus, inbox)
        assert seam.listings[before:]
        assert me not in seam.listings[before:]
        assert bus._offload.inline  # publishing stays inline: the mount is fast
    assert len(inbox.messages) == 243


@pytest.mark.anyio
async def test_a_backlog_in_other_buckets_does_not_move_scans_to_the_thread(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What counts is what a scan lists: the buckets whose stamps changed. A busy bus
    holds many multi messages until they expire, spread over its 256 buckets."""
    monkeypatch.setattr(engine, "_INLINE_SCAN_NAMES", 50)
    seam = ListingSeam()
    async with Bus(root, ops=seam) as bus:
        inbox = Inbox()
        await bus.subscribe("t.#", inbox)
        await ping_until_inline(bus, inbox, seam)
        await backlog(bus, inbox, 200)
        assert len(message_files(root)) > 50  # more than a scan may list on the loop
        await ping_until_inline(bus, inbox, seam)
        assert bus._offload.inline
    assert len(inbox.messages) == len(message_files(root))


@pytest.mark.anyio
async def test_the_loop_keeps_running_while_a_scan_waits_on_a_slow_mount(root: Path) -> None:
    """A ticker task counts loop turns; the slow listing itself checks that it counted on."""
    seam = ListingSeam()
    ticks = [0]
    want = [1 << 62]
    goal = threading.Event()

    async def ticker() -> None:
        while True:
            ticks[0] += 1
            if ticks[0] >= want[0]:
                goal.set()
            await anyio.lowlevel.checkpoint()

    def inside() -> int:
        # In the slow listing: wait (with a deadline) until the loop ticked 3 more times.
        # Were this listing on the loop's thread, the ticker could not tick and this
        # would time out.
        start = ticks[0]
        want[0] = start + 3
        goal.clear()
        reached = goal.wait(WAIT)
        return ticks[0] - start if reached else -1

    async with Bus(root, ops=seam) as bus:
        inbox = Inbox()
        await bus.subscribe("t.#", inbox)
        await ping_until_inline(bus, inbox, seam)
        seam.delay = 0.03
        for _ in range(3):  # meet the slow mount (inline: two strikes)
            await ping(bus, inbox)
        assert not bus._offload.inline
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            seam.inside = inside
            await ping(bus, inbox)
            tg.cancel_scope.cancel()
    assert seam.during
    assert seam.during[0] >= 3


@pytest.mark.anyio
async def test_a_long_listing_of_a_backlog_paces_the_next_and_a_small_one_does_not(
    root: Path,
) -> None:
    """The rule behind pacing (``Bus._paced_until``), on the bus's own record of its last
    listing: many names and slow rests seven times as long (at most a quarter second);
    a fast one, or a slow one of few names (a network mount), rests not at all."""
    async with Bus(root) as bus:
        inbox = Inbox()
        await bus.subscribe("t.#", inbox)
        await ping(bus, inbox)
        assert bus._listing_took == 0.0  # a listing of one small bucket
        assert bus._paced_until(100.0) == 0.0
        bus._listing_took = 0.01
        assert bus._paced_until(100.0) == pytest.approx(100.08)
        bus._listing_took = 1.0
        assert bus._paced_until(100.0) == pytest.approx(101.25)


@pytest.fixture
def slow_listings(monkeypatch: pytest.MonkeyPatch) -> tuple[ListingSeam, BusConfig]:
    """A seam whose bucket listings take 3 ms, a config of two buckets (big listings),
    and a pacing threshold so low that any backlog of work is paced."""
    monkeypatch.setattr(engine, "_PACE_NAMES", 4)
    monkeypatch.setattr(engine, "_PACE_FROM", 0.0)
    seam = ListingSeam()
    seam.delay = 0.003
    return seam, BusConfig(bucket_base=2, bucket_num_chars=1)


def _publish(root: Path, config: BusConfig, n: int, single: bool) -> None:
    """Publish ``t.m0`` .. ``t.m<n-1>`` one after another, from the calling thread."""
    with BlockingBus(root, config=config) as publisher:
        for i in range(n):
            publisher.publish(f"t.m{i}", PAYLOAD, single=single)


@pytest.mark.anyio
async def test_a_paced_consumer_still_gets_every_message_of_a_deep_backlog(
    root: Path, slow_listings: tuple[ListingSeam, BusConfig]
) -> None:
    """Listings slowed through the seam and a low threshold: every listing paces the next,
    and the events kept meanwhile are listed when the rest ends; nothing is missed."""
    seam, config = slow_listings
    n = 120
    async with Bus(root, ops=seam, config=config) as bus:
        inbox = Inbox()
        rests: list[float] = []  # the pace in force at each delivery

        async def handler(msg: Message) -> None:
            rests.append(bus._listing_took)
            await inbox(msg)

        await bus.subscribe("t.#", handler, kind="single")
        # work-queue messages, faster than the slowed listings: from a thread of their
        # own, so that a listing made on this loop does not hold them back
        await anyio.to_thread.run_sync(_publish, root, config, n, True)
        got = await inbox.wait_for(n)
        assert max(rests) > 0  # listings of the backlog were paced
    assert sorted(m.topic for m in got) == sorted(f"t.m{i}" for i in range(n))


@pytest.mark.anyio
async def test_multi_messages_left_in_their_buckets_pace_nothing(
    root: Path, slow_listings: tuple[ListingSeam, BusConfig]
) -> None:
    """Delivered multi messages stay until they expire, so a subscriber's listings grow
    with them; that is no backlog of work: slow listings of many multi messages never
    make the subscriber rest between them."""
    seam, config = slow_listings
    n = 60
    async with Bus(root, config=config) as publisher:
        async with Bus(root, ops=seam, config=config) as bus:
            inbox = Inbox()
            await bus.subscribe("t.#", inbox)
            for i in range(n):
                await publisher.publish(f"t.m{i}", PAYLOAD)
                await inbox.wait_for(i + 1)
                assert bus._listing_took == 0.0, f"paced after {i + 1} multi messages"
            assert len(seam.listings) >= n // 2  # listings of many names, each slow
    assert sorted(m.topic for m in inbox.messages) == sorted(f"t.m{i}" for i in range(n))


def test_what_paces_a_listing() -> None:
    """A backlog of work paces the next listing; new multi messages do too, gently, only
    when the listing waited for a core (its wall time over twice its CPU time) on a
    local mount; a full listing, a short one, or one new message never does."""
    pace = functools.partial(
        engine._pace_after, full=False, took=0.01, cpu=0.002, held=0, new_multi=5, local=True
    )
    many = engine._PACE_NAMES + 1
    assert pace(present_multi=many) == engine._FANOUT_REST
    assert pace(present_multi=many, held=many) == engine._BACKLOG_REST
    assert pace(present_multi=many, cpu=0.008) == engine._NO_REST  # had a core: no rest
    assert pace(present_multi=many, local=False) == engine._NO_REST  # round trips, not cores
    assert pace(present_multi=many, new_multi=1) == engine._NO_REST
    assert pace(present_multi=engine._PACE_NAMES) == engine._NO_REST
    assert pace(present_multi=many, full=True) == engine._NO_REST
    assert pace(present_multi=many, took=engine._PACE_FROM, cpu=0.0) == engine._NO_REST


@pytest.mark.anyio
async def test_fan_out_subscribers_paced_while_short_of_cores_get_every_message_once(
    root: Path, slow_listings: tuple[ListingSeam, BusConfig]
) -> None:
    """Listings that sleep in the seam wait as a listing short of a core does (wall time,
    no CPU time): with bursts of multi messages they pace the next listing, and both
    subscriptions still get every message, once."""
    seam, config = slow_listings
    n = 200
    async with Bus(root, ops=seam, config=config) as bus:
        first, second = Inbox(), Inbox()
        paces: list[float] = []

        async def handler(msg: Message) -> None:
            paces.append(bus._pace.factor if bus._listing_took else 0.0)
            await first(msg)

        await bus.subscribe("t.#", handler, kind="multi")
        await bus.subscribe("t.#", second, kind="multi")
        await ping(bus, second, "t.warm")  # past the subscriptions' first listings
        # A burst: the listings wait until the publisher's thread has published them all
        # (a listing that found one new message each time, the publisher held back by a
        # loaded machine, would pace nothing), then the next one finds the whole burst.
        seam.gate = gate = threading.Event()

        def burst() -> None:
            try:
                _publish(root, config, n, False)
            finally:
                gate.set()

        await anyio.to_thread.run_sync(burst)
        await first.wait_for(n + 1)
        await second.wait_for(n + 1)
        assert engine._FANOUT_PACE in paces  # the burst's listing was paced
    for inbox in (first, second):
        want = ["t.warm", *(f"t.m{i}" for i in range(n))]
        assert sorted(m.topic for m in inbox.messages) == sorted(want)
