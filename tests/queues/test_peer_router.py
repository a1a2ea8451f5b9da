"""One process routes peers' messages for the queue consumers of a bus, and another takes
over when it goes.

qlobber-fsq peers do not route into queues: an fsbus process that lists the main bus
copies their messages. A process that only consumes queues lists the main bus for that
alone, so of those, one is elected (a flock on ``fsbus/queues/.router``) and the others
wait for their turn. These tests plant files exactly as qlobber-fsq writes them (the
vectors of tests/bus/data); tests/interop/test_qlobber_queues.py does it with the real
npm peer and ``kill -9``.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

from fsbus import BlockingBus, Bus, BusConfig
from fsbus._bus import engine
from fsbus._bus.layout import Layout
from fsbus._bus.ops import Ops

from .conftest import WAIT, Inbox, wait_until

FAST = BusConfig(poll_interval=0.05, retry_interval=0.05, gc_interval=0.2)

_VECTORS: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent.parent / "bus" / "data" / "qlobber_fsq_names.json").read_text()
)["messages"]
PEER = next(v for v in _VECTORS if v["topic"] == "foo.bar" and not v["single"])
"""A multi message as qlobber-fsq 14 names it (no spill)."""


def plant_peer_message(root: Path, payload: bytes) -> str:
    """Publish ``payload`` on ``foo.bar`` as a qlobber-fsq peer does: a name of its form
    (32 random hex digits, no fsbus fields), staged, renamed into a bucket, stamped."""
    at = PEER["name"].rindex("@")
    expires = int((time.time() + 600) * 1000)
    name = f"{PEER['name'][:at]}@s+{expires:x}+m+{secrets.token_hex(16)}"
    staged = root / "staging" / f"peer-{secrets.token_hex(4)}"
    staged.write_bytes(b"\x00" + payload)
    # (a qlobber-fsq peer makes every bucket when it starts)
    (root / "messages" / PEER["bucket"]).mkdir(exist_ok=True)
    os.rename(staged, root / "messages" / PEER["bucket"] / name)
    # and stamps the bucket's slot in UPDATE, which wakes the processes that watch it
    layout = Layout.of(str(root), FAST)
    index = layout.buckets.index(PEER["bucket"])
    with open(layout.update_file, "r+b") as update:
        update.seek(layout.stamp_offset(index))
        update.write(secrets.token_bytes(layout.stamp_size))
    return name


def scans(bus: Bus) -> int:
    """Listings of the main bus this process made (its queues' buses not counted)."""
    return bus.statistics().scans


@pytest.mark.anyio
async def test_one_queue_consumer_lists_the_main_bus_and_another_takes_over(
    root: Path,
) -> None:
    with BlockingBus(root) as admin:
        admin.declare_queue("q", ["foo.#"])
    first, second = Inbox(), Inbox()
    both = (first, second)

    def received() -> Counter[bytes]:
        return Counter(p for inbox in both for p in inbox.payloads)

    async with Bus(root, config=FAST) as b:
        await b.subscribe(None, second, queue="q")
        async with Bus(root, config=FAST) as a:
            await a.subscribe(None, first, queue="q")
            # b consumed first: it routes; a only consumes, and never lists the main bus
            await a.publish("foo.fsbus", b"from fsbus")
            await wait_until(lambda: received()[b"from fsbus"])
            await anyio.to_thread.run_sync(plant_peer_message, root, b"peer 1")
            await wait_until(lambda: received()[b"peer 1"])
            assert scans(b) > 0
            assert scans(a) == 0
        async with Bus(root, config=FAST) as a:
            await a.subscribe(None, first, queue="q")
            assert scans(a) == 0
            # the router goes; a message a peer publishes before anyone took over
            # is routed by the one that does, once
            await b.aclose()
            await anyio.to_thread.run_sync(plant_peer_message, root, b"peer 2")
            await wait_until(lambda: scans(a) > 0)
            await wait_until(lambda: received()[b"peer 2"])
            await anyio.to_thread.run_sync(plant_peer_message, root, b"peer 3")
            await wait_until(lambda: received()[b"peer 3"])
    assert await anyio.to_thread.run_sync(depth, root) == 0
    assert received() == Counter([b"from fsbus", b"peer 1", b"peer 2", b"peer 3"])


@pytest.mark.anyio
async def test_a_new_router_leaves_what_the_old_one_had_passed(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new router routes from where the old one had got to (its progress, kept in
    ``fsbus/queues/.router``): a peer's message that came before any router ran stays
    unrouted, as it was, and one published after the takeover is routed. (No slack:
    the first router would otherwise route a peer's message of the last 50 ms before
    its consumer came, which the timestamps of files cannot tell apart.)"""
    monkeypatch.setattr(engine, "_ROUTER_SLACK", 0.0)
    monkeypatch.setattr(engine, "_START_SLACK", 0.0)
    with BlockingBus(root) as admin:
        admin.declare_queue("q", ["foo.#"])
    await anyio.to_thread.run_sync(plant_peer_message, root, b"before")
    inbox = Inbox()
    async with Bus(root, config=FAST) as a:
        await a.subscribe(None, inbox, queue="q")
        async with Bus(root, config=FAST) as b:
            await b.subscribe(None, inbox, queue="q")
            assert scans(b) == 0  # a routes
            await a.aclose()
            await wait_until(lambda: scans(b) > 0)
            await anyio.to_thread.run_sync(plant_peer_message, root, b"after")
            await wait_until(lambda: b"after" in inbox.payloads)
    assert await anyio.to_thread.run_sync(depth, root) == 0
    assert inbox.payloads == [b"after"]


def depth(root: Path) -> int:
    with BlockingBus(root) as admin:
        return admin.queue_info("q").depth


@pytest.mark.anyio
async def test_the_router_lists_once_for_many_publishes_and_still_routes_peers(
    root: Path,
) -> None:
    """A consumer that lists the main bus only to route peers' messages does not list it
    at each fsbus publish (those are routed by their publisher): the filesystem events
    that come while it rests (``_ROUTE_GAP``) are taken by one listing. A peer's message
    published among them is still routed, once."""
    with BlockingBus(root) as admin:
        admin.declare_queue("q", ["foo.#"])
    inbox = Inbox()
    n = 400
    async with Bus(root, config=BusConfig()) as router:
        await router.subscribe(None, inbox, queue="q")
        await wait_until(lambda: scans(router) > 0)
        before = scans(router)

        def publish_all() -> None:
            with BlockingBus(root) as pub:
                for i in range(n):
                    pub.publish("foo.fsbus", b"%d" % i)
                    if i == n // 2:
                        plant_peer_message(root, b"peer")

        await anyio.to_thread.run_sync(publish_all)
        await inbox.wait_for(n + 1)
        listed = scans(router) - before
    assert listed < n // 4
    assert Counter(inbox.payloads) == Counter([b"peer", *(b"%d" % i for i in range(n))])


@pytest.mark.anyio
async def test_a_router_that_finds_no_peers_message_lists_seldom_until_one_comes(
    root: Path,
) -> None:
    """While fsbus publishers keep every bucket changing and no peer publishes, each
    listing of the router that finds nothing to route doubles its gap before the next,
    up to ``_ROUTE_GAP_MOST``, poll ticks included (its listings of the main bus took a
    third of four queue consumers' CPU). A peer's message that comes is still routed,
    once, within that gap, and the gap is short again after it."""
    with BlockingBus(root) as admin:
        admin.declare_queue("q", ["foo.#"])
    inbox = Inbox()
    stop = threading.Event()
    published = [0]

    def publish_until_stopped() -> None:
        with BlockingBus(root) as pub:
            while not stop.is_set():
                pub.publish("other.fsbus", b"x")  # bound to no queue: nothing to route
                published[0] += 1

    async with Bus(root, config=BusConfig()) as router, anyio.create_task_group() as tg:
        await router.subscribe(None, inbox, queue="q")
        await wait_until(lambda: scans(router) > 0)
        tg.start_soon(anyio.to_thread.run_sync, publish_until_stopped)
        try:
            await wait_until(lambda: router._route_gap == engine._ROUTE_GAP_MOST)
            before, count_before, t0 = scans(router), published[0], time.monotonic()
            await wait_until(lambda: time.monotonic() - t0 >= 1.0)
            listed = scans(router) - before
            assert published[0] - count_before > 100  # every bucket kept changing
            # every 0.5 s at most (a poll tick every 0.1 s listed at each before)
            assert listed <= 1.0 / engine._ROUTE_GAP_MOST + 2, listed
            t1 = time.monotonic()
            await anyio.to_thread.run_sync(plant_peer_message, root, b"peer")
            await inbox.wait_for(1)
            assert time.monotonic() - t1 < engine._ROUTE_GAP_MOST + 1.0
            # short again: back to _ROUTE_GAP, doubled by a listing or two since at most
            assert router._route_gap < engine._ROUTE_GAP_MOST
        finally:
            stop.set()
    assert inbox.payloads == [b"peer"]
    assert await anyio.to_thread.run_sync(depth, root) == 0


class SlowMainListings(Ops):
    """Every listing of one of the main bus's buckets takes 3 ms (queues' buses not)."""

    def listdir(self, path: str) -> list[str]:
        if "/messages/" in path and "/queues/" not in path:
            time.sleep(0.003)
        return super().listdir(path)


@pytest.mark.anyio
async def test_a_router_rests_after_a_long_listing_of_many_messages_and_still_routes_peers(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The main bus keeps every multi message until it expires, so a router's listings
    of buckets it cannot pass over by their stamps (stamped by peers, or by an fsbus
    older than tagged stamps, as here) grow with all that was sent. A long listing of
    many names paces the router's next one, as a consumer's of a backlog does; a peer's
    message published meanwhile is routed when the rest ends."""
    monkeypatch.setattr(engine, "_PACE_NAMES", 4)
    monkeypatch.setattr(engine, "_PACE_FROM", 0.0)
    with BlockingBus(root) as admin:
        admin.declare_queue("q", ["foo.#"])
    inbox = Inbox()
    n = 60
    async with Bus(root, ops=SlowMainListings(), config=BusConfig()) as router:
        await router.subscribe(None, inbox, queue="q")
        await wait_until(lambda: scans(router) > 0)
        rests: list[float] = []

        def publish_all() -> None:
            with BlockingBus(root) as pub:
                pub._fs.tag_stamps = False  # (random stamps, as an older fsbus wrote)
                for i in range(n):
                    pub.publish("other.fsbus", b"%d" % i)  # bound to no queue
                    rests.append(router._listing_took)

        await anyio.to_thread.run_sync(publish_all)
        await wait_until(lambda: router._listing_took > 0 or any(rests))
        await anyio.to_thread.run_sync(plant_peer_message, root, b"peer")
        await inbox.wait_for(1)
    assert inbox.payloads == [b"peer"]
    assert await anyio.to_thread.run_sync(depth, root) == 0


def unparsed(bus: Bus) -> set[str]:
    """fsbus's own names the router's listings for peers only left unparsed."""
    return {n for view in bus._state.buckets.values() for n in view.unparsed}


@pytest.mark.anyio
async def test_a_router_leaves_fsbus_names_unparsed_and_a_later_subscription_is_served_as_ever(
    root: Path,
) -> None:
    """A bus that only routes peers' messages does not parse fsbus's own names (no
    queue needs them from it). When it gets a subscription of its own: a plain one is
    given only what is published after it, one with ``existing=True`` what was there
    too, and a work-queue one the work-queue messages already waiting."""
    with BlockingBus(root) as admin:
        admin.declare_queue("q", ["foo.#"])
    with BlockingBus(root) as pub:
        before = [pub.publish("x.before", b"b%d" % i, ttl=600).path for i in range(5)]
        waiting = pub.publish("x.work", b"w", single=True).path
    names = {os.path.basename(p) for p in [*before, waiting]}
    routed = Inbox()
    async with Bus(root, config=FAST) as router:
        await router.subscribe(None, routed, queue="q")
        await wait_until(lambda: names <= unparsed(router))
        with BlockingBus(root) as pub:
            pub.publish("x.meanwhile", b"m", ttl=600)
        await anyio.to_thread.run_sync(plant_peer_message, root, b"peer")
        await routed.wait_for(1)  # a peer's name is parsed, and routed
        # ("m" is left unparsed too, or its bucket passed over by its stamp: either way
        # it is present, not new, to the subscriptions below; test_router_stamps.py)
        new, old, work = Inbox(), Inbox(), Inbox()
        await router.subscribe("x.#", new, kind="multi")
        await router.subscribe("x.#", old, existing=True, kind="multi")
        await router.subscribe("x.#", work, kind="single")
        with BlockingBus(root) as pub:
            pub.publish("x.after", b"a", ttl=600)
        await new.wait_for(1)
        await old.wait_for(7)
        await work.wait_for(1)
        await wait_until(lambda: not unparsed(router))
    assert routed.payloads == [b"peer"]
    assert new.payloads == [b"a"]
    assert sorted(old.payloads) == sorted([b"a", b"m", *(b"b%d" % i for i in range(5))])
    assert work.payloads == [b"w"]


class GatedMainListing(Ops):
    """Once armed, the next listing of a main-bus bucket waits for ``go`` first."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.entered = threading.Event()
        self.go = threading.Event()

    def listdir(self, path: str) -> list[str]:
        if self.armed and "/messages/" in path and "/queues/" not in path:
            self.armed = False
            self.entered.set()
            self.go.wait(WAIT)
        return super().listdir(path)


@pytest.mark.anyio
async def test_what_a_listing_for_peers_only_found_after_a_subscription_came_is_new_to_it(
    root: Path,
) -> None:
    """A subscription made while the router's listing (for peers only) runs: a message
    that listing finds, published after the subscription, is delivered to it (it is
    not left unparsed as if it had been there before)."""
    with BlockingBus(root) as admin:
        admin.declare_queue("q", ["foo.#"])
    gate = GatedMainListing()
    # every listing a full one, in a worker thread (where it may wait on the gate)
    config = BusConfig(poll_interval=0.05, retry_interval=0.05, refresh_ttl=0.01)
    async with Bus(root, ops=gate, config=config) as router:
        await router.subscribe(None, Inbox(), queue="q")
        await wait_until(lambda: scans(router) > 1)
        gate.armed = True
        with BlockingBus(root) as pub:
            pub.publish("y.trigger", b"t", ttl=600)  # bound to no queue: wakes the router
        assert await anyio.to_thread.run_sync(gate.entered.wait, WAIT)
        inbox = Inbox()
        await router.subscribe("x.#", inbox, kind="multi")
        with BlockingBus(root) as pub:
            pub.publish("x.after", b"a", ttl=600)
        gate.go.set()
        await inbox.wait_for(1)
        # nothing else, and nothing twice
        with BlockingBus(root) as pub:
            pub.publish("x.last", b"z", ttl=600)
        await inbox.wait_for(2)
    assert inbox.payloads == [b"a", b"z"]


@pytest.mark.anyio
async def test_a_queue_consumer_does_not_wait_for_the_routers_first_listing(
    root: Path,
) -> None:
    """The first queue consumer of a process becomes the router, whose first listing of
    the main bus may be long (every multi message stays until it expires). ``subscribe``
    returns without waiting for it, and a peer's message published after it returned,
    while that listing still runs, is routed all the same, once."""
    with BlockingBus(root) as admin:
        admin.declare_queue("q", ["foo.#"])
    gate = GatedMainListing()
    gate.armed = True
    inbox = Inbox()
    async with Bus(root, ops=gate, config=FAST) as router:
        await router.subscribe(None, inbox, queue="q")
        # (the router's first listing may only have been started: wait until it waits)
        assert await anyio.to_thread.run_sync(gate.entered.wait, WAIT)
        assert not gate.go.is_set()
        await anyio.to_thread.run_sync(plant_peer_message, root, b"peer")
        gate.go.set()
        await inbox.wait_for(1)
        await wait_until(lambda: router.statistics().scans > 2)
    assert inbox.payloads == [b"peer"]
    assert await anyio.to_thread.run_sync(depth, root) == 0
