"""Bus.statistics(): a frozen snapshot whose counters follow what happened."""

from __future__ import annotations

import dataclasses
import fcntl
import os
from pathlib import Path

import anyio
import pytest

from fsbus import Bus, BusConfig, BusStatistics, Message

from .conftest import Inbox, message_files, peer_buckets, wait_until


@pytest.mark.anyio
async def test_counters_follow_a_session(root: Path) -> None:
    cfg = BusConfig(poll_interval=0.05, retry_interval=0.05, max_deliveries=2)
    multi, dead = Inbox(), Inbox()
    fails: list[Message] = []

    async def worker(msg: Message) -> None:
        if msg.payload == b"bad":
            fails.append(msg)
            raise RuntimeError("bad job")

    async with Bus(root, config=cfg) as bus:
        fresh = bus.statistics()
        assert fresh == BusStatistics(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, fresh.inotify)
        peer_buckets(root)
        await anyio.Path(root / "messages" / "00" / "stray").write_text("x")
        await bus.subscribe("news.#", multi)
        await bus.subscribe("jobs.#", worker)
        await bus.subscribe("dead-letter.#", dead)
        news = await bus.publish("news.a", b"1")
        await bus.publish("jobs.ok", b"good", single=True)
        await bus.publish("jobs.bad", b"bad", single=True)
        await multi.wait_for(1)
        await dead.wait_for(1)
        await wait_until(lambda: bus.statistics().acked == 3)
        s = bus.statistics()
    assert message_files(root) == [f"{news.bucket}/{news.name}"]
    assert s.published == 3  # the dead-letter copy is not a publish of the caller's
    assert s.quarantined == 1
    assert s.subscriptions == 3
    assert s.in_flight == 0
    assert s.failed == 2  # two deliveries of the bad job
    assert s.released == 1  # after the first failure
    assert s.dead_lettered == 1
    # good job, bad job (dead-lettered), its dead-letter copy
    assert s.acked == 3
    # news.a, good, bad twice, dead-letter copy
    assert s.delivered == 5
    assert s.scans >= 2
    assert s.expired == 0
    assert len(fails) == 2


def test_statistics_are_frozen() -> None:
    s = BusStatistics(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.published = 0  # type: ignore[misc]
    assert [f.name for f in dataclasses.fields(s)] == [
        "published",
        "delivered",
        "acked",
        "released",
        "failed",
        "dead_lettered",
        "expired",
        "quarantined",
        "scans",
        "subscriptions",
        "in_flight",
        "inotify",
        "claims_lost",
        "leases_lost",
    ]


@pytest.mark.anyio
async def test_a_claim_lost_to_another_holder_is_counted_and_tried_again(root: Path) -> None:
    cfg = BusConfig(poll_interval=0.05, retry_interval=0.05)
    inbox = Inbox()
    async with Bus(root, config=cfg) as bus:
        await bus.publish("jobs.one", b"job", single=True)
        (path,) = message_files(root)
        # Another consumer holds it: an exclusive flock on another open of the file.
        fd = os.open(root / "messages" / path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            await bus.subscribe("jobs.one", inbox)
            await wait_until(lambda: bus.statistics().claims_lost >= 1)
            assert inbox.payloads == []
        finally:
            os.close(fd)  # the holder lets go without consuming it
        await wait_until(lambda: inbox.payloads == [b"job"])
        await wait_until(lambda: bus.statistics().acked == 1)
        lost = bus.statistics().claims_lost
    assert lost >= 1
    assert message_files(root) == []


@pytest.mark.anyio
async def test_inotify_is_reported(root: Path) -> None:
    async def nothing(msg: Message) -> None:
        pass

    async with Bus(root, config=BusConfig(force_polling=False)) as bus:
        assert not bus.statistics().inotify  # it only publishes: it watches nothing
        await bus.publish("t", b"x")
        assert not bus.statistics().inotify
        await bus.subscribe("#", nothing)
        assert bus.statistics().inotify
    async with Bus(root, config=BusConfig(force_polling=True)) as bus:
        await bus.subscribe("#", nothing)
        assert not bus.statistics().inotify
