"""A queue hands out one publisher's messages in the order it published them.

A consumer finds work by listing the queue's buckets one after the other, while
publishers rename messages into them. A publisher's message that lands in a bucket the
listing has passed is missed until the next listing, while a later one that lands in a
bucket still ahead is seen: taking what the listing saw would hand out the later message
first (an AMQP consumer on another gateway got 0 1 2 3 6 4 5). A message published after
the listing began waits for the next listing, which sees every message published before
it. The race is made here through the I/O seam: another process's publisher (a bus of
its own) publishes a run of messages while the consumer's listing comes to the last of
the queue's buckets.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from fsbus import BlockingBus, Bus, BusConfig
from fsbus._bus.ops import Ops

from .conftest import WAIT

N = 40
QUEUE_BUCKETS = 16
"""Buckets of a queue's bus (one hex digit)."""


class PublishLateInAListing(Ops):
    """Runs ``publish`` once, when a listing of every bucket of queue ``q`` (the first
    of a get, and every one of a consumer with a short ``refresh_ttl``) comes to its
    last bucket: each message lands in a bucket listed already, unseen, but for the one
    in sixteen that lands in the last."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._last = QUEUE_BUCKETS
        self._listed = 0
        self.publish: Callable[[], None] | None = None
        self.fired = threading.Event()

    def arm(self, publish: Callable[[], None]) -> None:
        with self._lock:
            self._last = QUEUE_BUCKETS
            self._listed = 0
            self.publish = publish

    def listdir(self, path: str) -> list[str]:
        run = None
        if "/queues/q/bus/" in path and "/messages/" in path:
            with self._lock:
                if self.publish is not None:
                    self._listed += 1
                    if self._listed == self._last:
                        run, self.publish = self.publish, None
        if run is not None:
            run()
            self.fired.set()
        return super().listdir(path)


def queue_and_run(publisher: BlockingBus) -> Callable[[], None]:
    """Declare queue ``q`` and publish one message into it (which makes its bus); the
    run of ``N`` messages ``publish`` then publishes, one after the other."""
    publisher.declare_queue("q", ["t.#"])
    publisher.publish("t.x", "before")

    def publish() -> None:
        for i in range(N):
            publisher.publish("t.x", str(i))

    return publish


@pytest.mark.anyio
async def test_a_consumer_gets_one_publishers_messages_in_order(root: Path) -> None:
    # every listing of the consumer lists every bucket (it lists when idle, each 20 ms)
    config = BusConfig(poll_interval=0.02, refresh_ttl=0.01)
    with BlockingBus(root) as publisher:
        publish = queue_and_run(publisher)
        ops = PublishLateInAListing()
        got: list[int] = []
        async with Bus(root, config=config, ops=ops) as bus:
            async with bus.messages(queue="q", prefetch=1) as it:
                assert (await it.receive(WAIT)).payload == b"before"
                ops.arm(publish)  # in the consumer's next listing
                with anyio.fail_after(WAIT):
                    while len(got) < N:
                        msg = await it.receive(WAIT)
                        got.append(int(msg.payload))
                        await it.ack(msg)
    assert ops.fired.is_set()
    assert got == list(range(N))


def test_a_get_takes_one_publishers_messages_in_order(root: Path) -> None:
    with BlockingBus(root) as publisher:
        publish = queue_and_run(publisher)
        ops = PublishLateInAListing()
        with publisher.get("q") as msg:
            assert msg is not None
        got: list[int] = []
        with BlockingBus(root, ops=ops) as bus:
            ops.arm(publish)  # in the first get's listing, of every bucket
            deadline = time.monotonic() + WAIT
            while len(got) < N:
                assert time.monotonic() < deadline, f"only {got}"
                with bus.get("q") as msg:
                    # (None if every message landed in a bucket listed already: they were
                    # published while the get listed, and the next get sees them)
                    if msg is not None:
                        got.append(int(msg.payload))
    assert ops.fired.is_set()
    assert got == list(range(N))


class ListingRacesAnAck(Ops):
    """Holds the next listing of queue ``q`` that finds the message named ``name`` (in
    the scan's worker thread; never on the event loop, which the ack needs) from the
    moment it has read the bucket until the message is unlinked: the listing returns,
    as one that raced the ack does, a message that is gone."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.name: str | None = None
        self.gone: str | None = None
        self.holding = threading.Event()
        self.unlinked = threading.Event()
        self.returned_gone = False

    def arm(self, name: str) -> None:
        with self._lock:
            self.name = self.gone = name

    def listdir(self, path: str) -> list[str]:
        names = super().listdir(path)
        hold = False
        if "/queues/q/bus/" in path and threading.current_thread() is not threading.main_thread():
            with self._lock:
                if self.name is not None and self.name in names:
                    self.name, hold = None, True
        if hold:
            self.holding.set()
            self.returned_gone = self.unlinked.wait(WAIT)
        return names

    def unlink(self, path: str) -> None:
        super().unlink(path)
        if self.gone is not None and path.endswith("/" + self.gone):
            self.unlinked.set()


@pytest.mark.anyio
async def test_a_consumers_ack_racing_its_own_listing_is_not_a_lost_claim(root: Path) -> None:
    # A listing that began before an ack returns the acked message: the bus must not
    # try to claim it again, fail, and take that for other consumers winning its
    # claims (which makes it start its next claims at a random place, out of order).
    config = BusConfig(poll_interval=0.02, refresh_ttl=0.01)  # full listings, in the thread
    with BlockingBus(root) as publisher:
        publisher.declare_queue("q", ["t.#"])
        for i in range(N):
            publisher.publish("t.x", str(i))
    ops = ListingRacesAnAck()
    got: list[int] = []
    async with Bus(root, config=config, ops=ops) as bus:
        async with bus.messages(queue="q", prefetch=1) as it:
            first = await it.receive(WAIT)
            got.append(int(first.payload))
            ops.arm(first.name)
            assert await anyio.to_thread.run_sync(ops.holding.wait, WAIT)
            await it.ack(first)
            with anyio.fail_after(WAIT):
                while len(got) < N:
                    msg = await it.receive(WAIT)
                    got.append(int(msg.payload))
                    await it.ack(msg)
            lost = bus.statistics().claims_lost
    assert ops.returned_gone  # the listing did return the acked message
    assert got == list(range(N))
    assert lost == 0
