"""What a consumer gives back unread is not a redelivery.

A queue counts each delivery when it is claimed, so that a consumer killed holding a
message leaves the count behind. A subscription claims ahead of its reader (up to its
prefetch); what is still buffered when the reader leaves was never read, and its next
delivery is a first one (``delivery_count == 1``). What the reader took and did not
settle is a redelivery.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

import anyio
import pytest

from fsbus import BlockingBus, Bus, BusConfig, Message, Requeue
from fsbus._bus import engine
from fsbus._bus.ops import Ops
from fsbus._bus.scan import name_order
from tests.tracked_ops import TrackedOps

from .conftest import WAIT, wait_until


async def all_held(bus: Bus, queue: str, n: int) -> None:
    """Wait until ``n`` messages of ``queue`` are held (claimed) by a consumer."""
    with anyio.fail_after(WAIT):
        while sum([m.locked async for m in bus.browse(queue=queue)]) < n:  # noqa: ASYNC110
            await anyio.sleep(0.01)


@pytest.mark.anyio
async def test_buffered_messages_go_back_uncounted(root: Path, fast: BusConfig) -> None:
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue("q", ["t.#"])
        for i in range(5):
            await bus.publish("t.x", str(i))
        async with bus.messages(queue="q", prefetch=5, buffer=5, ack_previous=False) as it:
            await all_held(bus, "q", 5)  # one read below, four left in the buffer
            taken = await it.receive(WAIT)
            second = await it.receive(WAIT)  # read, and left unsettled
            await it.ack(taken)
        counts = {}
        for _ in range(4):
            async with bus.get("q") as msg:
                assert msg is not None
                counts[msg.payload] = msg.delivery_count
        async with bus.get("q") as msg:
            assert msg is None
    assert taken.delivery_count == 1
    assert counts.pop(second.payload) == 2  # it was read: a redelivery
    assert set(counts.values()) == {1}, counts


@pytest.mark.parametrize("prefetch", [1, 4])
def test_the_next_subscription_takes_what_the_last_one_gave_back_first(
    root: Path, prefetch: int
) -> None:
    """Subscriptions one after the other in a process, each taking one message: each
    gets the next message of the queue. What one claimed ahead and gave back unread is
    taken first by the next, not passed over for ``retry_interval`` (which gave 0 2 4
    with prefetch 1, 0 4 8 with prefetch 4)."""
    with BlockingBus(root) as bus:
        bus.declare_queue("q", ["t"])
        for i in range(10):
            bus.publish("t", str(i).encode())
        got = []
        for _ in range(3):
            with bus.messages(queue="q", prefetch=prefetch) as it:
                msg = it.get(timeout=WAIT)
                got.append((msg.payload, msg.delivery_count))
                it.ack(msg)
        assert got == [(b"0", 1), (b"1", 1), (b"2", 1)]
        assert bus.queue_info("q").depth == 7


@pytest.mark.anyio
async def test_a_handler_that_raises_requeue_gets_the_message_again_at_once(
    root: Path,
) -> None:
    """``fsbus.Requeue`` raised by a handler gives the message back at once, ahead of
    the messages behind it, as a redelivery; any other exception waits
    ``retry_interval`` (10 s here: it would not come back within the test)."""
    async with Bus(root, config=BusConfig(retry_interval=10.0)) as bus:
        await bus.declare_queue("q", ["t"])
        for i in range(3):
            await bus.publish("t", str(i).encode())
        seen: list[tuple[bytes, int]] = []
        done = anyio.Event()

        async def handler(msg: Message) -> None:
            seen.append((msg.payload, msg.delivery_count))
            if msg.payload == b"0" and msg.delivery_count == 1:
                raise Requeue
            if len(seen) == 4:
                done.set()

        sub = await bus.subscribe(None, handler, queue="q", prefetch=1)
        with anyio.fail_after(WAIT):
            await done.wait()
        await sub.aclose()
        assert seen == [(b"0", 1), (b"0", 2), (b"1", 1), (b"2", 1)]


class SlowGiveBack(TrackedOps):
    """Claims of queue ``q``'s messages take :data:`SLOW_CLAIM` each. The claim round
    that first locks message ``target`` goes on a while after, and when that claim is
    closed (given back) the message stays locked a while: each until another claim tries
    that message, or for :data:`HOLD` at most."""

    def __init__(self) -> None:
        super().__init__("/queues/q/bus/messages/")
        self.target: str | None = None
        self.holder: int | None = None
        self.claimed = threading.Event()
        self.tried = threading.Event()

    def close(self, fd: int) -> None:
        with self.lock:
            hold = fd == self.holder
            if hold:
                self.holder = -1
        if hold:
            self.tried.wait(HOLD)
        super().close(fd)

    def flock(self, fd: int, operation: int) -> None:
        claim = bool(operation & fcntl.LOCK_EX and operation & fcntl.LOCK_NB)
        with self.lock:
            path = self.path_of(fd) if claim else None
            mine = path is not None and self.target is not None and path.endswith(self.target)
            if mine and self.holder is not None:
                self.tried.set()
        if path is not None:
            time.sleep(SLOW_CLAIM)  # a slow mount: claim rounds go to a worker thread
        super().flock(fd, operation)
        first = False
        if mine:
            with self.lock:
                first = self.holder is None
                if first:
                    self.holder = fd
        if first:  # the round stays under way a while
            self.claimed.set()
            self.tried.wait(HOLD)


HOLD = 1.0
SLOW_CLAIM = 0.005
"""Seconds each claim takes: longer than the bus lets a batch of claims hold its event
loop, so that it claims in a worker thread, beside the loop, as on a slow mount."""
"""Seconds a held claim waits for another claim of its message (the fixed code never
makes one: the subscription that claims waits for its claim rounds when it closes)."""


def test_a_subscription_closing_during_a_claim_round_gives_its_claim_back_first(
    root: Path,
) -> None:
    """A subscription that closes while a claim round runs for it (prefetch: after an ack
    it claims the next message ahead, here on a slow mount, in a worker thread) waits for
    the round, and for what it won to be given back, before it is gone: the next
    subscription takes that message first. (It closed at once: the round then handed
    the message to the closed subscription, and the next one, finding it held, took the
    message behind it.)"""
    ops = SlowGiveBack()
    with BlockingBus(root, ops=ops) as bus:
        bus.declare_queue("q", ["t"])
        for i in range(3):
            bus.publish("t", str(i).encode())
        ops.target = sorted((m.name for m in bus.browse(queue="q")), key=name_order)[1]
        with bus.messages(queue="q", prefetch=1) as it:
            msg = it.get(timeout=WAIT)
            assert msg.payload == b"0"
            it.ack(msg)  # then it claims 1, ahead
            assert ops.claimed.wait(WAIT), "1 was not claimed after the ack"
        with bus.messages(queue="q", prefetch=1) as it:
            msg = it.get(timeout=WAIT)
            got = (msg.payload, msg.delivery_count)
            it.ack(msg)
    assert got == (b"1", 1)


class GatedListing(Ops):
    """Counts the listings of each directory done. Once :meth:`arm` is called, the next
    listing of one of queue ``q``'s buckets waits until :attr:`opened` is set (for
    :data:`HOLD_LISTING` at most)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.listed: dict[str, int] = {}

    def arm(self) -> None:
        self.armed = True

    def listdir(self, path: str) -> list[str]:
        if self.armed and "/queues/q/bus/messages/" in path:
            self.armed = False
            self.entered.set()
            self.opened.wait(HOLD_LISTING)
        try:
            return super().listdir(path)
        finally:
            self.listed[path] = self.listed.get(path, 0) + 1


