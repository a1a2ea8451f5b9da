"""A consumer that takes work-queue messages with no task (Subscription.deliver_now, what
the AMQP gateway's consumers use while they wait for their client's ack): each message is
handed over as it is claimed and settled later by a callback, once; a requeue gives it
back at once; what it declines goes to the handler; what is unsettled at close goes back.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from fsbus import Bus, BusConfig, Message, Requeue, Subscription

from .conftest import WAIT

pytestmark = pytest.mark.anyio

Settle = Callable[[BaseException | None], None]


class Taker:
    """A deliver_now consumer that keeps what it is handed, to settle it later."""

    def __init__(self, *, decline: Callable[[Message], bool] = lambda m: False) -> None:
        self.held: list[tuple[Message, Settle]] = []
        self.decline = decline
        self.changed = anyio.Event()

    def __call__(self, msg: Message, settle: Settle) -> bool:
        if self.decline(msg):
            return False
        self.held.append((msg, settle))
        self.changed.set()
        self.changed = anyio.Event()
        return True

    async def wait_for(self, n: int) -> None:
        with anyio.fail_after(WAIT):
            while len(self.held) < n:
                await self.changed.wait()


async def _subscribe(bus: Bus, taker: Taker, handled: list[Message], prefetch: int) -> Subscription:
    async def handler(msg: Message) -> None:
        handled.append(msg)
        taker.changed.set()
        taker.changed = anyio.Event()

    await bus.declare_queue("q", ["t.#"])
    sub = await bus.subscribe(None, handler, queue="q", prefetch=prefetch)
    sub.deliver_now = taker
    return sub


async def test_messages_are_handed_over_with_no_task_and_acked_by_the_callback(
    tmp_path: Path,
) -> None:
    handled: list[Message] = []
    taker = Taker()
    async with Bus(tmp_path / "bus") as bus:
        sub = await _subscribe(bus, taker, handled, prefetch=10)
        for i in range(30):
            await bus.publish("t.x", f"m{i}")
        await taker.wait_for(10)
        assert len(taker.held) == 10  # its prefetch: no more until some are settled
        seen = 0
        while seen < 30:
            await taker.wait_for(seen + 1)
            batch = taker.held[seen:]
            seen += len(batch)
            if seen == 30:
                sub.settled = anyio.Event()  # set once nothing is in flight
            for _msg, settle in batch:
                settle(None)
                settle(None)  # a second settle does nothing
        with anyio.fail_after(WAIT):
            await sub.settled.wait()  # (acked on disk)
        assert sorted(m.payload for m, _ in taker.held) == sorted(
            f"m{i}".encode() for i in range(30)
        )
        assert all(m.delivery_count == 1 for m, _ in taker.held)
        assert handled == []
        assert (await bus.queue_info("q")).depth == 0
        assert sub.bus.statistics().acked == 30  # (the queue's own bus)


async def test_a_requeue_gives_it_back_at_once_delivered_again(tmp_path: Path) -> None:
    handled: list[Message] = []
    taker = Taker()
    async with Bus(tmp_path / "bus") as bus:
        await _subscribe(bus, taker, handled, prefetch=1)
        await bus.publish("t.x", "again")
        await taker.wait_for(1)
        first, settle = taker.held[0]
        settle(Requeue("the client gave it back"))
        await taker.wait_for(2)
        second, settle = taker.held[1]
        assert second.name == first.name
        assert (first.delivery_count, second.delivery_count) == (1, 2)
        settle(None)
        assert handled == []


async def test_what_it_declines_goes_to_the_handler(tmp_path: Path) -> None:
    handled: list[Message] = []
    taker = Taker(decline=lambda m: m.payload == b"to the handler")
    async with Bus(tmp_path / "bus") as bus:
        await _subscribe(bus, taker, handled, prefetch=4)
        await bus.publish("t.x", "to the handler")
        await bus.publish("t.x", "taken")
        with anyio.fail_after(WAIT):
            while not (handled and taker.held):
                await taker.changed.wait()
        assert [m.payload for m in handled] == [b"to the handler"]
        assert [m.payload for m, _ in taker.held] == [b"taken"]
        taker.held[0][1](None)


async def test_what_is_unsettled_at_close_goes_back(tmp_path: Path) -> None:
    root = tmp_path / "bus"
    taker = Taker()
    async with Bus(root) as bus:
        await _subscribe(bus, taker, [], prefetch=5)
        for i in range(5):
            await bus.publish("t.x", f"m{i}")
        await taker.wait_for(5)
    for _msg, settle in taker.held:
        settle(None)  # after the close: nothing (it went back)
    async with Bus(root, config=BusConfig(count_deliveries=True)) as bus:
        assert (await bus.queue_info("q")).depth == 5
        got = []
        async with bus.messages(queue="q", prefetch=5) as it:
            for _ in range(5):
                with anyio.fail_after(WAIT):
                    got.append(await it.__anext__())
        assert sorted(m.payload for m in got) == [f"m{i}".encode() for i in range(5)]
        assert all(m.delivery_count == 2 for m in got)  # the first delivery counted


async def test_a_queues_delivery_limit_holds_for_what_it_hands_over(tmp_path: Path) -> None:
    """A queue with ``max_deliveries``: a message its deliver_now consumer fails that
    often is dead-lettered (and acked), as its handler's would be, not handed over
    again."""
    taker = Taker()
    async with Bus(tmp_path / "bus") as bus:
        await bus.declare_queue("parked", ["dead.#"])
        await bus.declare_queue("q", ["t.#"], max_deliveries=2, dead_letter="dead.q")
        sub = await bus.subscribe(None, _never, queue="q", prefetch=1)
        sub.deliver_now = taker
        await bus.publish("t.x", "poison")
        for n in (1, 2):
            await taker.wait_for(n)
            msg, settle = taker.held[-1]
            assert msg.delivery_count == n
            if n == 2:
                sub.settled = anyio.Event()  # set once nothing is in flight
            settle(RuntimeError("the client gave up on it"))
        with anyio.fail_after(WAIT):
            await sub.settled.wait()
        assert (await bus.queue_info("q")).depth == 0
        assert (await bus.queue_info("parked")).depth == 1
        assert len(taker.held) == 2


async def _never(msg: Message) -> None:
    raise AssertionError(f"{msg.name} reached a handler")


async def test_a_consumers_room_frees_at_its_ack_not_once_the_ack_is_on_disk(
    tmp_path: Path,
) -> None:
    """Consumer priorities: a message goes to the consumer of the highest rank with room.
    Its room comes back as it settles a message, as RabbitMQ's does at the client's
    ack, not once the finisher has acked it on disk: before, a message published right
    after the ack went, now and then, to the lower one that had room meanwhile."""
    high, low = Taker(), Taker()
    async with Bus(tmp_path / "bus") as bus:
        await bus.declare_queue("q", ["t.#"])
        subs = []
        for taker, rank, prefetch in ((high, 10, 1), (low, 1, 2)):
            sub = await bus.subscribe(None, _never, queue="q", prefetch=prefetch)
            sub.deliver_now = taker
            sub.rank = rank
            subs.append(sub)
        await bus.publish("t.x", "h0")
        await high.wait_for(1)
        await bus.publish("t.x", "l0")  # the high one is at its prefetch
        await low.wait_for(1)  # (and has room for one more throughout)
        for i in range(1, 31):
            high.held[-1][1](None)  # the high one settles ...
            await bus.publish("t.x", f"h{i}")  # ... and the next is its own
            await high.wait_for(i + 1)
            assert high.held[-1][0].payload == f"h{i}".encode()
            assert len(low.held) == 1
        for taker in (high, low):
            taker.held[-1][1](None)
