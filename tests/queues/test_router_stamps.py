"""A router of queue consumers passes over the buckets that only fsbus publishers stamped.

fsbus publishers route their own messages into the queues as they publish; the router
lists the main bus for qlobber-fsq peers' messages alone. While a router is at work, an
fsbus publisher's stamp says it is fsbus's, and carries a peer's stamp it overwrote
(fsbus._bus.stamps), so the router lists only the buckets a peer may have stamped. The
main bus keeps every multi message until it expires: listing every changed bucket cost
the router a third of a core with 100,000 messages on the bus.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from fsbus import BlockingBus, Bus
from fsbus._bus.layout import Layout
from fsbus._bus.ops import Ops
from fsbus._bus.stamps import _carried_since, fresh, peer_may_have_stamped

from .conftest import Inbox, wait_until
from .test_peer_router import FAST, PEER, plant_peer_message, scans

NO_REFRESH = FAST.model_copy(update={"refresh_ttl": 3600.0, "gc_interval": 3600.0})
"""No full listing (every ``refresh_ttl``) and no sweep (every ``gc_interval``, which
lists every bucket too) during a test: only stamps bring a listing."""


class CountedMainListings(Ops):
    """Counts the listings of the main bus's buckets (the queues' buses not)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self._lock = threading.Lock()

    def listdir(self, path: str) -> list[str]:
        if "/messages/" in path and "/queues/" not in path:
            with self._lock:
                self.count += 1
        return super().listdir(path)


def slot(root: Path, index: int) -> bytes:
    layout = Layout.of(str(root), FAST)
    with open(layout.update_file, "rb") as f:
        f.seek(layout.stamp_offset(index))
        return f.read(layout.stamp_size)


def write_slot(root: Path, index: int, stamp: bytes) -> None:
    layout = Layout.of(str(root), FAST)
    with open(layout.update_file, "r+b") as f:
        f.seek(layout.stamp_offset(index))
        f.write(stamp)


def peer_index(root: Path) -> int:
    return Layout.of(str(root), FAST).buckets.index(PEER["bucket"])


@contextlib.asynccontextmanager
async def a_router(root: Path, inbox: Inbox, ops: Ops | None = None) -> AsyncIterator[Bus]:
    """A queue ``q`` bound ``foo.#`` and a bus consuming it, which routes the peers'
    messages (no full listing after its first): yielded once it has listed the bus and
    recorded its progress, so that a publisher that opens then sees it at work (and
    tags its stamps from its first publish)."""
    with BlockingBus(root) as admin:
        admin.declare_queue("q", ["foo.#"])
    async with Bus(root, ops=ops, config=NO_REFRESH) as router:
        await router.subscribe(None, inbox, queue="q")
        await wait_until(lambda: scans(router) > 0 and router._queues.router_active())
        yield router


def publish_into(pub: BlockingBus, root: Path, index: int) -> None:
    """Publish until a message lands in bucket ``index``."""
    bucket = Layout.of(str(root), FAST).buckets[index]
    for _ in range(256 * 20):
        if os.path.basename(os.path.dirname(pub.publish("a.b", b"x").path)) == bucket:
            return
    pytest.fail("no publish landed in the bucket")


@pytest.mark.anyio
async def test_publishers_tag_their_stamps_only_while_a_router_is_at_work(root: Path) -> None:
    """With no router (no queue consumer on the bus), a stamp is random bytes, written
    without a read of the slot first; a publish pays for the read only while a router
    gains from it. Once a router records its progress, a publisher's stamps say fsbus
    (within its next look at the routing table); the router's first listing was a full
    one, so what came before is not missed."""
    with BlockingBus(root) as admin:
        admin.declare_queue("q", ["foo.#"])
    with BlockingBus(root) as pub:
        publish_into(pub, root, 0)
        assert _carried_since(slot(root, 0)) is None  # random: not fsbus's
        async with Bus(root, config=NO_REFRESH) as router:
            await router.subscribe(None, Inbox(), queue="q")
            await wait_until(lambda: router._queues.router_active())

            def tagged_now() -> bool:
                publish_into(pub, root, 0)
                return _carried_since(slot(root, 0)) is not None

            await wait_until(tagged_now)


@pytest.mark.anyio
async def test_a_bus_that_opens_keeps_a_peers_stamp_carried(root: Path) -> None:
    """A bus that opens makes every stamp new, as qlobber-fsq does; while a router is
    at work, a slot that held a peer's stamp holds one that carries it, so the router
    still lists that bucket, and the others say fsbus."""
    async with a_router(root, Inbox()):
        await anyio.to_thread.run_sync(plant_peer_message, root, b"peer")
        index = peer_index(root)
        planted = slot(root, index)

        def reopen() -> bytes:
            with BlockingBus(root):
                return slot(root, index)

        renewed = await anyio.to_thread.run_sync(reopen)
    assert renewed != planted
    assert peer_may_have_stamped(renewed)
    others = [slot(root, i) for i in range(4) if i != index]
    assert not any(peer_may_have_stamped(s) for s in others)