HOLD_LISTING = 5.0
"""Seconds the gated listing waits at most (the test opens the gate sooner)."""


@pytest.mark.anyio
async def test_a_subscription_that_comes_during_a_listing_claims_after_a_full_one(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue's bus with no consumer keeps nothing on its ready heap. A consumer that
    comes while a listing of a few buckets runs (one that a new message brought) waits
    for a listing of every bucket before it claims. (It claimed at the end of the
    running listing, which knew of the new message only: it took that message before
    the ones the last consumer gave back, which were older.)"""
    monkeypatch.setattr(engine, "_QUEUE_BUS_LINGER", 60.0)  # (the same queue bus throughout)
    ops = GatedListing()
    async with Bus(root, ops=ops) as bus:
        await bus.declare_queue("q", ["t"])
        for i in range(5):
            await bus.publish("t", str(i).encode())
        async with bus.messages(queue="q", prefetch=4) as it:
            msg = await it.receive(WAIT)
            assert msg.payload == b"0"
            await it.ack(msg)
        # gave back 1, 2 and 3 unread; with no consumer the heap empties, and a message
        # published now is listed (so no listing of the given back runs any more)
        inner = bus._queue_buses["q"].bus
        assert inner is not None
        # its listings in a worker thread, as on a shared mount (inline, on the event
        # loop, none is under way while a consumer subscribes)
        inner._offload.inline_allowed = inner._offload.inline = False
        before = dict(ops.listed)
        await bus.publish("t", b"5")
        five = max([m async for m in bus.browse(queue="q")], key=lambda m: name_order(m.name))
        bucket = os.path.dirname(five.path)
        await wait_until(
            lambda: (
                ops.listed.get(bucket, 0) > before.get(bucket, 0)
                and not inner._ready_keys
                and not inner._retries
            )
        )
        ops.arm()
        await bus.publish("t", b"new")  # a listing of its bucket starts, and waits
        assert await anyio.to_thread.run_sync(ops.entered.wait, WAIT)
        async with bus.messages(queue="q", prefetch=4) as it:
            ops.opened.set()
            msg = await it.receive(WAIT)
            assert (msg.payload, msg.delivery_count) == (b"1", 1)
            await it.ack(msg)
        assert bus._queue_buses["q"].bus is inner  # (the same queue bus all along)
