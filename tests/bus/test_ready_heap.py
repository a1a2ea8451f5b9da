"""Work items a bus keeps in memory: only while something here can take them.

A bus whose subscriptions are all multi (an observer), or that lists the main bus only
to route peers' messages into queues, never claims a work-queue message; it used to
keep every one it listed on its ready heap for good, so its memory grew with the single
messages other processes published.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fsbus import BlockingBus, Bus, BusConfig

from .conftest import Inbox


@pytest.mark.anyio
async def test_a_bus_with_no_work_queue_subscription_keeps_no_work_items(root: Path) -> None:
    seen = Inbox()
    jobs = Inbox()
    async with Bus(root, config=BusConfig(poll_interval=0.05)) as observer:
        await observer.subscribe("k.#", seen, kind="multi")
        with BlockingBus(root) as publisher:
            for i in range(200):
                publisher.publish("k.job", str(i), single=True)
            publisher.publish("k.end", b"end")
        await seen.wait_for(1)  # the listing that delivered it had every job in it
        assert observer._ready == []
        assert observer._ready_keys == set()
        # a work-queue subscription made later still gets every job, once
        await observer.subscribe("k.job", jobs, kind="single")
        await jobs.wait_for(200)
    assert sorted(int(m.payload) for m in jobs.messages) == list(range(200))
    assert [m.payload for m in seen.messages] == [b"end"]