@pytest.mark.anyio
async def test_a_router_lists_no_bucket_that_only_fsbus_publishers_stamped(root: Path) -> None:
    """fsbus publishes (routed as they were published) bring the router no listing of
    the main bus; a peer's message published among them is routed, once."""
    ops = CountedMainListings()
    inbox = Inbox()
    n = 300
    async with a_router(root, inbox, ops) as router:
        before_listings, before_scans = ops.count, scans(router)

        def publish_all() -> None:
            with BlockingBus(root) as pub:
                for i in range(n):
                    pub.publish("foo.fsbus" if i % 2 else "other.fsbus", b"%d" % i)

        await anyio.to_thread.run_sync(publish_all)
        await inbox.wait_for(n // 2)
        await wait_until(lambda: scans(router) > before_scans)
        fsbus_only = ops.count - before_listings
        await anyio.to_thread.run_sync(plant_peer_message, root, b"peer")
        await inbox.wait_for(n // 2 + 1)
    assert fsbus_only == 0
    assert sorted(inbox.payloads) == sorted([b"peer", *(b"%d" % i for i in range(1, n, 2))])


@pytest.mark.anyio
async def test_a_peers_stamp_that_an_fsbus_publisher_overwrote_is_carried_to_the_router(
    root: Path,
) -> None:
    """A peer stamps its bucket and an fsbus publisher stamps the same bucket at once,
    before the router read the slot: the new stamp carries the peer's, and the router
    routes the message at its next listing, not at its next full one."""
    inbox = Inbox()
    async with a_router(root, inbox):

        def peer_then_fsbus() -> None:
            with BlockingBus(root) as pub:
                plant_peer_message(root, b"peer")
                pub._fs.stamp(peer_index(root))  # what its next publish there does

        await anyio.to_thread.run_sync(peer_then_fsbus)
        assert peer_may_have_stamped(slot(root, peer_index(root)))
        await inbox.wait_for(1)
    assert inbox.payloads == [b"peer"]


@pytest.mark.anyio
async def test_a_peers_stamp_overwritten_unread_is_routed_at_the_next_full_listing(
    root: Path,
) -> None:
    """The gap stamps leave: a peer's stamp that lands between an fsbus publisher's read
    of the slot and its write is overwritten unseen. The router passes over the bucket
    and routes the message at its next full listing (every ``refresh_ttl``): late, never
    lost. Meanwhile the progress it records for a router that takes over is the start
    of its last full listing, which that one would list from."""
    inbox = Inbox()
    async with a_router(root, inbox) as router:
        full_began = router._full_wall
        index = peer_index(root)
        clean = fresh(bytes(32), os.urandom(32), time.time)

        def overwritten() -> None:
            plant_peer_message(root, b"peer")
            write_slot(root, index, fresh(clean, os.urandom(32), time.time))  # as if read before

        await anyio.to_thread.run_sync(overwritten)
        await wait_until(lambda: index in router._passed)
        mark = time.monotonic()
        await wait_until(lambda: router._queues._progress_at > mark)
        assert router._queues.router_progress() == full_began
        assert inbox.payloads == []
        router._last_refresh = -math.inf  # the next listing is a full one
        router._waker.wake()
        await inbox.wait_for(1)
    assert inbox.payloads == [b"peer"]


@pytest.mark.anyio
async def test_a_subscription_that_comes_to_a_router_is_given_only_what_comes_after_it(
    root: Path,
) -> None:
    """A router that subscribes on the bus: the buckets it passed over by their stamps
    are listed at once, and what was published in them before the subscription is not
    new to it (a plain subscription gets what comes after; ``existing=True`` gets both)."""
    layout = Layout.of(str(root), FAST)
    routed = Inbox()
    async with a_router(root, routed) as router:
        with BlockingBus(root) as pub:
            paths = [pub.publish("x.before", b"b%d" % i, ttl=600).path for i in range(5)]
        buckets = {layout.buckets.index(os.path.basename(os.path.dirname(p))) for p in paths}
        await wait_until(lambda: buckets <= router._passed)
        new, old = Inbox(), Inbox()
        await router.subscribe("x.#", new, kind="multi")
        await router.subscribe("x.#", old, existing=True, kind="multi")
        with BlockingBus(root) as pub:
            pub.publish("x.after", b"a", ttl=600)
        await new.wait_for(1)
        await old.wait_for(6)
        await wait_until(lambda: not router._passed)
    assert new.payloads == [b"a"]
    assert sorted(old.payloads) == sorted([b"a", *(b"b%d" % i for i in range(5))])
    assert routed.payloads == []
