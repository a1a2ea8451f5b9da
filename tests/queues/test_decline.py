"""``fsbus.Decline``: a handler (or a ``get`` block) gives a message back untouched.

A declined message is released at once, is not a failed delivery, and is not counted as
a delivery at all: with ``max_deliveries=1`` it is never dead-lettered for being
declined, and its next ``delivery_count`` is 1 again.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from fsbus import Bus, BusConfig, Decline, Message

from .conftest import Inbox


@pytest.mark.anyio
async def test_a_declined_queue_message_goes_to_the_next_consumer_uncounted(
    root: Path, fast: BusConfig
) -> None:
    declined = Inbox()
    took = Inbox()

    async def decline(msg: Message) -> None:
        await declined(msg)
        raise Decline

    async with Bus(root, config=fast) as bus:
        await bus.declare_queue("q", ["t.#"], max_deliveries=1, dead_letter="dead.q")
        await bus.declare_queue("dlq", ["dead.#"])
        first = await bus.subscribe(None, decline, queue="q")
        await bus.publish("t.a", "one")
        await declined.wait_for(1)
        await bus.unsubscribe(first)
        await bus.subscribe(None, took, queue="q")
        [msg] = await took.wait_for(1)
        stats = bus.statistics()
        async with bus.get("dlq") as dead:
            assert dead is None
    assert declined.messages[0].delivery_count == 1
    assert msg.payload == b"one"
    assert msg.delivery_count == 1  # the declined delivery was taken back
    assert stats.failed == 0
    assert stats.dead_lettered == 0


@pytest.mark.anyio
async def test_decline_in_a_get_block_gives_it_back_and_ends_the_block(
    root: Path, fast: BusConfig
) -> None:
    after = []
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue("q", ["t.#"], max_deliveries=1)
        await bus.publish("t.a", "one")
        async with bus.get("q") as msg:
            assert msg is not None
            raise Decline
        after.append("went on")  # the block's Decline does not escape it
        async with bus.get("q") as again:
            assert again is not None
            assert again.name == msg.name
            assert again.delivery_count == 1
        assert (await bus.queue_info("q")).depth == 0
        assert bus.statistics().failed == 0
    assert after == ["went on"]


@pytest.mark.anyio
async def test_decline_in_a_multi_handler_is_no_failure(
    root: Path, fast: BusConfig, caplog: pytest.LogCaptureFixture
) -> None:
    got = Inbox()

    async def decline(msg: Message) -> None:
        await got(msg)
        raise Decline

    async with Bus(root, config=fast) as bus:
        await bus.subscribe("t.#", decline, kind="multi")
        with caplog.at_level(logging.ERROR, logger="fsbus"):
            await bus.publish("t.a", "one")
            await got.wait_for(1)
        assert bus.statistics().failed == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
